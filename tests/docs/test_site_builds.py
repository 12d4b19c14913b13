"""The documentation site builds in strict mode: a broken link, a missing anchor or an API reference
to a name that does not exist fails the build (mkdocs.yml; the API pages come from the docstrings)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    # NO_MKDOCS_2_WARNING: the theme's banner about its successor, not a build warning.
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, cwd=config.parent)


def test_site_builds_strict_with_an_api_reference(tmp_path):
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    simulation = (tmp_path / "site" / "api" / "simulation" / "index.html").read_text()
    # Generated from the docstrings: the class and a parameter documented in Simulation's docstring.
    assert "hpcgpu.simulation.driver.Simulation" in simulation and "final_step" in simulation
    assert "hpcgpu.runtime.communicator.Communicator" in (tmp_path / "site" / "api" / "hpcgpu" / "index.html").read_text()


def test_strict_build_fails_on_broken_links_anchors_and_references(tmp_path):
    """The same configuration on a copy of docs/ with one broken link, anchor and API reference each."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    (tmp_path / "hpcgpu").symlink_to(ROOT / "hpcgpu")
    with open(tmp_path / "docs" / "getting-started.md", "a") as page:
        page.write("\n[gone](no-such-page.md) [missing](core-api.md#no-such-heading) "
                   "[nothing][hpcgpu.no_such_module.NoSuchName]\n")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "no-such-page.md" in output and "no-such-heading" in output and "NoSuchName" in output, output[-4000:]

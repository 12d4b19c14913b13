"""Every code block the documentation marks runnable runs, and succeeds (convention: tests/docs/runnable.py
and docs/contributing.md). The blocks of one page run in order in one temporary directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_command, run_mpi

from .runnable import PYTHON_LANGUAGES, ROOT, MarkerError, blocks_of, documentation_files

PAGES = [path for path in documentation_files() if blocks_of(path)]


def _environment() -> dict:
    """The checkout first on PYTHONPATH, this interpreter's directory (python, mpiexec) first on PATH."""
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {"PYTHONPATH": python_path, "PATH": path, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_markers_are_well_formed():
    """Each marker stands above a closed python or bash block and has known options (blocks_of raises)."""
    for path in documentation_files():
        try:
            blocks_of(path)
        except MarkerError as error:
            pytest.fail(str(error), pytrace=False)
    assert PAGES, "no page has a runnable block"


@pytest.mark.parametrize("page", PAGES, ids=[str(path.relative_to(ROOT)) for path in PAGES])
def test_runnable_blocks_of_page_succeed(page, tmp_path):
    for index, block in enumerate(blocks_of(page)):
        if block.language in PYTHON_LANGUAGES:
            script = tmp_path / f"block{index}.py"
            script.write_text(block.source)
            if block.ranks:
                result = run_mpi(block.ranks, [sys.executable, str(script)], timeout=block.timeout,
                                 env=_environment(), cwd=tmp_path)
            else:
                result = run_command([sys.executable, str(script)], block.timeout, env=_environment(),
                                     cwd=tmp_path, label="docs block")
        else:
            script = tmp_path / f"block{index}.sh"
            script.write_text(block.source)
            result = run_command(["bash", "-e", "-o", "pipefail", str(script)], block.timeout,
                                 env=_environment(), cwd=tmp_path, label="docs block")
        if result.returncode != 0:
            pytest.fail(f"the block at {block.where} failed (exit {result.returncode}"
                        f"{', timed out' if result.timed_out else ''}):\n{block.source}\n"
                        f"--- output (last 4000 characters) ---\n{result.output[-4000:]}", pytrace=False)

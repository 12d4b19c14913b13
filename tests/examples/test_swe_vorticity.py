"""examples/swe_vorticity.py: the bundled shallow-water model plus a vorticity-frames operation, run by the
driver; its state equals the app's bit for bit, and the frames come at the quarters of the run."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "swe_vorticity.py"
SMALL = ["--backend", "numpy", "--nx", "48", "--ny", "24", "--steps", "10"]


def load_example():
    spec = importlib.util.spec_from_file_location("example_swe_vorticity", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("final_step, expected", [(10, [3, 5, 8, 10]), (12, [3, 6, 9, 12]), (2, [1, 2]), (1, [1])])
def test_frames_fall_at_the_quarters_of_the_run(final_step, expected):
    trigger = load_example().AtFractions()
    assert [step for step in range(1, final_step + 1) if trigger(step, final_step)] == expected
    fired, step = [], 0
    while (step := trigger.next_step(step, final_step)) is not None:
        fired.append(step)
    assert fired == expected


def test_example_on_two_ranks_equals_the_app_and_draws_the_frames(tmp_path):
    environment = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    runs = {}
    for name, n_ranks, command in (("example", 2, [str(EXAMPLE)]), ("app", 1, ["-m", "apps.stencil"])):
        out = tmp_path / name
        result = run_mpi(n_ranks, [sys.executable, *command, *SMALL, "--output", str(out),
                                   "--summary", str(out / "summary.json"), "--quiet"],
                         timeout=120, env=environment, cwd=str(ROOT))
        assert result.returncode == 0, result.output[-3000:]
        runs[name] = json.loads((out / "summary.json").read_text())
    assert runs["example"]["app"] == "swe_vorticity" and runs["example"]["n_ranks"] == 2
    assert runs["example"]["checksum"] == runs["app"]["checksum"]
    assert runs["example"]["steps"] == runs["app"]["steps"] == 10
    pytest.importorskip("matplotlib")
    assert (tmp_path / "example" / "swe_vorticity.png").stat().st_size > 0

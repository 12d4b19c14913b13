"""apps.md checkpoint/restart: bitwise with the same rank count, to rounding on another one."""

import json
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_mpi

BASE = ["--cells", "5", "--quiet", "--no-plot", "--thermostat", "langevin", "--thermo-every", "10"]


def run(n_ranks, tmp_path, name, *args):
    summary = tmp_path / f"{name}.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.md", *BASE, "--output", str(tmp_path / name),
                               "--summary", str(summary), *args], timeout=180)
    assert result.returncode == 0, result.output
    return json.loads(summary.read_text())


def test_restart_continues_bitwise_with_the_same_rank_count_and_to_rounding_with_another(tmp_path):
    checkpoints = str(tmp_path / "ckpt")
    full = run(2, tmp_path, "full", "--steps", "40")
    run(2, tmp_path, "first", "--steps", "20", "--checkpoint-every", "20", "--checkpoint-dir", checkpoints)
    resumed = run(2, tmp_path, "resumed", "--steps", "40", "--restart", "latest", "--checkpoint-dir", checkpoints)
    assert resumed["checksum"] == full["checksum"]
    assert resumed["steps"] == 20
    assert resumed["thermo"][-1] == full["thermo"][-1]
    elastic = run(1, tmp_path, "elastic", "--steps", "40", "--restart", "latest", "--checkpoint-dir", checkpoints)
    for key in ("temp", "e_pair", "toteng", "press"):
        assert elastic["thermo"][-1][key] == pytest.approx(full["thermo"][-1][key], rel=1e-9)


def test_restart_of_another_system_is_refused(tmp_path):
    checkpoints = str(tmp_path / "ckpt")
    run(1, tmp_path, "first", "--steps", "10", "--checkpoint-every", "10", "--checkpoint-dir", checkpoints)
    other = [sys.executable, "-m", "apps.md", "--cells", "6", "--quiet", "--no-plot", "--steps", "20",
             "--thermostat", "langevin", "--checkpoint-dir", checkpoints]
    # --restart latest looks only among checkpoints of a run with the same configuration: none here.
    result = run_mpi(1, other + ["--restart", "latest", "--output", str(tmp_path / "other")], timeout=120)
    assert result.returncode == 2 and '--cells: "5" in the checkpoint, "6" in this run' in result.output, result.output
    # An explicit checkpoint is loaded, and the app's own check refuses the other system.
    result = run_mpi(1, other + ["--restart", str(Path(checkpoints) / "ckpt_000000010"),
                                 "--output", str(tmp_path / "explicit")], timeout=120)
    assert result.returncode == 2 and "the checkpoint holds" in result.output, result.output

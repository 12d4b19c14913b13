"""Checkpoint datasets say what they hold: units and grid location of each field (Field.attributes),
units of MD's particle arrays and of the replicated time and time step."""

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ranks, grid", [(1, "channel"), (2, "latlon")])
def test_shallow_water_checkpoint_carries_units_and_staggering(tmp_path, ranks, grid):
    checkpoints = tmp_path / "ckpt"
    command = [sys.executable, "-m", "apps.stencil", "--grid", grid, "--nx", "48", "--ny", "24", "--steps", "4",
               "--checkpoint-every", "4", "--checkpoint-dir", str(checkpoints), "--backend", "numpy",
               "--snapshot-every", "0", "--no-plot", "--quiet", "--output", str(tmp_path / "out")]
    result = run_mpi(ranks, command, timeout=240, cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]
    (master,) = checkpoints.glob("*/checkpoint.h5")
    with h5py.File(master, "r") as handle:
        fields = {name: handle[f"fields/{name}"] for name in ("h", "u", "v")}
        assert fields["h"].attrs["units"] == "m" and fields["u"].attrs["units"] == "m s-1"
        assert "cell centre" in fields["h"].attrs["grid_location"]
        assert "west cell face" in fields["u"].attrs["grid_location"]
        assert "south cell face" in fields["v"].attrs["grid_location"]
        assert all(np.isfinite(f[()]).all() for f in fields.values())
        replicated = handle["replicated"]
        assert replicated["time"].attrs["units"] == "s" and replicated["dt"].attrs["units"] == "s"
        assert "units" not in replicated["init"].attrs   # only values with a unit carry one


def test_md_checkpoint_particles_carry_units_and_restart_is_unchanged(tmp_path):
    """Reduced LJ units on every particle array; a restart from that checkpoint reaches the checksum of
    the uninterrupted run (the attributes are for readers, restarts ignore them)."""
    def run(steps, *extra):
        summary = tmp_path / f"summary-{steps}-{len(extra)}.json"
        command = [sys.executable, "-m", "apps.md", "--cells", "4", "--steps", str(steps), "--backend", "numpy",
                   "--quiet", "--no-plot", "--output", str(tmp_path / "out"), "--summary", str(summary), *extra]
        result = run_mpi(2, command, timeout=240, cwd=str(ROOT))
        assert result.returncode == 0, result.output[-3000:]
        return json.loads(summary.read_text())["checksum"]

    checkpoints = tmp_path / "ckpt"
    run(10, "--checkpoint-every", "5", "--checkpoint-dir", str(checkpoints))
    halfway = checkpoints / "ckpt_000000005"
    with h5py.File(halfway / "checkpoint.h5", "r") as handle:
        particles = handle["particles"]
        assert particles["positions"].attrs["units"] == "sigma"
        assert particles["velocities"].attrs["units"] == "sigma tau-1"
        assert particles["forces"].attrs["units"] == "epsilon sigma-1"
        assert particles["atom_ids"].attrs["units"] == "1"
        assert handle["replicated/box"].attrs["units"] == "sigma"
    uninterrupted = run(10)
    restarted = run(10, "--checkpoint-dir", str(checkpoints), "--restart", str(halfway))
    assert restarted == uninterrupted

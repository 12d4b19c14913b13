"""Checkpoint datasets say what they hold: units and grid location of each field (Field.attributes)."""

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcgpu.launch import run_mpi

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

"""NetCDFOutput: a model's fields as CF netCDF records, equal on any rank count, continued by restarts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.launch import run_mpi
from tests.output.field_model import expected

ROOT = Path(__file__).resolve().parents[2]


def run_ramp(n_ranks, output, *args, expect=0):
    env = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = run_mpi(n_ranks, [sys.executable, "-m", "tests.output.field_model", "--output", str(output), "--quiet",
                               *args], timeout=120, env=env, cwd=str(ROOT))
    assert result.returncode == expect, result.output[-3000:]
    return result


def records(path):
    netCDF4 = pytest.importorskip("netCDF4")
    with netCDF4.Dataset(path) as dataset:
        dataset.set_auto_mask(False)
        return {name: np.array(dataset[name][:]) for name in ("step", "time", "u")}


@pytest.mark.parametrize("n_ranks", [1, 3, 4])
def test_records_equal_the_serial_formula_on_any_rank_count(tmp_path, n_ranks):
    run_ramp(n_ranks, tmp_path, "--steps", "10")
    found = records(tmp_path / "ramp.nc")
    assert list(found["step"]) == [0, 3, 6, 9]
    assert list(found["time"]) == [0.0, 180.0, 360.0, 540.0]
    for step, values in zip(found["step"], found["u"]):
        np.testing.assert_array_equal(values, expected(int(step)))


def test_file_passes_the_cf_checker_and_opens_in_xarray(tmp_path):
    xarray = pytest.importorskip("xarray")
    pytest.importorskip("compliance_checker")
    from tests.apps.stencil.test_output_files import cf_problems

    run_ramp(2, tmp_path, "--steps", "6", "--dtype", "float32")
    with xarray.open_dataset(tmp_path / "ramp.nc") as dataset:
        assert dataset["u"].dims == ("time", "y", "x") and dataset["u"].dtype == np.float32
        assert dataset["u"].attrs["units"] == "m" and dataset["x"].attrs["units"] == "m"
        np.testing.assert_array_equal(dataset["u"].isel(time=-1).values, expected(6).astype(np.float32))
    assert cf_problems(tmp_path / "ramp.nc", tmp_path) == []


def test_restart_on_another_rank_count_continues_the_file_to_the_uninterrupted_one(tmp_path):
    run_ramp(1, tmp_path / "full", "--steps", "20", "--output-every", "4")
    # A first job to step 10 (checkpoint at 10; records 0, 4, 8), a second from 10 to 20 on 3 ranks.
    run = tmp_path / "run"
    checkpoints = ["--checkpoint-every", "5", "--checkpoint-dir", str(run / "checkpoints")]
    run_ramp(2, run, "--steps", "10", "--output-every", "4", *checkpoints)
    run_ramp(3, run, "--steps", "20", "--output-every", "4", "--restart", "latest", *checkpoints)
    full, chained = records(tmp_path / "full" / "ramp.nc"), records(run / "ramp.nc")
    assert list(chained["step"]) == [0, 4, 8, 12, 16, 20]
    for name in ("step", "time", "u"):
        np.testing.assert_array_equal(chained[name], full[name])


def test_restart_from_an_earlier_checkpoint_drops_the_records_it_computes_again(tmp_path):
    run_ramp(1, tmp_path / "full", "--steps", "12", "--output-every", "2")
    run = tmp_path / "run"
    checkpoints = ["--checkpoint-every", "5", "--checkpoint-dir", str(run / "checkpoints")]
    run_ramp(2, run, "--steps", "9", "--output-every", "2", *checkpoints)   # records to 8, checkpoint at 5 and 9
    # Restart from the checkpoint of step 5: the records 6 and 8 of the first job are written again.
    checkpoint_5 = sorted((run / "checkpoints").glob("*5*"))[0]
    run_ramp(2, run, "--steps", "12", "--output-every", "2", "--restart", str(checkpoint_5), *checkpoints)
    full, chained = records(tmp_path / "full" / "ramp.nc"), records(run / "ramp.nc")
    for name in ("step", "time", "u"):
        np.testing.assert_array_equal(chained[name], full[name])


def test_a_fresh_run_refuses_an_existing_file_and_leaves_it_unchanged(tmp_path):
    run_ramp(1, tmp_path, "--steps", "4")
    before = (tmp_path / "ramp.nc").read_bytes()
    (tmp_path / "summary.json").unlink(missing_ok=True)
    result = run_ramp(2, tmp_path, "--steps", "4", expect=2)
    assert "already exists" in result.output and "ramp.nc" in result.output
    assert (tmp_path / "ramp.nc").read_bytes() == before

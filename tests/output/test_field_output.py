"""NetCDFOutput: a model's fields as CF netCDF records, equal on any rank count, continued by restarts; the
model's time declared in any units gives a file the CF checker passes and xarray decodes as declared."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi
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
        return {name: np.array(dataset[name][:]) for name in ("step", "time", "u") if name in dataset.variables}


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


@pytest.mark.parametrize("time_units", ["legacy", "1", "none"])
def test_restart_on_another_rank_count_continues_the_file_to_the_uninterrupted_one(tmp_path, time_units):
    declared = ["--time-units", time_units]
    run_ramp(1, tmp_path / "full", "--steps", "20", "--output-every", "4", *declared)
    # A first job to step 10 (checkpoint at 10; records 0, 4, 8), a second from 10 to 20 on 3 ranks.
    run = tmp_path / "run"
    checkpoints = ["--checkpoint-every", "5", "--checkpoint-dir", str(run / "checkpoints")]
    run_ramp(2, run, "--steps", "10", "--output-every", "4", *checkpoints, *declared)
    run_ramp(3, run, "--steps", "20", "--output-every", "4", "--restart", "latest", *checkpoints, *declared)
    full, chained = records(tmp_path / "full" / "ramp.nc"), records(run / "ramp.nc")
    assert list(chained["step"]) == [0, 4, 8, 12, 16, 20]
    assert set(chained) == set(full) == ({"step", "u"} if time_units == "none" else {"step", "time", "u"})
    for name in full:
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


# ---------------------------------------------------------------------- the model's time in the file
TIME_DECLARATIONS = {
    # name: (flags, record dimension, how xarray shows the times of steps 0, 3, 6)
    "legacy": (["--time-units", "legacy"], "time",
               np.array(["2000-01-01T00:00", "2000-01-01T00:03", "2000-01-01T00:06"], "datetime64[ns]")),
    "date": (["--time-units", "hours since 2001-02-03 04:00:00"], "time",
             np.array(["2001-02-03T04:00", "2001-02-10T16:00", "2001-02-18T04:00"], "datetime64[ns]")),
    "360_day": (["--time-units", "days since 0001-01-01", "--time-calendar", "360_day"], "time", "cftime"),
    "s": (["--time-units", "s"], "step", np.array([0.0, 180.0, 360.0])),
    "days": (["--time-units", "days"], "step", np.array([0.0, 180.0, 360.0])),
    "1": (["--time-units", "1"], "step", np.array([0.0, 180.0, 360.0])),
    "none": (["--time-units", "none"], "step", None),
}


@pytest.mark.parametrize("declaration", list(TIME_DECLARATIONS))
def test_each_time_declaration_passes_the_cf_checker_and_decodes_as_declared(tmp_path, declaration):
    """Dates decode to dates; elapsed and dimensionless times stay numbers with their units (not dates)."""
    import cftime
    import compliance_checker  # noqa: F401  (test dependencies: fail, never skip, without them)
    import xarray

    from tests.apps.stencil.test_output_files import cf_problems

    flags, dimension, times = TIME_DECLARATIONS[declaration]
    run_ramp(1, tmp_path, "--steps", "6", *flags)
    assert cf_problems(tmp_path / "ramp.nc", tmp_path) == []
    with xarray.open_dataset(tmp_path / "ramp.nc") as dataset:
        assert dataset["u"].dims == (dimension, "y", "x")
        assert dataset["step"].values.tolist() == [0, 3, 6]
        np.testing.assert_array_equal(dataset["u"].values[-1], expected(6))
        if times is None:
            assert "time" not in dataset.variables
        elif isinstance(times, str):
            assert dataset["time"].values.tolist() == [cftime.Datetime360Day(1, 1, 1), cftime.Datetime360Day(1, 7, 1),
                                                       cftime.Datetime360Day(2, 1, 1)]   # 180 days of 30
        else:
            assert dataset["time"].dtype == times.dtype
            np.testing.assert_array_equal(dataset["time"].values, times)
            if dimension == "step":   # an auxiliary coordinate of every field, with the declared units
                assert "time" in dataset["u"].coords and dataset["time"].attrs["units"] == flags[1]
                assert "standard_name" not in dataset["time"].attrs


def test_an_invalid_time_declaration_ends_the_job_before_anything_is_written(tmp_path):
    result = run_ramp(2, tmp_path, "--steps", "4", "--time-units", "metres", expect=2)
    assert "time_units = 'metres'" in result.output and "days since 1850-01-01" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "ramp.nc").exists()


def test_a_restart_that_declares_another_time_is_refused_and_the_file_kept(tmp_path):
    checkpoints = ["--checkpoint-every", "4", "--checkpoint-dir", str(tmp_path / "checkpoints")]
    run_ramp(1, tmp_path, "--steps", "4", "--time-units", "s", *checkpoints)
    before = (tmp_path / "ramp.nc").read_bytes()
    result = run_ramp(1, tmp_path, "--steps", "8", "--time-units", "1", "--restart", "latest", *checkpoints,
                      expect=2)
    assert "time in 's'" in result.output and "time in '1'" in result.output
    assert (tmp_path / "ramp.nc").read_bytes() == before

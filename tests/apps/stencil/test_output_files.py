"""The shallow-water snapshot files (swe.nc, latlon.nc): CF-1.8 by a real checker, appended to on restart.

A restart that truncated the file lost the user's earlier records (issue 24). The restart tests run::

    full         0 ... 20 steps                      records t = 0, 5, 10, 15, 20 (x dt)
    interrupted  0 ... 15 steps, checkpoints 10, 15  records 0, 5, 10, 15
    continued    from the checkpoint at 10 to 20     keeps 0, 5, 10; drops 15 (after the restart step);
                 on another rank count               writes 15, 20
    stopped      0 ... 13 steps (not a snapshot step) records 0, 5, 10 and the final 13
    continued    --restart latest (step 13) to 20    drops 13 (not a record of the 20-step run); writes 15, 20

and compare the continued file with the full one record by record.
"""

import json
import sys

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

GRIDS = {
    "swe": (["--grid", "channel"], "swe.nc"),
    "latlon": (["--grid", "latlon"], "latlon.nc"),
}
SMALL = ["--nx", "36", "--ny", "18", "--snapshot-every", "5", "--backend", "numpy", "--no-plot", "--quiet"]
FIELDS = ("h", "u", "v", "zeta")


def run_stencil(n_ranks, grid, output, *args):
    return run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", *GRIDS[grid][0], *SMALL, "--output", str(output),
                             *args], timeout=180)


def cf_problems(path, tmp_path):
    """The failed checks of the IOOS compliance checker's CF-1.8 suite for ``path``, at every priority
    (high: the report's errors; medium and low: its warnings). Passed checks may carry notes, such as
    "standard calendar ... does not cross 1582-10-15" for our time axis; those are not problems."""
    runner = pytest.importorskip("compliance_checker.runner")
    runner.CheckSuite.load_all_available_checkers()
    report = tmp_path / f"{path.name}.cf.json"
    runner.ComplianceChecker.run_checker(str(path), ["cf:1.8"], 0, "strict", output_filename=str(report),
                                         output_format="json")
    result = json.loads(report.read_text())["cf:1.8"]
    return [f"{check['name']}: {message}"
            for priority in ("high_priorities", "medium_priorities", "low_priorities")
            for check in result[priority] if check["value"][0] < check["value"][1]
            for message in check["msgs"] or ["(no message)"]]


def read_records(path):
    netCDF4 = pytest.importorskip("netCDF4")
    with netCDF4.Dataset(path, "r") as handle:
        handle.set_auto_mask(False)
        return {name: np.asarray(handle.variables[name][:]) for name in ("time", *FIELDS)}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_snapshot_file_passes_the_cf_1_8_checker_with_no_error_or_warning(tmp_path, grid):
    result = run_stencil(2, grid, tmp_path / grid, "--steps", "20")
    assert result.returncode == 0, result.output
    path = tmp_path / grid / GRIDS[grid][1]
    assert read_records(path)["time"].shape == (5,)
    assert cf_problems(path, tmp_path) == []


@pytest.mark.parametrize("grid", list(GRIDS))
def test_restart_appends_every_record_from_t0_equal_to_an_uninterrupted_run(tmp_path, grid):
    name = GRIDS[grid][1]
    full = run_stencil(1, grid, tmp_path / "full", "--steps", "20")
    assert full.returncode == 0, full.output
    run = tmp_path / "run"
    first = run_stencil(2, grid, run, "--steps", "15", "--checkpoint-every", "10")
    assert first.returncode == 0, first.output
    assert read_records(run / name)["time"].shape == (4,)   # 0, 5, 10, 15
    # As after a crash once the checkpoint of step 10 was written: the record of step 15 is superseded.
    second = run_stencil(1, grid, run, "--steps", "20", "--restart", str(run / "checkpoints" / "ckpt_000000010"))
    assert second.returncode == 0, second.output
    expected, found = read_records(tmp_path / "full" / name), read_records(run / name)
    assert found["time"].shape == (5,) and np.all(np.diff(found["time"]) > 0), found["time"]
    np.testing.assert_array_equal(found["time"], expected["time"])
    for field in FIELDS:
        np.testing.assert_array_equal(found[field], expected[field], err_msg=field)
    assert cf_problems(run / name, tmp_path) == []


@pytest.mark.parametrize("grid", list(GRIDS))
def test_chain_with_restart_latest_appends_without_duplicates(tmp_path, grid):
    """The job-chain form: the same command twice, the first one stopped by its step count."""
    name = GRIDS[grid][1]
    run = tmp_path / "run"
    assert run_stencil(2, grid, run, "--steps", "10", "--checkpoint-every", "10").returncode == 0
    second = run_stencil(2, grid, run, "--steps", "20", "--checkpoint-every", "10", "--restart", "latest")
    assert second.returncode == 0, second.output
    times = read_records(run / name)["time"]
    np.testing.assert_allclose(times / times[1], [0, 1, 2, 3, 4], rtol=0, atol=1e-9)


def read_variables(path):
    """Every variable of the file, as stored (no masking or scaling)."""
    netCDF4 = pytest.importorskip("netCDF4")
    with netCDF4.Dataset(path, "r") as handle:
        handle.set_auto_maskandscale(False)
        return {name: np.asarray(variable[:]) for name, variable in handle.variables.items()}


@pytest.mark.parametrize("n_ranks", [1, 2])
@pytest.mark.parametrize("grid", list(GRIDS))
def test_a_chain_stopped_between_snapshots_continues_to_the_uninterrupted_file(tmp_path, grid, n_ranks):
    """The first job ends at step 13, not a snapshot step: it writes a final record there, which the
    uninterrupted run does not have, so the continuing job drops it (records 0, 5, 10, 15, 20)."""
    name = GRIDS[grid][1]
    full = run_stencil(n_ranks, grid, tmp_path / "full", "--steps", "20", "--checkpoint-every", "5")
    assert full.returncode == 0, full.output
    run = tmp_path / "run"
    first = run_stencil(n_ranks, grid, run, "--steps", "13", "--checkpoint-every", "5")
    assert first.returncode == 0, first.output
    assert read_records(run / name)["time"].shape == (4,)   # 0, 5, 10 and the final 13
    second = run_stencil(n_ranks, grid, run, "--steps", "20", "--checkpoint-every", "5", "--restart", "latest")
    assert second.returncode == 0, second.output
    expected, found = read_variables(tmp_path / "full" / name), read_variables(run / name)
    assert sorted(found) == sorted(expected)
    assert found["time"].shape == expected["time"].shape == (5,), found["time"]
    for variable in expected:
        np.testing.assert_array_equal(found[variable], expected[variable], err_msg=variable)
        assert found[variable].dtype == expected[variable].dtype, variable


@pytest.mark.parametrize("grid", list(GRIDS))
def test_a_fresh_run_refuses_to_overwrite_an_existing_snapshot_file(tmp_path, grid):
    name = GRIDS[grid][1]
    assert run_stencil(1, grid, tmp_path, "--steps", "10").returncode == 0
    before = read_records(tmp_path / name)
    again = run_stencil(2, grid, tmp_path, "--steps", "10")
    assert again.returncode == 2, again.output
    assert again.output.count("error:") == 1, again.output
    assert f"{tmp_path / name} already exists" in again.output and "--restart latest" in again.output
    after = read_records(tmp_path / name)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


def test_a_restart_refuses_a_snapshot_file_of_another_grid(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    assert run_stencil(1, "swe", tmp_path / "a", "--steps", "10", "--checkpoint-every", "10",
                       "--checkpoint-dir", str(checkpoints)).returncode == 0
    other = tmp_path / "other"
    assert run_stencil(1, "swe", other, "--steps", "5", "--nx", "40").returncode == 0
    result = run_stencil(2, "swe", other, "--steps", "15", "--restart", "latest", "--checkpoint-dir", str(checkpoints))
    assert result.returncode == 2, result.output
    assert result.output.count("error:") == 1, result.output
    assert "was written by another run" in result.output and "nx=40" in result.output, result.output
    assert read_records(other / "swe.nc")["time"].shape == (2,)   # untouched

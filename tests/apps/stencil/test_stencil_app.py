"""apps.stencil end to end: rank-count independence, conservation, exact solutions, output, errors."""

import json
import math
import sys
import warnings

import pytest

from hpcgpu.jobs.launch import run_mpi


def run_app(tmp_path, n_ranks, *args, name="run", timeout=240):
    summary = tmp_path / f"{name}.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", "--quiet", "--output", str(tmp_path / name),
                               "--summary", str(summary), *args], timeout=timeout)
    assert result.returncode == 0, result.output
    return json.loads(summary.read_text())


@pytest.mark.parametrize("model_args", [
    ("--model", "jacobi", "--nx", "64", "--ny", "48", "--steps", "40", "--norm-every", "10"),
    ("--model", "heat3d", "--nx", "16", "--ny", "12", "--nz", "10", "--steps", "20"),
    ("--model", "swe", "--nx", "48", "--ny", "24", "--steps", "30", "--snapshot-every", "0", "--no-plot"),
], ids=["jacobi", "heat3d", "swe"])
def test_final_state_is_bitwise_identical_for_any_rank_count(tmp_path, model_args):
    checksums = {}
    for n_ranks, dims in [(1, None), (2, None), (3, None), (4, None), (4, "4,1"), (2, "1,2")]:
        args = list(model_args) + (["--dims", dims + (",1" if "heat3d" in model_args else "")] if dims else [])
        summary = run_app(tmp_path, n_ranks, *args, name=f"r{n_ranks}_{dims}".replace(",", "x"))
        assert summary["n_ranks"] == n_ranks
        checksums[(n_ranks, dims)] = summary["checksum"]
    assert len(set(checksums.values())) == 1, checksums


def test_heat3d_matches_the_exact_discrete_solution(tmp_path):
    # A slowly decaying mode (lambda**60 ~ 0.2): the error is then measured against a solution of
    # order one, not against one that has decayed to the size of the rounding noise.
    summary = run_app(tmp_path, 2, "--model", "heat3d", "--nx", "32", "--ny", "24", "--nz", "16", "--steps", "60",
                      "--modes", "1,1,1", "--diffusion-number", "0.1")
    assert summary["diagnostics"]["relative_max_error"] <= 1e-12


def test_swe_conserves_mass_and_writes_cf_netcdf(tmp_path):
    summary = run_app(tmp_path, 3, "--model", "swe", "--nx", "60", "--ny", "30", "--steps", "120",
                      "--snapshot-every", "40", name="swe")
    diagnostics = summary["diagnostics"]
    assert abs(diagnostics["mass_relative_change"]) <= 1e-12
    assert abs(diagnostics["energy_relative_change"]) < 1e-3
    assert summary["unit"] == "cell-updates/s" and summary["throughput"] > 0
    for key in ("app", "version", "git_commit", "backend", "n_ranks", "decomposition", "steps", "wall_seconds",
                "throughput", "unit", "timers", "diagnostics", "checksum"):
        assert key in summary
    assert set(summary["timers"]["compute"]) == {"min", "mean", "max", "imbalance"}
    xarray = pytest.importorskip("xarray")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = xarray.open_dataset(tmp_path / "swe" / "swe.nc", engine="netcdf4")
        assert dataset.attrs["Conventions"] == "CF-1.8"
        assert dataset["h"].dims == ("time", "y", "x")
        assert dataset["h"].attrs["units"] == "m" and dataset["x"].attrs["units"] == "m"
        assert dataset.sizes["time"] == 4   # steps 0, 40, 80 and 120
        assert float(dataset["h"].isel(time=-1).mean()) == pytest.approx(100.0, rel=1e-2)
        dataset.close()
    assert (tmp_path / "swe" / "swe_final.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "swe" / "environment.json").read_text())["environment"]["backend"] == "cpu"


def test_geostrophic_jet_stays_steady(tmp_path):
    summary = run_app(tmp_path, 2, "--model", "swe", "--init", "geostrophic", "--nx", "24", "--ny", "60",
                      "--days", "0.25", "--snapshot-every", "0", "--no-plot")
    assert summary["diagnostics"]["height_l2_error_m"] < 0.05


def test_geostrophic_error_after_5_days_converges_at_second_order(tmp_path):
    """The balanced jet is an exact steady state: the height error after 5 days is the scheme's error.

    The channel keeps its width (900 km) while dx halves; 4 columns suffice because the state does not
    vary along x (and such a short channel holds none of the jet's unstable wavelengths).
    """
    errors = []
    for ny, dx in [(90, 10e3), (180, 5e3), (360, 2.5e3)]:
        summary = run_app(tmp_path, 1, "--model", "swe", "--init", "geostrophic", "--nx", "4", "--ny", str(ny),
                          "--dx", str(dx), "--days", "5", "--hyperviscosity", "0", "--snapshot-every", "0",
                          "--no-plot", name=f"geo{ny}", timeout=400)
        errors.append(summary["diagnostics"]["height_l2_error_m"])
    orders = [math.log2(coarse / fine) for coarse, fine in zip(errors, errors[1:])]
    assert all(order >= 2 - 0.3 for order in orders), (errors, orders)


def test_latlon_grid_through_the_app_is_rank_count_independent_and_conserves_mass(tmp_path):
    args = ("--grid", "latlon", "--init", "williamson6", "--nx", "64", "--ny", "32", "--steps", "20")
    summaries = [run_app(tmp_path, n, *args, *dims, name=f"ll{n}{'x'.join(dims)}")
                 for n, dims in [(1, ()), (2, ()), (4, ("--dims", "2,2")), (3, ("--dims", "3,1"))]]
    assert len({s["checksum"] for s in summaries}) == 1
    assert abs(summaries[0]["diagnostics"]["mass_relative_change"]) <= 1e-12


@pytest.mark.parametrize("args, expected", [
    (["--grid", "latlon", "--init", "jet"], "does not exist on --grid latlon"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--model", "jacobi", "--nx", "4", "--ny", "2", "--dims", "3,3"], "cannot split"),
    (["--model", "swe", "--nx", "40", "--ny", "20", "--dt", "5000"], "exceeds"),
    (["--config", "/nonexistent/run.toml"], "file not found"),
    (["--model", "heat3d", "--diffusion-number", "0.5", "--nx", "8", "--ny", "8", "--nz", "8"], "1/6"),
    (["--model", "swe", "--peer-halo"], "--peer-halo applies to --model jacobi only"),
    (["--model", "jacobi", "--nx", "64", "--ny", "64", "--peer-halo"], "it needs GPUs"),
])
def test_bad_input_gives_one_clear_message_and_exit_code_2(tmp_path, args, expected):
    result = run_mpi(2, [sys.executable, "-m", "apps.stencil", "--output", str(tmp_path), *args], timeout=120)
    assert result.returncode == 2, result.output
    assert expected in result.output
    assert result.output.count("error:") == 1, result.output


def test_help_and_config_file(tmp_path):
    result = run_mpi(2, [sys.executable, "-m", "apps.stencil", "--help"], timeout=60)
    assert result.returncode == 0 and result.output.count("usage:") == 1 and "--model" in result.output
    config = tmp_path / "run.toml"
    config.write_text('model = "jacobi"\nnx = 40\nny = 30\nsteps = 7\nnorm-every = 7\n')
    summary = run_app(tmp_path, 1, "--config", str(config), "--steps", "5")
    assert summary["steps"] == 5 and summary["model"] == "jacobi"
    assert summary["decomposition"]["global_shape"] == [30, 40]

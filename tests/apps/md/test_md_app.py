"""``python -m apps.md``: the common app contract, in.lj step 0, data files, H5MD output, NVE through the app."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[3]


def _run_app(comm, argv):
    from apps.md.app import build_parser, run
    from hpcgpu.app.cli import parse_args

    return run(parse_args(build_parser(comm.rank), argv + ["--quiet"]), comm)


def _shared_directory(comm):
    return comm.mpi.bcast(tempfile.mkdtemp(prefix="hpcgpu-md-") if comm.rank == 0 else None, root=0)


def test_help_lists_the_md_options():
    result = subprocess.run([sys.executable, "-m", "apps.md", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0
    for flag in ("--cells", "--data", "--write-data", "--potential", "--thermostat", "--dump-every",
                 "--rebuild-every", "--precision", "--thermo-every", "--summary", "--backend"):
        assert flag in result.stdout


@pytest.mark.parametrize("argv,message", [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--data", "/nonexistent/in.data"], "expected an existing LAMMPS data file"),
    (["--potential", "shift", "--tail"], "tail corrections assume the plain cut"),
])
def test_bad_input_exits_nonzero_with_one_clear_message(argv, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "apps.md", "--output", str(tmp_path), "--cells", "4"] + argv,
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr


def test_impossible_decomposition_is_one_clear_error(tmp_path):
    """2 x 2 x 2 fcc cells are 3.36 sigma wide: no room for two sub-boxes of cutoff + skin = 2.8."""
    result = run_mpi(2, [sys.executable, "-m", "apps.md", "--cells", "2", "--output", str(tmp_path)], timeout=60,
                     cwd=str(ROOT))
    assert result.returncode == 2, result.output
    assert "fewer ranks" in result.output and result.output.count("error:") == 1


@pytest.mark.mpi(ranks=[2], timeout=150)
def test_app_in_lj_data_files_h5md_and_checksums(comm):
    directory = Path(_shared_directory(comm))

    # LAMMPS bench/in.lj, step 0 (32,000 atoms), from the log of LAMMPS itself.
    summary = _run_app(comm, ["--steps", "0", "--output", str(directory / "inlj"), "--no-plot"])
    step0 = summary["thermo"][0]
    assert summary["n_atoms"] == 32000 and summary["n_ranks"] == 2
    assert [f"{step0[k]:.8g}" for k in ("temp", "e_pair", "toteng", "press")] == \
        ["1.44", "-6.7733681", "-4.6134356", "-5.0197073"]

    # A data file written at step 0 restarts the same trajectory as the lattice.
    small = ["--cells", "6", "--temperature", "1.2", "--thermo-every", "10"]
    _run_app(comm, small + ["--steps", "0", "--write-data", str(directory / "start.data"),
                            "--output", str(directory / "a"), "--no-plot"])
    from_data = _run_app(comm, small + ["--steps", "30", "--data", str(directory / "start.data"),
                                        "--output", str(directory / "b"), "--no-plot"])
    argv = small + ["--steps", "30", "--dump-every", "10", "--output", str(directory / "c"),
                    "--summary", str(directory / "c" / "summary.json")]
    from_lattice = _run_app(comm, argv)
    again = _run_app(comm, [*argv[:-4], "--output", str(directory / "c2")])   # a fresh run never overwrites c
    rows = lambda s: np.array([[t["step"], t["temp"], t["e_pair"], t["toteng"], t["press"]] for t in s["thermo"]])
    np.testing.assert_allclose(rows(from_data), rows(from_lattice), rtol=1e-13, atol=0)
    assert from_lattice["checksum"] == again["checksum"], "same rank count, same input: identical state"
    assert from_lattice["checksum"].startswith("sha256:")

    if comm.rank == 0:
        record = json.loads((directory / "c" / "summary.json").read_text())
        for key in ("app", "version", "git_commit", "backend", "n_ranks", "decomposition", "steps", "wall_seconds",
                    "throughput", "unit", "timers", "diagnostics", "checksum", "thermo"):
            assert key in record
        assert record["unit"] == "atom-steps/s" and record["steps"] == 30
        assert {"min", "mean", "max"} <= set(record["timers"]["compute"])
        assert "energy_drift" in record["diagnostics"]
        assert (directory / "c" / "thermo.png").stat().st_size > 1000
        _check_h5md(directory / "c" / "trajectory.h5md", n_atoms=864, steps=[0, 10, 20, 30])


def _check_h5md(path, n_atoms, steps):
    import h5py

    with h5py.File(path, "r") as handle:
        assert list(handle["h5md"].attrs["version"]) == [1, 1]
        assert "name" in handle["h5md/author"].attrs and "version" in handle["h5md/creator"].attrs
        box = handle["particles/all/box"]
        assert box.attrs["dimension"] == 3
        assert [b.decode() if isinstance(b, bytes) else b for b in box.attrs["boundary"]] == ["periodic"] * 3
        for name in ("position", "velocity", "image"):
            group = handle[f"particles/all/{name}"]
            assert list(group["step"][()]) == steps
            np.testing.assert_allclose(group["time"][()], np.array(steps) * 0.005)
            assert group["value"].shape == (len(steps), n_atoms, 3)
        assert handle["particles/all/position/value"].attrs["reduced_unit"] == "sigma"
        assert handle["particles/all/box/edges/value"].shape == (len(steps), 3)
        ids = handle["particles/all/id"][()]
        assert np.array_equal(ids, np.arange(1, n_atoms + 1))
        position = handle["particles/all/position/value"][-1]
        edges = handle["particles/all/box/edges/value"][-1]
        assert np.all((position >= 0) & (position < edges))
        assert handle["observables/temperature/value"].shape == (len(steps),)


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_nve_conserves_energy_through_the_app(comm):
    """5x5x5 fcc cells (500 atoms), force-shifted LJ (smooth), 400 steps at dt 0.004 from T 1.0."""
    directory = _shared_directory(comm)
    summary = _run_app(comm, ["--cells", "5", "--potential", "force_shift", "--temperature", "1.0", "--dt", "0.004",
                              "--steps", "400", "--thermo-every", "20", "--output", directory, "--no-plot"])
    energies = np.array([t["toteng"] for t in summary["thermo"]])
    temperatures = np.array([t["temp"] for t in summary["thermo"]])
    assert temperatures.min() < 0.8, "the lattice must melt and exchange kinetic and potential energy"
    assert np.ptp(energies) < 2e-4 * abs(energies[0])
    assert abs(summary["diagnostics"]["energy_drift"]["per_atom_per_tau"]) < 1e-4
    assert summary["diagnostics"]["neighbor_builds"] > 5

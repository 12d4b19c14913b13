"""The H5MD trajectory of ``python -m apps.md``: read by MDAnalysis with the LAMMPS data file, appended to
on restart, never overwritten."""

import sys
import warnings

import h5py
import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

SMALL = ["--cells", "4", "--backend", "numpy", "--quiet", "--no-plot", "--thermostat", "langevin"]
DT = 0.005   # the default time step (tau)
#: MDAnalysis 2.x reads a LAMMPS data file as atom_style "id resid type x y z" unless told; ours is atomic.
ATOMIC = {"atom_style": "id type x y z"}
SERIES = ("particles/all/position", "particles/all/velocity", "particles/all/image", "particles/all/box/edges",
          "observables/temperature", "observables/potential_energy", "observables/total_energy",
          "observables/pressure")


def run_md(n_ranks, output, *args):
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.md", *SMALL, "--output", str(output), *args], timeout=180)
    return result


def universe(*files):
    mdanalysis = pytest.importorskip("MDAnalysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # guessed elements / bonds of the LJ topology
        return mdanalysis.Universe(*files, **ATOMIC)


def read_series(path):
    with h5py.File(path, "r") as handle:
        return {name: {key: handle[f"{name}/{key}"][()] for key in ("step", "time", "value")} for name in SERIES}


def test_mdanalysis_opens_the_trajectory_with_the_data_file_it_started_from(tmp_path):
    start, end = tmp_path / "start.data", tmp_path / "end.data"
    first = run_md(1, tmp_path / "a", "--steps", "10", "--write-data", str(start))
    assert first.returncode == 0, first.output
    # Frames every 5 steps, thermo every 10: the observables must still have one entry per frame.
    second = run_md(2, tmp_path / "b", "--data", str(start), "--steps", "20", "--dump-every", "5",
                    "--thermo-every", "10", "--write-data", str(end))
    assert second.returncode == 0, second.output
    trajectory = tmp_path / "b" / "trajectory.h5md"
    u = universe(str(start), str(trajectory))
    assert u.trajectory.n_frames == 5 and u.atoms.n_atoms == 256
    assert u.trajectory.units["length"] == "Angstrom" and u.trajectory.units["time"] == "ps"   # = sigma, tau
    box = universe(str(start)).dimensions
    steps, times = [], []
    for ts in u.trajectory:
        steps.append(int(ts.data["step"]))
        times.append(ts.time)
        assert np.isfinite(ts.data["temperature"]) and np.isfinite(ts.data["total_energy"])
        np.testing.assert_allclose(ts.dimensions, box, rtol=1e-6)
    assert steps == [0, 5, 10, 15, 20]
    np.testing.assert_allclose(times, np.array(steps) * DT, rtol=1e-12)
    u.trajectory[0]
    np.testing.assert_array_equal(u.atoms.positions, universe(str(start)).atoms.positions)
    u.trajectory[-1]
    np.testing.assert_array_equal(u.atoms.positions, universe(str(end)).atoms.positions)


def test_mdanalysis_opens_the_trajectory_alone_and_no_twin_copy_is_left(tmp_path):
    result = run_md(2, tmp_path, "--steps", "10", "--dump-every", "5")
    assert result.returncode == 0, result.output
    mdanalysis = pytest.importorskip("MDAnalysis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # no types to guess masses from
        u = mdanalysis.Universe(str(tmp_path / "trajectory.h5md"))
    assert u.atoms.n_atoms == 256 and u.trajectory.n_frames == 3
    assert [int(ts.data["step"]) for ts in u.trajectory] == [0, 5, 10]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_restart_keeps_every_frame_from_step_0_equal_to_an_uninterrupted_run(tmp_path):
    every = ["--dump-every", "5", "--thermo-every", "10"]
    full = run_md(2, tmp_path / "full", "--steps", "30", *every)
    assert full.returncode == 0, full.output
    run = tmp_path / "run"
    first = run_md(2, run, "--steps", "20", "--checkpoint-every", "7", *every)
    assert first.returncode == 0, first.output
    # As after a crash once the checkpoint of step 7 was written: frames 10, 15, 20 are superseded,
    # and step 7 (the restart's first step) is not a frame.
    second = run_md(2, run, "--steps", "30", "--restart", str(run / "checkpoints" / "ckpt_000000007"), *every)
    assert second.returncode == 0, second.output
    expected, found = read_series(tmp_path / "full" / "trajectory.h5md"), read_series(run / "trajectory.h5md")
    for name in SERIES:
        assert list(found[name]["step"]) == [0, 5, 10, 15, 20, 25, 30], name
        for key in ("step", "time", "value"):
            np.testing.assert_array_equal(found[name][key], expected[name][key], err_msg=f"{name}/{key}")


def test_chain_with_restart_latest_holds_all_frames_from_step_0(tmp_path):
    every = ["--dump-every", "5", "--checkpoint-every", "10"]
    assert run_md(1, tmp_path, "--steps", "10", *every).returncode == 0
    second = run_md(2, tmp_path, "--steps", "20", "--restart", "latest", *every)
    assert second.returncode == 0, second.output
    found = read_series(tmp_path / "trajectory.h5md")
    for name in SERIES:
        assert list(found[name]["step"]) == [0, 5, 10, 15, 20], name
        np.testing.assert_allclose(found[name]["time"], found[name]["step"] * DT, rtol=1e-12)


@pytest.mark.parametrize("n_ranks", [1, 2])
def test_a_chain_stopped_between_dumps_continues_to_the_uninterrupted_file(tmp_path, n_ranks):
    """A job that ends at step 13 (not a dump step) writes no frame there: the chain continued with
    --restart latest holds the frames of the uninterrupted run, every series bit for bit."""
    every = ["--dump-every", "5", "--checkpoint-every", "5"]
    assert run_md(n_ranks, tmp_path / "full", "--steps", "20", *every).returncode == 0
    run = tmp_path / "run"
    assert run_md(n_ranks, run, "--steps", "13", *every).returncode == 0
    assert list(read_series(run / "trajectory.h5md")["particles/all/position"]["step"]) == [0, 5, 10]
    second = run_md(n_ranks, run, "--steps", "20", "--restart", "latest", *every)
    assert second.returncode == 0, second.output
    expected, found = read_series(tmp_path / "full" / "trajectory.h5md"), read_series(run / "trajectory.h5md")
    for name in SERIES:
        assert list(found[name]["step"]) == [0, 5, 10, 15, 20], name
        for key in ("step", "time", "value"):
            np.testing.assert_array_equal(found[name][key], expected[name][key], err_msg=f"{name}/{key}")


def test_a_fresh_run_refuses_to_overwrite_a_trajectory(tmp_path):
    assert run_md(1, tmp_path, "--steps", "10", "--dump-every", "5").returncode == 0
    before = read_series(tmp_path / "trajectory.h5md")
    again = run_md(2, tmp_path, "--steps", "10", "--dump-every", "5")
    assert again.returncode == 2, again.output
    assert again.output.count("error:") == 1, again.output
    assert f"{tmp_path / 'trajectory.h5md'} already exists" in again.output, again.output
    after = read_series(tmp_path / "trajectory.h5md")
    for name in SERIES:
        np.testing.assert_array_equal(after[name]["value"], before[name]["value"])


def test_a_restart_refuses_the_trajectory_of_another_system(tmp_path):
    checkpoints = str(tmp_path / "checkpoints")
    assert run_md(1, tmp_path / "a", "--steps", "10", "--checkpoint-every", "10",
                  "--checkpoint-dir", checkpoints).returncode == 0
    other = tmp_path / "other"
    assert run_md(1, other, "--steps", "5", "--dump-every", "5", "--cells", "5").returncode == 0
    result = run_md(2, other, "--steps", "20", "--dump-every", "5", "--restart", "latest",
                    "--checkpoint-dir", checkpoints)
    assert result.returncode == 2, result.output
    assert result.output.count("error:") == 1, result.output
    assert "other atoms" in result.output and "trajectory.h5md" in result.output, result.output
    assert list(read_series(other / "trajectory.h5md")["particles/all/position"]["step"]) == [0, 5]

"""Multi-rank restarts: equivalence, N -> M ranks, a rank killed mid-write, signals, wall time.

Each scenario runs ``tests/checkpoint/toy_run.py`` under mpiexec (through ``hpcgpu.jobs.launch.run_mpi``,
with a timeout) and compares the final checksums with an uninterrupted run: field in global order,
particles sorted by id, the replicated RNG's next draw; all must be bitwise equal.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcgpu.checkpoint.filesystem import FAULT_EXIT_CODE
from hpcgpu.jobs.launch import run_mpi

SCRIPT = Path(__file__).with_name("toy_run.py")
ROOT = Path(__file__).resolve().parents[2]
STEPS = 20


def toy(n_ranks, directory, *args, env=None):
    result = run_mpi(n_ranks, [sys.executable, str(SCRIPT), "--dir", str(directory), *map(str, args)],
                     timeout=60, env=env, cwd=str(ROOT))
    assert not result.timed_out, result.output
    return result


def finished(n_ranks, directory, result_file, *args):
    result = toy(n_ranks, directory, "--result", result_file, *args)
    assert result.returncode == 0, result.output
    return json.loads(Path(result_file).read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of STEPS steps on one rank."""
    where = tmp_path_factory.mktemp("reference")
    return finished(1, where / "ckpt", where / "result.json", "--steps", STEPS)


def test_restarts_across_4_2_and_3_ranks_continue_bitwise(tmp_path, reference):
    directory = tmp_path / "ckpt"
    finished(4, directory, tmp_path / "a.json", "--steps", 7, "--every", 7)
    finished(2, directory, tmp_path / "b.json", "--steps", 14, "--every", 7, "--restart", "latest")
    final = finished(3, directory, tmp_path / "c.json", "--steps", STEPS, "--restart", "latest")
    assert final == reference


def test_asynchronous_checkpoints_restart_bitwise_on_the_same_ranks(tmp_path, reference):
    directory = tmp_path / "ckpt"
    finished(3, directory, tmp_path / "a.json", "--steps", 12, "--every", 4, "--asynchronous")
    assert [p.name for p in sorted(directory.iterdir())] == ["ckpt_000000008", "ckpt_000000012"]  # keep=2
    final = finished(3, directory, tmp_path / "b.json", "--steps", STEPS, "--restart", "latest")
    assert final == reference


def test_a_rank_killed_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path, reference):
    directory = tmp_path / "ckpt"
    crashed = toy(2, directory, "--steps", STEPS, "--every", 10, "--fault-at-step", 20, "--fault", "mid-rank-file:1")
    assert crashed.returncode != 0
    assert {p.name for p in directory.iterdir()} == {"ckpt_000000010", "ckpt_000000020.tmp"}
    final = finished(2, directory, tmp_path / "b.json", "--steps", STEPS, "--restart", "latest")
    assert final == reference


def test_rank_0_killed_while_its_layout_process_writes_the_master_leaves_the_previous_checkpoint(tmp_path, reference):
    """Asynchronous saves write the master in the layout process; the injected fault still ends rank 0."""
    directory = tmp_path / "ckpt"
    crashed = toy(2, directory, "--steps", STEPS, "--every", 10, "--asynchronous", "--fault-at-step", 20,
                  "--fault", "mid-master")
    assert crashed.returncode != 0
    assert {p.name for p in directory.iterdir()} == {"ckpt_000000010", "ckpt_000000020.tmp"}
    final = finished(2, directory, tmp_path / "b.json", "--steps", STEPS, "--restart", "latest")
    assert final == reference


def test_sigusr1_on_one_rank_checkpoints_all_and_exits_for_requeue(tmp_path, reference):
    directory = tmp_path / "ckpt"
    stopped = toy(3, directory, "--steps", 1000, "--signal-rank", 1, "--signal-step", 7)
    assert stopped.returncode == 75, stopped.output
    assert "stopping: a stop signal" in stopped.output
    assert [p.name for p in directory.iterdir()] == ["ckpt_000000007"]
    final = finished(2, directory, tmp_path / "b.json", "--steps", STEPS, "--restart", "latest")
    assert final == reference


def test_the_wall_time_limit_checkpoints_and_exits_for_requeue(tmp_path):
    directory = tmp_path / "ckpt"
    stopped = toy(2, directory, "--steps", 10**6, "--sleep", 0.01, "--wall-time-limit", 1.0)
    assert stopped.returncode == 75, stopped.output
    assert "wall-time limit" in stopped.output and len(list(directory.iterdir())) == 1


def _shared_directory(name, comm):
    """A directory every rank of an MPI child agrees on (the children re-run the test function)."""
    directory = Path("/tmp/hpcgpu-tests") / f"{name}-{comm.size}"
    if comm.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    comm.barrier()
    return directory


@pytest.mark.mpi(ranks=[2, 3], timeout=60)
def test_damage_seen_by_one_rank_fails_the_load_on_every_rank(comm):
    import h5py

    import hpcgpu
    from hpcgpu.checkpoint import CheckpointManager
    from hpcgpu.errors import CheckpointError
    from tests.checkpoint.serial import data_offset

    directory = _shared_directory("checkpoint-damage", comm)
    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, (30, 20))
    field = hpcgpu.Field(grid, arch, halo_width=1, name="h")
    field.set_from_global(lambda y, x: 100.0 * y + x)
    manager = CheckpointManager(comm, directory, app="tests.app")
    manager.save(1, fields={"h": field}, replicated={"time": 1.0})
    if comm.rank == 0:  # damage the block of the last rank only
        victim = directory / "ckpt_000000001" / f"rank_{comm.size - 1:05d}.h5"
        with h5py.File(victim, "r") as handle:
            offset = data_offset(handle["fields/h"])
        with open(victim, "r+b") as raw:
            raw.seek(offset + 8)
            raw.write(b"\xff\xfe")
    comm.barrier()
    with pytest.raises(CheckpointError, match=f"rank_{comm.size - 1:05d}.h5: checksum mismatch") as raised:
        manager.load(directory / "ckpt_000000001", fields={"h": field})
    assert raised.value.replicated
    with pytest.raises(CheckpointError, match="replicated state differs between rank 0 and rank 1"):
        manager.save(2, fields={"h": field}, replicated={"time": float(comm.rank)})
    comm.barrier()
    assert not (directory / "ckpt_000000002.tmp").exists()

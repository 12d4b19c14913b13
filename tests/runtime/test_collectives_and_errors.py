"""Collectives on host data, input errors raised identically on every rank, and job-wide abort."""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_allreduce_broadcast_barrier(comm):
    n = comm.size
    assert comm.allreduce(comm.rank, "sum") == n * (n - 1) // 2
    assert comm.allreduce(float(comm.rank), "max") == float(n - 1)
    assert comm.allreduce(comm.rank + 10, "min") == 10
    values = np.arange(5, dtype=np.float64) * (comm.rank + 1)
    assert np.array_equal(comm.allreduce(values, "sum"), np.arange(5) * n * (n + 1) / 2)
    assert np.array_equal(comm.allreduce(values, "max"), np.arange(5) * n)
    assert values[1] == comm.rank + 1, "input must not be modified"
    array = np.full(3, comm.rank, dtype=np.int32)
    assert np.all(comm.broadcast(array, root=n - 1) == n - 1)
    assert comm.broadcast({"step": 3} if comm.rank == 0 else None) == {"step": 3}
    comm.barrier()
    assert comm.local_size >= 1 and 0 <= comm.local_rank < comm.local_size
    assert comm.n_nodes >= 1 and comm.node_index == 0


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_errors_are_raised_identically_on_every_rank(comm):
    import hpcgpu
    from hpcgpu.errors import ConfigurationError, DecompositionError, HaloError

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    with pytest.raises(DecompositionError, match="cannot split"):
        hpcgpu.Decomposition(comm, (2, 1), dims=(comm.size + 1, 0))
    grid = hpcgpu.Decomposition(comm, (4 * comm.size, 5), dims=(0, 1), periodic=(True, True))
    field = hpcgpu.Field(grid, arch, halo_width=(5, 1))
    with pytest.raises(HaloError, match="exceeds the smallest block extent"):
        field.exchange_halos()
    with pytest.raises(ConfigurationError, match="--backend"):
        hpcgpu.arch.auto(comm, backend="tpu")
    # A condition true on one rank only becomes the same error on all ranks.
    with pytest.raises(ConfigurationError, match=r"\[rank 0/\d+\] only rank 0 is unhappy"):
        comm.check(comm.rank != 0, "only rank 0 is unhappy")
    # Scatter with a wrong-shaped array on the root fails everywhere, without a hang.
    with pytest.raises(ConfigurationError, match="scatter expected"):
        field.scatter(np.zeros((1, 1)) if comm.rank == 0 else None)


def test_an_exception_on_one_rank_ends_the_whole_job_quickly(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(
        """
        import time
        import hpcgpu
        comm = hpcgpu.Communicator()
        with hpcgpu.abort_on_error(comm):
            if comm.rank == 1:
                raise RuntimeError("rank 1 fails on purpose")
            comm.barrier()          # the other ranks would wait here forever
            time.sleep(300)
        """
    ))
    started = time.monotonic()
    result = run_mpi(3, [sys.executable, str(script)], timeout=90)
    elapsed = time.monotonic() - started
    assert not result.timed_out, result.output
    assert result.returncode != 0
    assert "[rank 1/3]" in result.output and "rank 1 fails on purpose" in result.output
    assert elapsed < 60


def test_an_input_error_on_every_rank_exits_cleanly_with_one_message(tmp_path):
    script = tmp_path / "bad_input.py"
    script.write_text(textwrap.dedent(
        """
        import hpcgpu
        comm = hpcgpu.Communicator()
        with hpcgpu.abort_on_error(comm):
            hpcgpu.Decomposition(comm, (1, 1), dims=(2, 2))
        """
    ))
    result = run_mpi(2, [sys.executable, str(script)], timeout=90)
    assert result.returncode == 2, result.output
    assert result.output.count("cannot split") == 1


def test_import_has_no_side_effects():
    code = (
        "import sys, hpcgpu, hpcgpu.decomposition, hpcgpu.field, hpcgpu.arch; "
        "assert 'mpi4py.MPI' not in sys.modules, 'MPI initialised at import'; "
        "assert 'cupy' not in sys.modules, 'CuPy imported at import'; print('clean')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr

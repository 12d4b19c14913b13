"""The MPI transports' reduce-scatter with per-rank counts and non-blocking allreduce.

``reduce_scatterv`` and ``allreduce_start`` are what data-parallel training needs on MPI (ZeRO-1's
uneven shards, gradient buckets that overlap backward): each must equal the serial sum where sums are
exact, and be bitwise the MPI call it wraps on rounded values (what keeps training's checksums).
"""

import numpy as np
import pytest

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives


def shard_counts(n, size):
    """ZeRO-1's shards: ``n // size`` each, the rest to the last rank."""
    chunk = n // size
    return [chunk] * (size - 1) + [n - chunk * (size - 1)]


def rounded_values(rank, n, dtype):
    """Values whose sums round (so the order of the additions shows in the bits)."""
    rng = np.random.default_rng(100 + rank)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_reduce_scatterv_equals_the_serial_sum_and_mpi_reduce_scatter(comm):
    from mpi4py import MPI

    movers = collectives(comm, on_device=False)
    for n in (comm.size, 7 * comm.size + 3, 4099):
        counts = shard_counts(n, comm.size)
        lo = sum(counts[:comm.rank])
        exact = (np.arange(n, dtype=np.float64) * 3 + 1000 * comm.rank)
        out = np.empty(counts[comm.rank])
        assert movers.reduce_scatterv(exact, out, counts) is out
        expected = sum(np.arange(n, dtype=np.float64) * 3 + 1000 * r for r in range(comm.size))
        assert np.array_equal(out, expected[lo:lo + counts[comm.rank]])
        for dtype in (np.float32, np.float64, np.float16):
            values = rounded_values(comm.rank, n, dtype)
            out = np.empty(counts[comm.rank], dtype=dtype)
            movers.reduce_scatterv(values, out, counts)
            mpi_result = np.empty_like(out)
            comm.mpi.Reduce_scatter(values, mpi_result, recvcounts=counts, op=MPI.SUM)
            assert out.tobytes() == mpi_result.tobytes(), (n, dtype)
    maxima = np.empty(shard_counts(5, comm.size)[comm.rank])
    movers.reduce_scatterv(np.full(5, float(comm.rank)), maxima, shard_counts(5, comm.size), op="max")
    assert np.all(maxima == comm.size - 1)


@pytest.mark.mpi(ranks=[1, 3])
def test_allreduce_start_equals_mpi_iallreduce_in_place_and_not(comm):
    from mpi4py import MPI

    movers = collectives(comm, on_device=False)
    for dtype in (np.float32, np.float64):
        values = rounded_values(comm.rank, 1001, dtype)
        in_place = values.copy()
        handle = movers.allreduce_start(in_place, out=in_place)
        while not handle.test():
            pass
        handle.wait()
        reference = values.copy()
        comm.mpi.Iallreduce(MPI.IN_PLACE, reference, op=MPI.SUM).Wait()
        assert in_place.tobytes() == reference.tobytes()
        out = np.empty_like(values)
        movers.allreduce_start(values, out=out, op="min").wait()
        everyone = [rounded_values(rank, 1001, dtype) for rank in range(comm.size)]
        assert np.array_equal(out, np.min(everyone, axis=0))


@pytest.mark.mpi(ranks=[2])
def test_reduce_scatterv_counts_must_fit(comm):
    movers = collectives(comm, on_device=False)
    with pytest.raises(ConfigurationError, match=r"reduce_scatterv: send holds 5 elements, expected sum\(counts\) = 6"):
        movers.reduce_scatterv(np.zeros(5), np.zeros(3), [3, 3])
    with pytest.raises(ConfigurationError, match=r"reduce_scatterv: out holds 2 elements, expected counts\[rank\] = 3"):
        movers.reduce_scatterv(np.zeros(6), np.zeros(2), [3, 3])

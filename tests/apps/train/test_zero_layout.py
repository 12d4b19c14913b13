"""ZeRO-1's collectives on the ``nccl`` branch: which calls, on which parts of the flat buffer.

NCCL's reduce-scatter and all-gather need equal blocks, so :class:`apps.train.parallel.zero.ZeroRedundancy`
issues a reduce-scatter IN PLACE over the ``size`` equal shards plus an allreduce of the remainder, and
an all-gather in place plus a broadcast of the remainder from the last rank; the bits on GPUs depend on
exactly that split. The NCCL path cannot run here, so :class:`RecordingNccl` stands in: it answers to the
name ``nccl``, records every call as (operation, offset, size) of the views it was given, and performs it
with MPI on copies (as NCCL does in place). The MPI branch must give the same sums (exact integers).
"""

import numpy as np
import pytest

import apps.train.parallel.zero as zero
from apps.train.parallel.zero import ZeroRedundancy
from hpcgpu.arch import CPU
from hpcgpu.transport import collectives


def span(view, base):
    """(offset, size) in elements of ``view`` inside the 1-D ``base``."""
    start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // base.itemsize
    return int(start), int(view.size)


class RecordingNccl:
    """The calls ZeroRedundancy makes on the nccl branch, carried out by the host collectives."""

    name = "nccl"
    on_device = True
    capturable = True

    def __init__(self, comm, base):
        self.host, self.base, self.calls = collectives(comm, on_device=False), base, []

    def reduce_scatter(self, send, out, op="sum", stream=None):
        self.calls.append(("reduce_scatter", span(send, self.base), span(out, self.base)))
        out[...] = self.host.reduce_scatter(send.copy(), np.empty_like(out))

    def allreduce(self, send, out=None, op="sum", stream=None):
        assert out is send, "the remainder is reduced in place"
        self.calls.append(("allreduce", span(send, self.base)))
        out[...] = self.host.allreduce(send.copy())

    def allgather(self, send, out, stream=None):
        self.calls.append(("allgather", span(send, self.base), span(out, self.base)))
        out[...] = self.host.allgather(send.copy(), np.empty_like(out))

    def broadcast(self, array, root=0, stream=None):
        self.calls.append(("broadcast", span(array, self.base), root))
        self.host.broadcast(array, root)


def rank_gradients(rank, n):
    return (np.arange(n, dtype=np.float64) + 100 * rank).astype(np.float32)


@pytest.mark.mpi(ranks=[3], timeout=60)
def test_nccl_branch_splits_equal_shards_and_a_remainder(comm, monkeypatch):
    size, rank, n = comm.size, comm.rank, 3 * 5 + 2   # chunk 5, remainder 2 (the last rank's)
    expected = sum(rank_gradients(r, n) for r in range(size))

    mpi_sync = ZeroRedundancy(comm, CPU())
    mpi_grads = rank_gradients(rank, n)
    mpi_sync.bind(mpi_grads)
    mpi_sync.finish_gradients(mpi_grads)
    lo, hi = mpi_sync.owned_range(n)
    assert np.array_equal(mpi_grads[lo:hi], expected[lo:hi])

    grads = rank_gradients(rank, n)
    recorder = RecordingNccl(comm, grads)
    monkeypatch.setattr(zero, "collectives", lambda comm, on_device: recorder)
    sync = ZeroRedundancy(comm, CPU())
    sync.bind(grads)
    sync.finish_gradients(grads)
    assert recorder.calls == [("reduce_scatter", (0, 15), (5 * rank, 5)), ("allreduce", (15, 2))]
    assert np.array_equal(grads[lo:hi], expected[lo:hi])   # the MPI branch's sums, bit for bit

    params = np.where(np.arange(n) // 5 == rank, 1.0 + rank, -1.0)
    params[15:] = 7.0 if rank == size - 1 else -1.0
    recorder.base, recorder.calls = params, []
    sync.gather_params(params)
    assert recorder.calls == [("allgather", (5 * rank, 5), (0, 15)), ("broadcast", (15, 2), size - 1)]
    assert np.array_equal(params, np.concatenate([np.repeat([1.0, 2.0, 3.0], 5), [7.0, 7.0]]))

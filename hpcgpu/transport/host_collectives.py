"""Collectives and paired point-to-point messages on host (NumPy) buffers, through MPI.

The CPU transport (``mpi``) of every job, and the host side of the GPU transports that go through MPI
(``mpi-staged``, ``mpi-cuda``: :mod:`hpcgpu.transport.device_collectives`). The operations and their
argument conventions are those of :class:`hpcgpu.transport.collectives.Collectives`.

Every call is an MPI buffer call on contiguous arrays: results are bitwise those of MPI's own
reductions (``MPI_Allreduce`` and friends), whatever the number of ranks.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.transport.collectives_base import OPERATORS, CommunicatorCollectives, check_operator, require_contiguous
from hpcgpu.transport.messages import Message, check_counts, message_tags, resolve_messages

def mpi_operator(op: str):
    """The ``mpi4py.MPI.Op`` of ``op`` (one of :data:`~hpcgpu.transport.collectives_base.OPERATORS`)."""
    check_operator(op)
    from mpi4py import MPI

    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def mpi_datatype(dtype, reducing: bool):
    """The MPI datatype of a NumPy dtype, or None when the bytes of the array travel as ``MPI.BYTE``.

    Raises
    ------
    BackendError
        ``reducing`` and MPI has no arithmetic for ``dtype`` (bfloat16, say): reduce a float32 copy.
    """
    from mpi4py import MPI

    dtype = np.dtype(dtype)
    datatype = MPI._typedict.get(dtype.char) if dtype.kind in "biufc" else None
    if datatype is None and reducing:
        raise BackendError(f"MPI cannot reduce dtype {dtype} (it has no such arithmetic); reduce a float32 "
                           "copy instead, or use the nccl transport on GPUs")
    return datatype


def buffer_spec(array, reducing: bool = False):
    """An mpi4py buffer specification of a contiguous array, ``[array, type]`` (mpi4py infers the counts
    per rank from the sizes), or its bytes when MPI has no type for the dtype (only when not ``reducing``)."""
    datatype = mpi_datatype(array.dtype, reducing)
    if datatype is None:
        from mpi4py import MPI

        return [array.reshape(-1).view(np.uint8), MPI.BYTE]
    return [array, datatype]


def _vector_spec(array, counts, reducing: bool = False):
    """``[array, (counts, displacements), type]`` for the v-collectives, in elements (or bytes)."""
    counts = np.asarray(counts, dtype=np.int64)
    displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    datatype = mpi_datatype(array.dtype, reducing)
    if datatype is None:
        from mpi4py import MPI

        size = array.itemsize
        return [array.reshape(-1).view(np.uint8), (counts * size, displacements * size), MPI.BYTE]
    return [array, (counts, displacements), datatype]


class MpiRequests:
    """The handle of a host exchange or non-blocking collective: ``wait()`` completes every request (and
    runs ``after``); ``test()`` says, without blocking, whether they have completed."""

    def __init__(self, requests, after=None):
        self.requests, self.after = requests, after

    def test(self) -> bool:
        """Whether every request has completed; never blocks. MPI libraries such as MPICH progress
        non-blocking collectives only inside MPI calls: call this now and then while computing."""
        from mpi4py import MPI

        return bool(MPI.Request.Testall(self.requests))

    def wait(self) -> None:
        from mpi4py import MPI

        MPI.Request.Waitall(self.requests)
        self.requests = []
        if self.after is not None:
            after, self.after = self.after, None
            after()


class HostCollectives(CommunicatorCollectives):
    """MPI collectives and paired messages on NumPy arrays of one communicator (transport ``mpi``).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    """

    name = "mpi"
    #: MPI calls synchronise with the host: nothing here can sit inside a CUDA graph.
    capturable = False
    on_device = False

    # ------------------------------------------------------------------ reductions
    def allreduce(self, send, out=None, op: str = "sum", stream=None):
        mpi_op = mpi_operator(op)
        send = require_contiguous(send, "allreduce")
        if out is None:
            out = np.empty_like(send)
        if out is send:
            from mpi4py import MPI

            self.comm.mpi.Allreduce(MPI.IN_PLACE, buffer_spec(out, reducing=True), op=mpi_op)
        else:
            self.comm.mpi.Allreduce(buffer_spec(send, reducing=True), buffer_spec(out, reducing=True), op=mpi_op)
        return out

    def allreduce_start(self, send, out=None, op: str = "sum") -> "MpiRequests":
        """Non-blocking :meth:`allreduce` (``MPI_Iallreduce``) into ``out`` (new if None; ``out is send``
        reduces in place): the handle's ``wait()`` completes it, ``test()`` lets MPI progress it.
        ``send`` and ``out`` must stay untouched until then."""
        from mpi4py import MPI

        mpi_op = mpi_operator(op)
        send = require_contiguous(send, "allreduce_start")
        if out is None:
            out = np.empty_like(send)
        if out is send:
            request = self.comm.mpi.Iallreduce(MPI.IN_PLACE, buffer_spec(out, reducing=True), op=mpi_op)
        else:
            request = self.comm.mpi.Iallreduce(buffer_spec(send, reducing=True),
                                               buffer_spec(require_contiguous(out, "allreduce_start"), reducing=True),
                                               op=mpi_op)
        handle = MpiRequests([request])
        handle.buffers = (send, out)   # alive until the reduction completes
        return handle

    def reduce_scatter(self, send, out, op: str = "sum", stream=None):
        mpi_op = mpi_operator(op)
        check_counts("reduce_scatter", send.size, out.size * self.size, "send", "size x out")
        self.comm.mpi.Reduce_scatter_block(buffer_spec(require_contiguous(send, "reduce_scatter"), reducing=True),
                                           buffer_spec(require_contiguous(out, "reduce_scatter"), reducing=True),
                                           op=mpi_op)
        return out

    # ------------------------------------------------------------------ data movement
    def allgather(self, send, out, stream=None):
        check_counts("allgather", out.size, send.size * self.size, "out", "size x send")
        self.comm.mpi.Allgather(buffer_spec(require_contiguous(send, "allgather")),
                                buffer_spec(require_contiguous(out, "allgather")))
        return out

    def allgatherv(self, send, out, counts, stream=None):
        counts = [int(c) for c in counts]
        check_counts("allgatherv", send.size, counts[self.rank], "send", "counts[rank]")
        check_counts("allgatherv", out.size, sum(counts), "out", "sum(counts)")
        self.comm.mpi.Allgatherv(buffer_spec(require_contiguous(send, "allgatherv")),
                                 _vector_spec(require_contiguous(out, "allgatherv"), counts))
        return out

    def broadcast(self, array, root: int = 0, stream=None):
        self.comm.mpi.Bcast(buffer_spec(require_contiguous(array, "broadcast")), root=root)
        return array

    def gatherv(self, send, out, counts, root: int = 0, stream=None):
        counts = [int(c) for c in counts]
        check_counts("gatherv", send.size, counts[self.rank], "send", "counts[rank]")
        if self.rank == root:
            check_counts("gatherv", out.size, sum(counts), "out", "sum(counts)")
            self.comm.mpi.Gatherv(buffer_spec(require_contiguous(send, "gatherv")),
                                  _vector_spec(require_contiguous(out, "gatherv"), counts), root=root)
            return out
        self.comm.mpi.Gatherv(buffer_spec(require_contiguous(send, "gatherv")), None, root=root)
        return None

    def scatterv(self, send, out, counts, root: int = 0, stream=None):
        counts = [int(c) for c in counts]
        check_counts("scatterv", out.size, counts[self.rank], "out", "counts[rank]")
        if self.rank == root:
            check_counts("scatterv", send.size, sum(counts), "send", "sum(counts)")
            self.comm.mpi.Scatterv(_vector_spec(require_contiguous(send, "scatterv"), counts),
                                   buffer_spec(require_contiguous(out, "scatterv")), root=root)
        else:
            self.comm.mpi.Scatterv(None, buffer_spec(require_contiguous(out, "scatterv")), root=root)
        return out

    def alltoallv(self, send, send_counts, out, receive_counts, stream=None):
        send_counts = [int(c) for c in send_counts]
        receive_counts = [int(c) for c in receive_counts]
        check_counts("alltoallv", send.size, sum(send_counts), "send", "sum(send_counts)")
        check_counts("alltoallv", out.size, sum(receive_counts), "out", "sum(receive_counts)")
        self.comm.mpi.Alltoallv(_vector_spec(require_contiguous(send, "alltoallv"), send_counts),
                                _vector_spec(require_contiguous(out, "alltoallv"), receive_counts))
        return out

    # ------------------------------------------------------------------ point to point
    def exchange(self, sends=(), receives=(), tag: int = 0, stream=None) -> MpiRequests:
        """Post every receive and send (non-blocking) and return the handle whose ``wait()`` completes them.

        See :meth:`hpcgpu.transport.collectives.Collectives.exchange` for the matching rule."""
        receives, sends = resolve_messages(receives), resolve_messages(sends)
        mpi = self.comm.mpi
        requests = [mpi.Irecv(buffer_spec(require_contiguous(m.array, "exchange")), source=m.peer, tag=t)
                    for m, t in zip(receives, message_tags(receives, tag)) if m.array.size]
        requests += [mpi.Isend(buffer_spec(require_contiguous(m.array, "exchange")), dest=m.peer, tag=t)
                     for m, t in zip(sends, message_tags(sends, tag)) if m.array.size]
        return MpiRequests(requests)

    def send_receive(self, sends=(), receives=(), tag: int = 0, stream=None) -> None:
        """:meth:`exchange` and wait: every message has arrived (and every send buffer is free) on return."""
        self.exchange(sends, receives, tag, stream).wait()

    # ------------------------------------------------------------------ MPI-only operations
    # NCCL has no counterpart (training's ZeRO-1 needs it to stay bitwise MPI's own result on uneven
    # shards); MpiDeviceCollectives offers it too.
    def reduce_scatterv(self, send, out, counts, op: str = "sum", stream=None):
        """Reduce ``send`` (``sum(counts)`` elements) over the ranks; rank r receives block r
        (``counts[r]`` elements, blocks in rank order) in ``out``: ``MPI_Reduce_scatter``.

        Bitwise MPI's own result, which is not in general that of :meth:`reduce_scatter` on the equal
        part plus an :meth:`allreduce` of the rest (the library may add in another order). Returns ``out``.
        """
        mpi_op = mpi_operator(op)
        counts = [int(c) for c in counts]
        check_counts("reduce_scatterv", send.size, sum(counts), "send", "sum(counts)")
        check_counts("reduce_scatterv", out.size, counts[self.rank], "out", "counts[rank]")
        self.comm.mpi.Reduce_scatter(buffer_spec(require_contiguous(send, "reduce_scatterv"), reducing=True),
                                     buffer_spec(require_contiguous(out, "reduce_scatterv"), reducing=True),
                                     recvcounts=counts, op=mpi_op)
        return out


__all__ = ["HostCollectives", "Message", "MpiRequests", "OPERATORS", "buffer_spec", "mpi_datatype", "mpi_operator"]

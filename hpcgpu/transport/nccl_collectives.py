"""Collectives and paired point-to-point messages on CuPy arrays through NCCL (transport ``nccl``).

Every operation is queued on a CUDA stream (the ``stream`` argument, else the current stream) and
returns without waiting: kernels queued later on that stream see the result, and the calls can be
captured in a CUDA graph. The operations and argument conventions are those of
:class:`hpcgpu.transport.collectives.Collectives`.

NCCL has no v-collectives: ``allgatherv`` is one group of broadcasts (one per rank, into that rank's
slice of the output), ``gatherv``, ``scatterv`` and ``alltoallv`` are one group of sends and receives.
They move bytes, so their results are exactly those of the MPI transports.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.transport.collectives_base import CommunicatorCollectives, check_operator, require_contiguous
from hpcgpu.transport.messages import check_counts, resolve_messages
from hpcgpu.transport.nccl import (
    NcclMessage,
    grouped_send_receive,
    nccl_communicator,
    nccl_datatype,
    nccl_type_and_count,
)

#: ``ncclBfloat16`` (NCCL 2.10 and later), for CuPy builds whose ``nccl`` module lacks the name.
NCCL_BFLOAT16 = 9


def reduction_datatype(array, element_type: str | None):
    """The NCCL datatype for reducing ``array``: its dtype's, or ``element_type="bfloat16"`` for uint16
    arrays of bfloat16 bit patterns (CuPy has no bfloat16 dtype)."""
    if element_type is None:
        return nccl_datatype(array.dtype)
    if element_type == "bfloat16":
        if np.dtype(array.dtype).itemsize != 2:
            raise BackendError("element_type='bfloat16' needs a 2-byte array (uint16 bit patterns), found "
                               f"{array.dtype}")
        from cupy.cuda import nccl

        return getattr(nccl, "NCCL_BFLOAT16", NCCL_BFLOAT16)
    raise BackendError(f"unknown element_type {element_type!r}; expected None or 'bfloat16'")


def _pointer(array, offset_elements: int = 0) -> int:
    return int(array.data.ptr) + int(offset_elements) * array.itemsize


def _stream_pointer(stream) -> int:
    import cupy

    stream = cupy.cuda.get_current_stream() if stream is None else stream
    return stream if isinstance(stream, int) else stream.ptr


class _Queued:
    """The handle of work queued on a stream: ``wait()`` has nothing to do (the stream orders it)."""

    def wait(self) -> None:
        return None


class NcclCollectives(CommunicatorCollectives):
    """NCCL collectives of one communicator on CuPy arrays.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        Its NCCL communicator is created on first use (collective, :func:`nccl_communicator`).
    """

    name = "nccl"
    capturable = True
    on_device = True

    def __init__(self, comm):
        super().__init__(comm)
        self.nccl_comm = nccl_communicator(comm)

    # ------------------------------------------------------------------ reductions
    def allreduce(self, send, out=None, op: str = "sum", stream=None, element_type: str | None = None):
        import cupy
        from cupy.cuda import nccl

        check_operator(op)
        send = require_contiguous(send, "allreduce")
        if out is None:
            out = cupy.empty_like(send)
        datatype = reduction_datatype(send, element_type)
        self.nccl_comm.allReduce(_pointer(send), _pointer(require_contiguous(out, "allreduce")), send.size, datatype,
                                 getattr(nccl, f"NCCL_{op.upper()}"), _stream_pointer(stream))
        return out

    def reduce_scatter(self, send, out, op: str = "sum", stream=None, element_type: str | None = None):
        from cupy.cuda import nccl

        check_operator(op)
        check_counts("reduce_scatter", send.size, out.size * self.size, "send", "size x out")
        datatype = reduction_datatype(send, element_type)
        self.nccl_comm.reduceScatter(_pointer(require_contiguous(send, "reduce_scatter")),
                                     _pointer(require_contiguous(out, "reduce_scatter")), out.size, datatype,
                                     getattr(nccl, f"NCCL_{op.upper()}"), _stream_pointer(stream))
        return out

    # ------------------------------------------------------------------ data movement
    def allgather(self, send, out, stream=None):
        check_counts("allgather", out.size, send.size * self.size, "out", "size x send")
        datatype, count = nccl_type_and_count(require_contiguous(send, "allgather"))
        self.nccl_comm.allGather(_pointer(send), _pointer(require_contiguous(out, "allgather")), count, datatype,
                                 _stream_pointer(stream))
        return out

    def allgatherv(self, send, out, counts, stream=None):
        import cupy
        from cupy.cuda import nccl

        counts = [int(c) for c in counts]
        check_counts("allgatherv", send.size, counts[self.rank], "send", "counts[rank]")
        check_counts("allgatherv", out.size, sum(counts), "out", "sum(counts)")
        out = require_contiguous(out, "allgatherv")
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        stream_pointer = _stream_pointer(stream)
        own = out.reshape(-1)[offsets[self.rank]: offsets[self.rank] + counts[self.rank]]
        with cupy.cuda.ExternalStream(stream_pointer):
            own[...] = send.reshape(-1)
        datatype, scale = _byte_scaled(out)
        nccl.groupStart()
        try:
            for root, (offset, count) in enumerate(zip(offsets, counts)):
                if count:
                    self.nccl_comm.bcast(_pointer(out, offset), count * scale, datatype, root, stream_pointer)
        finally:
            nccl.groupEnd()
        return out

    def broadcast(self, array, root: int = 0, stream=None):
        datatype, count = nccl_type_and_count(require_contiguous(array, "broadcast"))
        self.nccl_comm.bcast(_pointer(array), count, datatype, int(root), _stream_pointer(stream))
        return array

    def gatherv(self, send, out, counts, root: int = 0, stream=None):
        counts = [int(c) for c in counts]
        check_counts("gatherv", send.size, counts[self.rank], "send", "counts[rank]")
        flat_send = require_contiguous(send, "gatherv").reshape(-1)
        if self.rank != root:
            grouped_send_receive(self.nccl_comm, [(flat_send, root)], [], _stream_pointer(stream))
            return None
        check_counts("gatherv", out.size, sum(counts), "out", "sum(counts)")
        pieces = _split(require_contiguous(out, "gatherv").reshape(-1), counts)
        self._copy(pieces[root], flat_send, stream)
        grouped_send_receive(self.nccl_comm, [], [(piece, rank) for rank, piece in enumerate(pieces) if rank != root],
                             _stream_pointer(stream))
        return out

    def scatterv(self, send, out, counts, root: int = 0, stream=None):
        counts = [int(c) for c in counts]
        check_counts("scatterv", out.size, counts[self.rank], "out", "counts[rank]")
        flat_out = require_contiguous(out, "scatterv").reshape(-1)
        if self.rank != root:
            grouped_send_receive(self.nccl_comm, [], [(flat_out, root)], _stream_pointer(stream))
            return out
        check_counts("scatterv", send.size, sum(counts), "send", "sum(counts)")
        pieces = _split(require_contiguous(send, "scatterv").reshape(-1), counts)
        self._copy(flat_out, pieces[root], stream)
        grouped_send_receive(self.nccl_comm, [(piece, rank) for rank, piece in enumerate(pieces) if rank != root], [],
                             _stream_pointer(stream))
        return out

    def alltoallv(self, send, send_counts, out, receive_counts, stream=None):
        send_counts = [int(c) for c in send_counts]
        receive_counts = [int(c) for c in receive_counts]
        check_counts("alltoallv", send.size, sum(send_counts), "send", "sum(send_counts)")
        check_counts("alltoallv", out.size, sum(receive_counts), "out", "sum(receive_counts)")
        sends = _split(require_contiguous(send, "alltoallv").reshape(-1), send_counts)
        receives = _split(require_contiguous(out, "alltoallv").reshape(-1), receive_counts)
        self._copy(receives[self.rank], sends[self.rank], stream)
        others = [rank for rank in range(self.size) if rank != self.rank]
        grouped_send_receive(self.nccl_comm, [(sends[r], r) for r in others], [(receives[r], r) for r in others],
                             _stream_pointer(stream))
        return out

    # ------------------------------------------------------------------ point to point
    def exchange(self, sends=(), receives=(), tag: int = 0, stream=None) -> _Queued:
        """One NCCL group of every receive and send on ``stream``; the handle's ``wait()`` does nothing
        (work queued later on the stream sees the received data). ``tag`` is ignored: NCCL matches in
        listing order, the rule every transport follows (:mod:`hpcgpu.transport.messages`)."""
        receives, sends = resolve_messages(receives), resolve_messages(sends)
        grouped_send_receive(self.nccl_comm, [_message(m.array, m.peer) for m in sends],
                             [_message(m.array, m.peer) for m in receives], _stream_pointer(stream))
        return _Queued()

    def send_receive(self, sends=(), receives=(), tag: int = 0, stream=None) -> None:
        """:meth:`exchange`: queued on the stream, nothing to wait for on the host."""
        self.exchange(sends, receives, tag, stream)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _copy(destination, source, stream) -> None:
        import cupy

        if destination.size:
            with cupy.cuda.ExternalStream(_stream_pointer(stream)):
                destination[...] = source


def _split(flat, counts):
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return [flat[offsets[i]: offsets[i + 1]] for i in range(len(counts))]


def _byte_scaled(array) -> tuple[int, int]:
    """(datatype, elements per array element) for moving ``array``'s elements: its own NCCL type, or
    bytes for a dtype NCCL does not know."""
    datatype, count = nccl_type_and_count(array)
    return datatype, (count // array.size if array.size else 1)


def _message(array, peer: int) -> NcclMessage:
    datatype, count = nccl_type_and_count(require_contiguous(array, "exchange"))
    return NcclMessage(_pointer(array), int(count), datatype, int(peer))

"""NCCL through ``cupy.cuda.nccl``: halo exchange and device collectives.

One NCCL communicator per :class:`~hpcgpu.Communicator`, created on first use: rank 0 makes the unique
id, MPI broadcasts it, and every rank joins (a collective: all ranks must get here together).

Halo exchange (:class:`NcclTransport`) never blocks the host:

1. record an event on the compute stream and make the communication stream wait for it (the fields
   hold this step's values from then on);
2. on the communication stream: pack, one NCCL group with every send and receive, unpack;
3. ``wait()`` makes the compute stream wait for an event recorded after the unpack.

Sends and receives to one peer are matched by NCCL in the order they are posted, so both are posted
in the fixed direction order of :func:`hpcgpu.halo.regions.directions` (see that module for why
this matches on both sides, even when one neighbour sits on both sides of a periodic axis).
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.runtime.capture import capture_graph
from hpcgpu.transport.events import exchange_event


def nccl_available() -> bool:
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception:
        return False
    return True


def nccl_version() -> str | None:
    """NCCL version as 'major.minor.patch', or None without NCCL."""
    try:
        from cupy.cuda import nccl

        code = nccl.get_version()
    except Exception:
        return None
    major, rest = divmod(code, 10000) if code >= 10000 else divmod(code, 1000)
    minor, patch = divmod(rest, 100) if code >= 10000 else divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


@functools.cache
def _nccl_types():
    from cupy.cuda import nccl

    return {
        np.dtype("float16"): nccl.NCCL_FLOAT16,
        np.dtype("float32"): nccl.NCCL_FLOAT32,
        np.dtype("float64"): nccl.NCCL_FLOAT64,
        np.dtype("int8"): nccl.NCCL_INT8,
        np.dtype("uint8"): nccl.NCCL_UINT8,
        np.dtype("int32"): nccl.NCCL_INT32,
        np.dtype("uint32"): nccl.NCCL_UINT32,
        np.dtype("int64"): nccl.NCCL_INT64,
        np.dtype("uint64"): nccl.NCCL_UINT64,
    }


def _type_and_count(array):
    """NCCL datatype and element count; unknown dtypes travel as bytes (point-to-point only)."""
    nccl_type = _nccl_types().get(np.dtype(array.dtype))
    if nccl_type is None:
        from cupy.cuda import nccl

        return nccl.NCCL_UINT8, array.nbytes
    return nccl_type, array.size


def nccl_communicator(comm):
    """The NCCL communicator of ``comm``, created on first call (collective)."""
    existing = comm.__dict__.get("_nccl")
    if existing is not None:
        return existing
    if not nccl_available():
        raise BackendError(
            "NCCL is not available through CuPy (cupy.cuda.nccl did not import). Install the extra with "
            "NCCL (pip install 'hpcgpu[cuda12]' or 'hpcgpu[cuda13]'), or set HPCGPU_TRANSPORT=mpi-staged."
        )
    from cupy.cuda import nccl

    unique_id = nccl.get_unique_id() if comm.rank == 0 else None
    unique_id = comm.mpi.bcast(unique_id, root=0)
    comm._nccl = nccl.NcclCommunicator(comm.size, unique_id, comm.rank)
    return comm._nccl


class _EventHandle:
    __slots__ = ("compute_stream", "done_event")

    def __init__(self, compute_stream, done_event):
        self.compute_stream, self.done_event = compute_stream, done_event

    def wait(self) -> None:
        self.compute_stream.wait_event(self.done_event)


class NcclTransport:
    """Halo exchange with NCCL send/recv on the communication stream."""

    name = "nccl"

    def __init__(self, nccl_comm):
        self.nccl_comm = nccl_comm

    def _operations(self, exchange):
        operations = exchange.__dict__.get("_nccl_operations")
        if operations is None:
            # Pointers, counts and types never change for a planned exchange: resolve them once.
            operations = exchange._nccl_operations = (
                [(m.buffer.data.ptr, *_type_and_count(m.buffer), m.peer) for m in exchange.recvs],
                [(m.buffer.data.ptr, *_type_and_count(m.buffer), m.peer) for m in exchange.sends],
            )
        return operations

    def _enqueue(self, exchange, stream) -> None:
        """Pack, one NCCL group of all receives and sends, unpack: all on ``stream`` (current)."""
        from cupy.cuda import nccl

        receives, sends = self._operations(exchange)
        exchange.pack()
        if receives or sends:
            nccl.groupStart()
            for pointer, nccl_type, count, peer in receives:
                self.nccl_comm.recv(pointer, count, nccl_type, peer, stream.ptr)
            for pointer, nccl_type, count, peer in sends:
                self.nccl_comm.send(pointer, count, nccl_type, peer, stream.ptr)
            nccl.groupEnd()
        exchange.unpack()

    def _graph(self, exchange, stream):
        graph = exchange.__dict__.get("_cuda_graph")
        if graph is None:
            with exchange.arch.on_stream(stream):
                graph = capture_graph(stream, lambda: self._enqueue(exchange, stream))
            exchange._cuda_graph = graph
        return graph

    def start(self, exchange):
        arch = exchange.arch
        stream = arch.comm_stream
        # The communication stream starts once the compute stream has produced this step's fields.
        stream.wait_event(exchange_event(exchange, "ready", arch.compute_stream))
        if exchange.graph and exchange.__dict__.get("_graph_warm"):
            self._graph(exchange, stream).launch(stream)
        elif exchange.needs_kernels:
            with arch.on_stream(stream):
                self._enqueue(exchange, stream)
        else:
            self._enqueue(exchange, stream)  # NCCL calls only: no CuPy work follows the current stream
        # The first exchange runs eagerly, so NCCL connects its peers and CuPy compiles its kernels
        # outside of any graph capture; later ones replay the captured graph.
        exchange._graph_warm = True
        return _EventHandle(arch.compute_stream, exchange_event(exchange, "done", stream))


_NCCL_OPS = {"sum": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}


class NcclCollectives:
    """allreduce / broadcast of CuPy arrays on the current stream."""

    name = "nccl"

    def __init__(self, comm):
        self.nccl_comm = nccl_communicator(comm)

    def allreduce(self, array, op: str):
        import cupy
        from cupy.cuda import nccl

        send = cupy.ascontiguousarray(array)
        result = cupy.empty_like(send)
        nccl_type = _nccl_types().get(np.dtype(send.dtype))
        if nccl_type is None:
            raise BackendError(f"NCCL cannot reduce dtype {send.dtype}; use float16/32/64 or an integer type")
        stream = cupy.cuda.get_current_stream()
        self.nccl_comm.allReduce(send.data.ptr, result.data.ptr, send.size, nccl_type, getattr(nccl, _NCCL_OPS[op]), stream.ptr)
        return result

    def broadcast(self, array, root: int):
        import cupy

        if not array.flags.c_contiguous:
            raise BackendError("broadcast of a CuPy array needs a C-contiguous array (it is filled in place)")
        nccl_type, count = _type_and_count(array)
        stream = cupy.cuda.get_current_stream()
        self.nccl_comm.bcast(array.data.ptr, count, nccl_type, root, stream.ptr)
        return array

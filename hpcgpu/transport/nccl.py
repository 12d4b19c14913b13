"""NCCL through ``cupy.cuda.nccl``: the communicator, grouped point-to-point messages and the halo exchange.

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
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.runtime.capture import capture_graph
from hpcgpu.transport.events import EventHandle, exchange_event
from hpcgpu.transport.job import job_transport


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
def _datatypes() -> dict:
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


def nccl_datatype(dtype) -> int:
    """The NCCL datatype (``cupy.cuda.nccl.NCCL_*``) of a NumPy dtype, for collectives.

    Raises
    ------
    BackendError
        For a dtype NCCL does not reduce (anything but float16/32/64 and 8/32/64-bit integers).
    """
    datatype = _datatypes().get(np.dtype(dtype))
    if datatype is None:
        raise BackendError(f"NCCL cannot reduce dtype {np.dtype(dtype)}; use float16/32/64 or an integer type")
    return datatype


def nccl_type_and_count(array) -> tuple[int, int]:
    """NCCL datatype and element count of a contiguous device array, for point-to-point messages.

    A dtype NCCL does not know travels as its bytes (``NCCL_UINT8``, ``array.nbytes`` elements):
    send/recv copy bits, so that is exact.
    """
    datatype = _datatypes().get(np.dtype(array.dtype))
    if datatype is None:
        from cupy.cuda import nccl

        return nccl.NCCL_UINT8, array.nbytes
    return datatype, array.size


@dataclass(frozen=True)
class NcclMessage:
    """One point-to-point message resolved to what NCCL takes: a device address, an element count and
    datatype, and the peer rank. Resolve a planned exchange's messages once (:func:`nccl_message`)."""

    pointer: int
    count: int
    datatype: int
    peer: int


def nccl_message(array, peer: int) -> NcclMessage:
    """The :class:`NcclMessage` of a C-contiguous device array sent to (or received from) ``peer``.

    The array must stay alive (and in place) as long as the message is used."""
    if not array.flags.c_contiguous:
        raise BackendError(f"an NCCL message needs a C-contiguous array, found shape {tuple(array.shape)} with "
                           f"strides {tuple(array.strides)}; pass a contiguous slice or copy it first")
    datatype, count = nccl_type_and_count(array)
    return NcclMessage(int(array.data.ptr), int(count), datatype, int(peer))


def grouped_send_receive(nccl_comm, sends, receives, stream) -> None:
    """Queue one NCCL group of point-to-point messages on ``stream``; returns None (nothing waits).

    Parameters
    ----------
    nccl_comm : cupy.cuda.nccl.NcclCommunicator
        From :func:`nccl_communicator`.
    sends, receives : sequence of (array, peer) pairs or :class:`NcclMessage`
        Contiguous device arrays (any dtype: see :func:`nccl_type_and_count`) and the rank each goes to
        or comes from. Empty messages are skipped (on both sides alike: the sizes must match).
    stream : cupy.cuda.Stream or int
        The stream (or its raw handle) the group runs on; the caller orders it after the kernels that
        wrote the sends and before those that read the receives.

    Notes
    -----
    NCCL matches the messages between two ranks in posting order, separately for each direction: the
    k-th send from rank a to rank b meets the k-th receive on b from a. Both sides must therefore list
    the messages to one peer in the same order (for example a fixed order of directions, which also
    covers one neighbour sitting on both sides of a periodic axis). Receives are posted before sends;
    inside one group that order does not matter to NCCL.
    """
    from cupy.cuda import nccl

    stream_pointer = stream if isinstance(stream, int) else stream.ptr
    receives = [m if isinstance(m, NcclMessage) else nccl_message(*m) for m in receives]
    sends = [m if isinstance(m, NcclMessage) else nccl_message(*m) for m in sends]
    if not receives and not sends:
        return
    nccl.groupStart()
    try:
        for m in receives:
            if m.count:
                nccl_comm.recv(m.pointer, m.count, m.datatype, m.peer, stream_pointer)
        for m in sends:
            if m.count:
                nccl_comm.send(m.pointer, m.count, m.datatype, m.peer, stream_pointer)
    finally:
        nccl.groupEnd()


def nccl_communicator(comm):
    """The NCCL communicator of ``comm``, created on first call (collective) and kept in
    the communicator's :class:`~hpcgpu.transport.job.JobTransport`.

    Raises
    ------
    BackendError
        When CuPy has no NCCL.
    """
    job = job_transport(comm)
    if job.nccl_communicator is not None:
        return job.nccl_communicator
    if not nccl_available():
        raise BackendError(
            "NCCL is not available through CuPy (cupy.cuda.nccl did not import). Install the extra with "
            "NCCL (pip install 'hpcgpu[cuda12]' or 'hpcgpu[cuda13]'), or set HPCGPU_TRANSPORT=mpi-staged."
        )
    from cupy.cuda import nccl

    unique_id = nccl.get_unique_id() if comm.rank == 0 else None
    unique_id = comm.mpi.bcast(unique_id, root=0)
    job.nccl_communicator = nccl.NcclCommunicator(comm.size, unique_id, comm.rank)
    return job.nccl_communicator


def has_nccl_communicator(comm) -> bool:
    """Whether ``comm``'s NCCL communicator exists already (settings read at its creation come too late)."""
    return job_transport(comm).nccl_communicator is not None


class NcclTransport:
    """Halo exchange with NCCL send/recv on the communication stream."""

    name = "nccl"

    def __init__(self, nccl_comm):
        self.nccl_comm = nccl_comm

    def _enqueue(self, exchange, stream) -> None:
        """Pack, one NCCL group of all receives and sends, unpack: all on ``stream`` (current)."""
        state = exchange.transport_state
        if state.nccl_messages is None:
            # Pointers, counts and types never change for a planned exchange: resolve them once.
            state.nccl_messages = ([nccl_message(m.buffer, m.peer) for m in exchange.recvs],
                                   [nccl_message(m.buffer, m.peer) for m in exchange.sends])
        receives, sends = state.nccl_messages
        exchange.pack()
        grouped_send_receive(self.nccl_comm, sends, receives, stream)
        exchange.unpack()

    def _graph(self, exchange, stream):
        state = exchange.transport_state
        if state.cuda_graph is None:
            with exchange.arch.on_stream(stream):
                state.cuda_graph = capture_graph(stream, lambda: self._enqueue(exchange, stream))
        return state.cuda_graph

    def start(self, exchange):
        arch = exchange.arch
        stream = arch.comm_stream
        # The communication stream starts once the compute stream has produced this step's fields.
        stream.wait_event(exchange_event(exchange, "ready", arch.compute_stream))
        state = exchange.transport_state
        if exchange.graph and state.graph_warm:
            self._graph(exchange, stream).launch(stream)
        elif exchange.needs_kernels:
            with arch.on_stream(stream):
                self._enqueue(exchange, stream)
        else:
            self._enqueue(exchange, stream)  # NCCL calls only: no CuPy work follows the current stream
        # The first exchange runs eagerly, so NCCL connects its peers and CuPy compiles its kernels
        # outside of any graph capture; later ones replay the captured graph.
        state.graph_warm = True
        return EventHandle(arch.compute_stream, exchange_event(exchange, "done", stream))

"""Collectives and paired messages on CuPy arrays through MPI (transports ``mpi-staged`` and ``mpi-cuda``).

MPI knows nothing of CUDA streams. Every operation therefore first synchronises the stream that wrote
its inputs (the ``stream`` argument, else the current stream), then hands MPI either the device arrays
themselves (``mpi-cuda``: the MPI library must be CUDA-aware) or pinned host copies (``mpi-staged``),
and finally copies results back to the device on that stream. The host side is
:class:`~hpcgpu.transport.host_collectives.HostCollectives`, so the reductions are bitwise those of the
CPU transport. Nothing here can sit inside a CUDA graph (``capturable`` is False).

Pinned host buffers are kept per size and reused; the operations of one object must therefore be
called from one host thread, on one stream at a time (as every app does).
"""

from __future__ import annotations

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.transport.collectives_base import CommunicatorCollectives
from hpcgpu.transport.host_collectives import HostCollectives
from hpcgpu.transport.messages import Message, resolve_messages


def _stream(stream):
    import cupy

    if stream is None:
        return cupy.cuda.get_current_stream()
    return cupy.cuda.ExternalStream(stream) if isinstance(stream, int) else stream


def _check_element_type(element_type) -> None:
    if element_type is not None:
        raise BackendError(f"MPI cannot reduce element type {element_type!r} (it has no such arithmetic); reduce a "
                           "float32 copy instead, or use the nccl transport")


class MpiDeviceCollectives(CommunicatorCollectives):
    """MPI collectives of one communicator on CuPy arrays, staged through pinned host memory or on
    device pointers.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    staged : bool
        True: copy through pinned host buffers (``mpi-staged``, works with every MPI library). False:
        give MPI the device arrays (``mpi-cuda``; the library must be CUDA-aware).
    """

    capturable = False
    on_device = True

    def __init__(self, comm, staged: bool = True):
        super().__init__(comm)
        self.staged = staged
        self.name = "mpi-staged" if staged else "mpi-cuda"
        self.host = HostCollectives(comm)
        self._pinned: dict = {}

    # ------------------------------------------------------------------ staging
    def _buffer(self, slot, array):
        """A pinned host array of ``array``'s shape and dtype: the front of one pinned buffer kept for
        ``slot`` and dtype, grown when too small (messages whose sizes change, such as particle rows,
        reuse it instead of pinning new memory for every size)."""
        key = (slot, np.dtype(array.dtype).str)
        buffer = self._pinned.get(key)
        if buffer is None or buffer.size < array.size:
            import cupyx

            buffer = self._pinned[key] = cupyx.empty_pinned(max(int(array.size), 1), dtype=array.dtype)
        return buffer[:array.size].reshape(array.shape)

    def _outbound(self, slot, array, stream):
        """What MPI reads for ``array``: the array itself, or (staged) a pinned copy queued on ``stream``
        (the caller synchronises the stream before MPI reads it)."""
        if not self.staged:
            return array
        host = self._buffer(slot, array)
        array.get(stream=stream, out=host)
        return host

    def _inbound(self, slot, array):
        """Where MPI writes for ``array``: a pinned buffer (staged) or the array itself."""
        return self._buffer(slot, array) if self.staged else array

    def _land(self, host, array, stream) -> None:
        """Copy what MPI wrote into ``host`` to ``array`` on ``stream`` (staged only)."""
        if self.staged and array.size:
            array.set(host, stream=stream)

    def _run(self, operation, send, out, stream, *args, **kwargs):
        """Synchronise, stage ``send``, run the host ``operation`` into ``out``'s buffer, land ``out``."""
        stream = _stream(stream)
        stream.synchronize()   # MPI reads device memory outside any stream: the producers must be done
        host_send = self._outbound("send", send, stream) if send is not None else None
        host_out = self._inbound("out", out) if out is not None else None
        if self.staged:
            stream.synchronize()   # the device -> host copy of the send buffer has landed
        result = operation(host_send, host_out, *args, **kwargs)
        if out is not None and result is not None:
            self._land(host_out, out, stream)
            return out
        return None

    # ------------------------------------------------------------------ reductions
    def allreduce(self, send, out=None, op: str = "sum", stream=None, element_type: str | None = None):
        import cupy

        _check_element_type(element_type)
        if out is None:
            out = cupy.empty_like(send)
        if out is send and not self.staged:
            stream = _stream(stream)
            stream.synchronize()
            return self.host.allreduce(out, out, op)
        return self._run(lambda s, o: self.host.allreduce(s, o, op), send, out, stream)

    def reduce_scatter(self, send, out, op: str = "sum", stream=None, element_type: str | None = None):
        _check_element_type(element_type)
        return self._run(lambda s, o: self.host.reduce_scatter(s, o, op), send, out, stream)

    # ------------------------------------------------------------------ data movement
    def allgather(self, send, out, stream=None):
        return self._run(self.host.allgather, send, out, stream)

    def allgatherv(self, send, out, counts, stream=None):
        return self._run(lambda s, o: self.host.allgatherv(s, o, counts), send, out, stream)

    def broadcast(self, array, root: int = 0, stream=None):
        stream = _stream(stream)
        stream.synchronize()
        if not self.staged:
            self.host.broadcast(array, root)
            return array
        host = self._outbound("send", array, stream) if self.rank == root else self._inbound("send", array)
        self.host.broadcast(host, root)
        if self.rank != root:
            self._land(host, array, stream)
        return array

    def gatherv(self, send, out, counts, root: int = 0, stream=None):
        if self.rank != root:
            return self._run(lambda s, o: self.host.gatherv(s, None, counts, root), send, None, stream)
        return self._run(lambda s, o: self.host.gatherv(s, o, counts, root), send, out, stream)

    def scatterv(self, send, out, counts, root: int = 0, stream=None):
        if self.rank != root:
            return self._run(lambda s, o: self.host.scatterv(None, o, counts, root), None, out, stream)
        return self._run(lambda s, o: self.host.scatterv(s, o, counts, root), send, out, stream)

    def alltoallv(self, send, send_counts, out, receive_counts, stream=None):
        return self._run(lambda s, o: self.host.alltoallv(s, send_counts, o, receive_counts), send, out, stream)

    # ------------------------------------------------------------------ point to point
    def exchange(self, sends=(), receives=(), tag: int = 0, stream=None):
        """Synchronise the stream, post every receive and send through MPI, and return the handle whose
        ``wait()`` completes them and copies the received data to the device on the stream."""
        stream = _stream(stream)
        receives, sends = resolve_messages(receives), resolve_messages(sends)
        stream.synchronize()
        host_sends = [Message(self._outbound(("send", k), m.array, stream), m.peer) for k, m in enumerate(sends)]
        host_receives = [Message(self._inbound(("receive", k), m.array), m.peer) for k, m in enumerate(receives)]
        if self.staged and sends:
            stream.synchronize()
        handle = self.host.exchange(host_sends, host_receives, tag)

        def land():
            for host, m in zip(host_receives, receives):
                self._land(host.array, m.array, stream)

        handle.after = land
        return handle

    def send_receive(self, sends=(), receives=(), tag: int = 0, stream=None) -> None:
        """:meth:`exchange` and wait (the received data is queued for the device on the stream)."""
        self.exchange(sends, receives, tag, stream).wait()

    # ------------------------------------------------------------------ MPI-only operations
    def reduce_scatterv(self, send, out, counts, op: str = "sum", stream=None, element_type: str | None = None):
        """:meth:`HostCollectives.reduce_scatterv <hpcgpu.transport.host_collectives.HostCollectives.reduce_scatterv>`
        on device buffers (``MPI_Reduce_scatter``; NCCL has none). ``out`` must not overlap ``send``."""
        _check_element_type(element_type)
        return self._run(lambda s, o: self.host.reduce_scatterv(s, o, counts, op), send, out, stream)

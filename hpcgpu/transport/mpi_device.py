"""Halo messages of CuPy arrays through MPI: CUDA-aware (device pointers) or staged through pinned host memory.

MPI knows nothing about CUDA streams, so before MPI touches a buffer written by a kernel the stream
that wrote it is synchronised. (Handing a device pointer to an MPI library that is *not* CUDA-aware
crashes it; :func:`mpi_is_cuda_aware` asks the library itself, never parses another program's output.)
"""

from __future__ import annotations

import ctypes
import os

from hpcgpu.transport.events import exchange_event


def mpi_is_cuda_aware() -> bool:
    """Whether the loaded MPI library says it supports CUDA device buffers.

    ``HPCGPU_CUDA_AWARE_MPI=0/1`` overrides. Otherwise Open MPI's ``MPIX_Query_cuda_support()`` or
    MPICH's ``MPIX_GPU_query_support(CUDA)`` is called when the library exports it; else False.
    """
    override = os.environ.get("HPCGPU_CUDA_AWARE_MPI", "")
    if override:
        return override not in ("0", "false", "no")
    from mpi4py import MPI  # noqa: F401  (loads the MPI library)

    for library in _loaded_mpi_libraries():
        query = getattr(library, "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            return bool(query())
        query = getattr(library, "MPIX_GPU_query_support", None)
        if query is not None:
            supported = ctypes.c_int(0)
            mpix_gpu_support_cuda = 0
            if query(mpix_gpu_support_cuda, ctypes.byref(supported)) == 0:
                return bool(supported.value)
    return False


def _loaded_mpi_libraries():
    yield ctypes.CDLL(None)
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and ".so" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue


class _DeviceMpiHandle:
    def __init__(self, transport, exchange, requests):
        self.transport, self.exchange, self.requests = transport, exchange, requests

    def wait(self) -> None:
        from mpi4py import MPI

        MPI.Request.Waitall(self.requests)
        arch = self.exchange.arch
        stream = arch.comm_stream
        with arch.on_stream(stream):
            self.transport._after_receive(self.exchange)
            self.exchange.unpack()
        arch.compute_stream.wait_event(exchange_event(self.exchange, 'done', stream))


class CudaAwareMpiTransport:
    """MPI with device pointers (the MPI library must be CUDA-aware)."""

    name = "mpi-cuda"

    def __init__(self, comm):
        self.comm = comm

    def start(self, exchange):
        arch, mpi = exchange.arch, self.comm.mpi
        stream = arch.comm_stream
        stream.wait_event(exchange_event(exchange, "ready", arch.compute_stream))
        with arch.on_stream(stream):
            exchange.pack()
        stream.synchronize()  # MPI reads device memory outside any stream: the packing must be done
        requests = [mpi.Irecv(m.buffer, source=m.peer, tag=m.tag) for m in exchange.recvs]
        requests += [mpi.Isend(m.buffer, dest=m.peer, tag=m.tag) for m in exchange.sends]
        return _DeviceMpiHandle(self, exchange, requests)

    def _after_receive(self, exchange) -> None:
        """Received data is already in device memory."""


class StagedMpiTransport:
    """Device -> pinned host -> MPI -> pinned host -> device."""

    name = "mpi-staged"

    def __init__(self, comm):
        self.comm = comm

    def _staging(self, exchange):
        staging = exchange.transport_state.staging
        if staging is None:
            import cupyx

            def pinned(messages):
                return [cupyx.empty_pinned(m.buffer.shape, dtype=m.buffer.dtype) for m in messages]

            staging = exchange.transport_state.staging = (pinned(exchange.sends), pinned(exchange.recvs))
        return staging

    def start(self, exchange):
        arch, mpi = exchange.arch, self.comm.mpi
        host_send, host_recv = self._staging(exchange)
        stream = arch.comm_stream
        stream.wait_event(exchange_event(exchange, "ready", arch.compute_stream))
        with arch.on_stream(stream):
            exchange.pack()
            for m, host in zip(exchange.sends, host_send):
                m.buffer.get(stream=stream, out=host)
        stream.synchronize()  # the device -> host copies must have landed before MPI reads them
        requests = [mpi.Irecv(host, source=m.peer, tag=m.tag) for m, host in zip(exchange.recvs, host_recv)]
        requests += [mpi.Isend(host, dest=m.peer, tag=m.tag) for m, host in zip(exchange.sends, host_send)]
        return _DeviceMpiHandle(self, exchange, requests)

    def _after_receive(self, exchange) -> None:
        stream = exchange.arch.comm_stream
        for m, host in zip(exchange.recvs, self._staging(exchange)[1]):
            m.buffer.set(host, stream=stream)

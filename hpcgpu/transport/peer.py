"""Halo messages between GPUs of one node by direct peer copies (CUDA IPC), with device-side flags.

NCCL moves a halo message with a kernel that occupies SMs for the whole transfer, so the interior
update it overlaps with runs a few percent slower. On one node the copy engines can do the work
instead: every receive buffer (a field's ghost rows, or the packed receive buffer) is mapped into the
sending process with CUDA IPC, and the sender copies its message straight into it over NVLink.

Synchronisation is a rendezvous of two 32-bit counters per message, written by a one-warp kernel
into the *other* GPU's memory and waited for by a one-warp kernel on the waiting GPU; nothing runs on
the host. For exchange number ``n`` of a planned exchange, on the communication stream::

    receiver: after the compute stream's "ready" event     -> clear_to_send[message] = n   (on the sender)
    sender:   wait clear_to_send[message] >= n              (the receiver no longer reads the old ghosts)
    sender:   pack, copy into the receiver's buffer, then   -> arrived[message] = n         (on the receiver)
    receiver: wait arrived[message] >= n, unpack, record "done" for the compute stream

Every rank runs the same sequence of exchanges (SPMD), so the waits never form a cycle. The counters
are baked into the launches, so an exchange cannot be replayed from a CUDA graph (``capturable`` is
False; the stencil app then steps eagerly). Usable only when all ranks are on one node and every GPU
can map the others' memory: :func:`peer_transport_usable` checks this collectively.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from hpcgpu.errors import BackendError
from hpcgpu.transport.events import exchange_event

_FLAG_SOURCE = r"""
extern "C" __global__ void hpcgpu_peer_signal(const unsigned long long* addresses, int n, unsigned int value) {
    // Earlier copies on this stream have completed; make sure the peer sees their data first.
    __threadfence_system();
    int i = threadIdx.x;
    if (i < n) {
        *(volatile unsigned int*)addresses[i] = value;
    }
}

extern "C" __global__ void hpcgpu_peer_wait(const unsigned int* flags, int n, unsigned int value) {
    int i = threadIdx.x;
    if (i < n) {
        volatile const unsigned int* flag = flags + i;
        while (*flag < value) {
            __nanosleep(256);
        }
    }
    __syncthreads();
    __threadfence_system();
}
"""


@functools.cache
def _flag_kernels():
    import cupy

    module = cupy.RawModule(code=_FLAG_SOURCE, options=("-std=c++17",))
    return module.get_function("hpcgpu_peer_signal"), module.get_function("hpcgpu_peer_wait")


@functools.cache
def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise BackendError(f"the peer transport needs the CUDA driver library libcuda.so.1: {error}") from None


def allocation_of(pointer: int) -> tuple[int, int]:
    """``(base, size)`` of the device allocation that contains ``pointer`` (CuPy pools sub-allocate)."""
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = _libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
    if status != 0:
        raise BackendError(f"cuMemGetAddressRange failed with CUDA error {status} for pointer {pointer:#x}")
    return base.value, size.value


class _Exported:
    """What a rank tells a peer about one of its buffers: IPC handle of the allocation plus an offset."""

    @staticmethod
    def describe(pointer: int) -> tuple[bytes, int]:
        import cupy

        base, _ = allocation_of(pointer)
        return bytes(cupy.cuda.runtime.ipcGetMemHandle(base)), pointer - base


class PeerTransport:
    """Halo exchange by CUDA IPC peer copies and device-side counters (module docstring)."""

    name = "peer"
    capturable = False

    def __init__(self, comm):
        self.comm = comm
        self._opened = {}   # IPC handle bytes -> base pointer in this process (a handle opens once)

    # ------------------------------------------------------------------ setup (collective, once per plan)
    def _open(self, handle: bytes, offset: int) -> int:
        import cupy

        base = self._opened.get(handle)
        if base is None:
            base = self._opened[handle] = int(cupy.cuda.runtime.ipcOpenMemHandle(handle))
        return base + offset

    def _plan(self, exchange):
        """Map the peers' receive buffers and counters (collective over the communicator)."""
        import cupy

        plan = exchange.__dict__.get("_peer_plan")
        if plan is not None:
            return plan
        n_sends, n_recvs = len(exchange.sends), len(exchange.recvs)
        if max(n_sends, n_recvs) > 32:
            raise BackendError(f"peer transport: {max(n_sends, n_recvs)} messages per exchange, at most 32 supported")
        # Counters in this GPU's memory: clear-to-send for each send, arrived for each receive.
        flags = cupy.zeros(max(n_sends + n_recvs, 1), dtype=cupy.uint32)
        flags_handle = _Exported.describe(flags.data.ptr)
        outgoing = [[] for _ in range(self.comm.size)]
        for number, message in enumerate(exchange.sends):
            outgoing[message.peer].append(("send", message.tag, flags_handle, 4 * number))
        for number, message in enumerate(exchange.recvs):
            buffer_handle = _Exported.describe(message.buffer.data.ptr)
            outgoing[message.peer].append(("recv", message.tag, buffer_handle, message.buffer.nbytes,
                                           flags_handle, 4 * (n_sends + number)))
        incoming = self.comm.mpi.alltoall(outgoing)
        by_tag = {}
        for peer, entries in enumerate(incoming):
            for entry in entries:
                by_tag[(peer, entry[0], entry[1])] = entry
        copies, arrived_addresses, cts_addresses = [], [], []
        for message in exchange.sends:
            entry = by_tag.get((message.peer, "recv", message.tag))
            if entry is None or entry[3] != message.buffer.nbytes:
                raise BackendError(f"peer transport: rank {message.peer} posted no matching receive of "
                                   f"{message.buffer.nbytes} bytes for message tag {message.tag}")
            _, _, (buffer_handle, buffer_offset), nbytes, (flags_handle, flags_offset), slot = entry
            copies.append((self._open(buffer_handle, buffer_offset), message.buffer.data.ptr, nbytes))
            arrived_addresses.append(self._open(flags_handle, flags_offset + slot))
        for message in exchange.recvs:
            entry = by_tag.get((message.peer, "send", message.tag))
            if entry is None:
                raise BackendError(f"peer transport: rank {message.peer} posted no matching send for tag {message.tag}")
            _, _, (flags_handle, flags_offset), slot = entry
            cts_addresses.append(self._open(flags_handle, flags_offset + slot))
        plan = exchange._peer_plan = _PeerPlan(
            flags=flags, n_sends=n_sends, copies=copies,
            arrived=cupy.asarray(np.array(arrived_addresses, dtype=np.uint64)),
            clear_to_send=cupy.asarray(np.array(cts_addresses, dtype=np.uint64)))
        self.comm.barrier()   # every mapping is open before anyone signals
        return plan

    # ------------------------------------------------------------------ running
    def start(self, exchange):
        import cupy

        arch = exchange.arch
        stream = arch.comm_stream
        if stream.is_capturing():
            raise BackendError("the peer transport cannot be captured in a CUDA graph (its counters change "
                               "every exchange); step eagerly or use HPCGPU_TRANSPORT=nccl")
        plan = self._plan(exchange)
        signal, wait = _flag_kernels()
        plan.count += 1
        value = np.uint32(plan.count & 0xFFFFFFFF)
        stream.wait_event(exchange_event(exchange, "ready", arch.compute_stream))
        with arch.on_stream(stream):
            exchange.pack()
            if len(plan.clear_to_send):   # our old ghosts are no longer read: peers may overwrite them
                signal((1,), (32,), (plan.clear_to_send, np.int32(len(plan.clear_to_send)), value))
            if plan.n_sends:
                wait((1,), (32,), (plan.flags, np.int32(plan.n_sends), value))
                for remote, local, nbytes in plan.copies:
                    cupy.cuda.runtime.memcpyAsync(remote, local, nbytes, cupy.cuda.runtime.memcpyDefault, stream.ptr)
                signal((1,), (32,), (plan.arrived, np.int32(len(plan.arrived)), value))
            if len(plan.clear_to_send):
                wait((1,), (32,), (plan.arrived_flags, np.int32(len(plan.clear_to_send)), value))
            exchange.unpack()
        return _Done(arch.compute_stream, exchange_event(exchange, "done", stream))


class _PeerPlan:
    __slots__ = ("flags", "arrived_flags", "n_sends", "copies", "arrived", "clear_to_send", "count")

    def __init__(self, flags, n_sends, copies, arrived, clear_to_send):
        self.flags, self.n_sends, self.copies = flags, n_sends, copies
        self.arrived_flags = flags[n_sends:]   # this rank's "arrived" counters, one per receive
        self.arrived, self.clear_to_send, self.count = arrived, clear_to_send, 0


class _Done:
    __slots__ = ("compute_stream", "event")

    def __init__(self, compute_stream, event):
        self.compute_stream, self.event = compute_stream, event

    def wait(self) -> None:
        self.compute_stream.wait_event(self.event)


def peer_transport_usable(comm) -> tuple[bool, str]:
    """Collective: whether every rank can map every other rank's GPU memory (one node, P2P access).

    Each rank exports a small buffer, opens those of all others and writes into them; the answer is
    the same on every rank. Returns ``(usable, reason)``.
    """
    import cupy

    if comm.size == 1:
        return False, "one rank: no peers"
    if comm.n_nodes != 1:
        return False, f"{comm.n_nodes} nodes: CUDA IPC reaches only GPUs of one node"
    reason = ""
    probe = cupy.zeros(comm.size, dtype=cupy.uint32)
    try:
        mine = _Exported.describe(probe.data.ptr)
    except Exception as error:  # noqa: BLE001 - reported, agreed on below
        mine, reason = None, f"rank {comm.rank}: cannot export device memory: {error}"
    handles = comm.mpi.allgather(mine)
    opened = []
    if not reason and all(h is not None for h in handles):
        try:
            for rank, (handle, offset) in enumerate(handles):
                if rank != comm.rank:
                    base = int(cupy.cuda.runtime.ipcOpenMemHandle(handle))
                    opened.append(base)
                    cupy.cuda.runtime.memcpy(base + offset + 4 * comm.rank, probe.data.ptr + 4 * comm.rank, 4,
                                             cupy.cuda.runtime.memcpyDeviceToDevice)
        except Exception as error:  # noqa: BLE001
            reason = f"rank {comm.rank}: cannot map a peer's memory: {error}"
    elif not reason:
        reason = "a rank could not export its memory"
    cupy.cuda.Device().synchronize()
    comm.barrier()
    for base in opened:
        cupy.cuda.runtime.ipcCloseMemHandle(base)
    reasons = [r for r in comm.mpi.allgather(reason) if r]
    return (not reasons), ("; ".join(reasons) if reasons else "all ranks on one node map each other's memory")

"""Peer memory: neighbours' GPU buffers mapped into this process (CUDA IPC), and flags to order the stores.

A *peer window* is a set of a neighbour's device buffers that this rank reads or writes directly, over
NVLink / PCIe, from its own kernels and copies. Setting one up is the same three steps for every user
(the stencil's peer rows, the training's copy-engine bucket sums, the MD slab exchange)::

    exported = export_addresses({"rows": ghost_rows.data.ptr, "flag": flags.data.ptr})  # my buffers
    everyone = comm.mpi.allgather({"window": exported, "rows": n_rows})                 # handles by MPI
    peer = open_addresses(everyone[neighbour]["window"])   # {"rows": address here, "flag": ...}
    ...                                                    # zero the flags, then:
    ready_for_peer_stores(comm)                            # every mapping open before anyone stores

:func:`on_every_rank` runs a step that may fail on one rank only (a GPU a rank cannot reach) and turns
the failure into the same :class:`PeerAccessError` on every rank, so no rank waits in a collective for a
rank that already gave up. Handles stay open for the life of the process
(:mod:`hpcgpu.transport.cuda_ipc`: one allocation may be opened once per process, and several windows
share pool allocations); :func:`close_peer_mappings` closes them all once nothing uses them any more.

Ordering the stores: a writer stores into the peer's memory, then *signals* -- a
``__threadfence_system()`` followed by a volatile store of a 64-bit value into a flag in the peer's
memory; the reader *waits* -- one warp spins with volatile loads (and ``__nanosleep``) until each flag
has reached the value, then ``__syncthreads(); __threadfence_system()`` before the kernels that read the
data. :func:`signal_flag` and :func:`wait_flags` queue these two kernels (defined once, here) on the
current stream, with the value passed from the host (an epoch). Protocols whose counters live on the
device (so that their steps can be captured as CUDA graphs) fuse the signal into their own kernels:
``apps.stencil.peer_rows`` (rows + counter in one kernel), ``apps.md.resident_slab_kernels`` (signals
only on rebuild steps, waits with a time-out); they use the window set-up here.

CuPy is imported inside the functions: importing this module needs no GPU.
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.runtime.abort import replicated
from hpcgpu.transport.cuda_ipc import PeerAccessError, export_pointer, open_peer_pointer, opened_mappings, \
    pointer_arg

__all__ = ["PeerAccessError", "close_peer_mappings", "export_addresses", "flag_kernels", "on_every_rank",
           "open_addresses", "pointer_arg", "ready_for_peer_stores", "signal_flag", "wait_flags"]

_FLAG_SOURCE = r"""
// Publish `value` into a flag in the peer's memory; everything this stream wrote before
// (the copy-engine copy or kernel that precedes this kernel) is complete, the fence orders the store.
extern "C" __global__ void peer_memory_signal(unsigned long long* flag, unsigned long long value) {
    __threadfence_system();
    *(volatile unsigned long long*)flag = value;
}

// One warp: wait until every flags[i] (i < n_flags, in this GPU's memory, written by the
// peer) has reached `value`.
extern "C" __global__ void peer_memory_wait(const unsigned long long* flags, int n_flags,
                                            unsigned long long value) {
    for (int i = threadIdx.x; i < n_flags; i += blockDim.x) {
        const volatile unsigned long long* flag = flags + i;
        while (*flag < value) {
            __nanosleep(128);
        }
    }
    __syncthreads();
    __threadfence_system();
}
"""

#: Bytes of one flag (``unsigned long long``; allocate flags as ``cupy.uint64``).
FLAG_BYTES = 8
#: Threads of the wait kernel (one warp).
WAIT_THREADS = 32


@functools.cache
def flag_kernels():
    """``(signal, wait)``: the flag kernels, compiled and loaded once per process.

    Call it (or launch each kernel once) before the first wait spins on the device or a stream
    captures: lazy module loading must not happen then."""
    import cupy

    module = cupy.RawModule(code=_FLAG_SOURCE)
    return module.get_function("peer_memory_signal"), module.get_function("peer_memory_wait")


def signal_flag(flag, value: int) -> None:
    """Queue on the current stream: fence, then store ``value`` into the flag at ``flag``; returns None.

    Parameters
    ----------
    flag : int or cupy.ndarray
        A device address (usually in a peer's memory, from :func:`open_addresses`) or a uint64 array
        whose first element is the flag.
    value : int
        The value published (an epoch: increasing, so a wait for ``>= value`` is never satisfied early).
    """
    signal, _ = flag_kernels()
    signal((1,), (1,), (pointer_arg(flag) if isinstance(flag, int) else flag, np.uint64(value)))


def wait_flags(flags, n_flags: int, value: int) -> None:
    """Queue on the current stream: one warp spins until each of the ``n_flags`` consecutive uint64 flags
    at ``flags`` (this GPU's memory, written by peers) is ``>= value``; returns None.

    Everything queued after it on the stream sees what the peers stored before their signals.
    """
    _, wait = flag_kernels()
    wait((1,), (WAIT_THREADS,), (pointer_arg(flags) if isinstance(flags, int) else flags, np.int32(n_flags),
                                 np.uint64(value)))


def export_addresses(addresses: dict) -> dict:
    """``{name: (IPC handle, offset)}`` for ``{name: device address}``: plain bytes and ints, which travel
    by MPI (:func:`hpcgpu.transport.cuda_ipc.export_pointer`)."""
    return {name: export_pointer(int(address)) for name, address in addresses.items()}


def open_addresses(exported: dict) -> dict:
    """``{name: address in this process}`` for a peer's :func:`export_addresses` record.

    Raises
    ------
    PeerAccessError
        When the peer's GPU is not reachable from this process.
    """
    return {name: open_peer_pointer(value) for name, value in exported.items()}


def on_every_rank(comm, work_fn) -> list:
    """Collective: run ``work_fn()`` here, then agree.

    Returns
    -------
    list
        Every rank's result, by rank, on every rank.

    Raises
    ------
    PeerAccessError
        On every rank alike when ``work_fn`` raised on any rank; the message names the first failing
        rank (``"rank r: Type: message"``). A RuntimeError too, so callers that fall back on a failed
        mapping keep doing so.
    """
    try:
        result, failure = work_fn(), ""
    except Exception as error:   # noqa: BLE001 -- reported on every rank below
        result, failure = None, f"rank {comm.rank}: {type(error).__name__}: {error}"
    everyone = comm.mpi.allgather((result, failure))
    failures = [f for _, f in everyone if f]
    if failures:
        raise replicated(PeerAccessError(failures[0]))
    return [r for r, _ in everyone]


def ready_for_peer_stores(comm) -> None:
    """Collective: wait until this device is idle (flags zeroed, buffers allocated), then for every rank.

    After it, every mapping is open and every flag initialised on every rank: peers may store."""
    import cupy

    cupy.cuda.Device().synchronize()
    comm.barrier()


def close_peer_mappings() -> int:
    """Close every peer allocation this process opened; returns how many. Only when no kernel, copy or
    captured graph uses a mapped address any more (the next :func:`open_addresses` maps afresh)."""
    import cupy

    opened = opened_mappings()
    for address in opened.values():
        cupy.cuda.runtime.ipcCloseMemHandle(address)
    count = len(opened)
    opened.clear()
    return count

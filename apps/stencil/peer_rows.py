"""Halo rows written straight into the neighbouring GPUs' memory (CUDA IPC), for row-split 2D stencils.

With the grid split into bands of rows on GPUs of one node, each step's halo is two rows per rank.
Instead of an NCCL exchange (a kernel that shares the SMs with the stencil, or an exposed wait), every
rank maps its two neighbours' ping-pong buffers into its own address space once (CUDA IPC), and after
each sweep one small kernel stores its first and last owned rows into the neighbours' ghost rows over
NVLink, then raises a counter in each neighbour's memory. Before the next sweep, a one-warp kernel waits
until both neighbours' counters have reached this rank's own step count. Per step, on the compute
stream only::

    wait (both neighbours finished step k-1)  ->  sweep k (whole block)  ->  put rows + signal k

One wait guards both hazards: the ghost rows sweep k reads were stored by the neighbours' put k-1, and
the ghost rows put k overwrites in a neighbour were last read by that neighbour's sweep k-1, which
precedes its put k-1. The counters live on the device (the put kernel increments this rank's count),
so the steps contain no host values and can be captured as CUDA graphs. Everything is IEEE copies:
results are bitwise those of the NCCL exchange.

The buffers are mapped with :mod:`hpcgpu.transport.peer_memory`. The put kernel fuses the row copy with
the signal, and both counters live on the device (a graph replays them): a protocol of its own, not
``peer_memory``'s host-epoch flags.

Requirements (checked identically on every rank): GPUs, at least 2 ranks, one node, the grid split
along rows only (``dims = (P, 1)``), ghost width 1.
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport.peer_memory import (
    export_addresses,
    on_every_rank,
    open_addresses,
    pointer_arg,
    ready_for_peer_stores,
)

_SOURCE = r"""
// One block: copy this rank's first and last owned rows (32-bit words) into the neighbours' ghost rows,
// then publish step count + 1 to both neighbours and to this rank's own counter.
extern "C" __global__ void peer_rows_put(const unsigned int* __restrict__ first_row,
                                         const unsigned int* __restrict__ last_row,
                                         unsigned int* up_ghost, unsigned int* down_ghost, int n_words,
                                         unsigned int* up_flag, unsigned int* down_flag, unsigned int* count) {
    for (int i = threadIdx.x; i < n_words; i += blockDim.x) {
        up_ghost[i] = first_row[i];
        down_ghost[i] = last_row[i];
    }
    __threadfence_system();   // the rows reach the neighbours before the counters do
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int next = *count + 1u;
        *(volatile unsigned int*)up_flag = next;
        *(volatile unsigned int*)down_flag = next;
        *count = next;
    }
}

// One warp: wait until both neighbours have published this rank's step count (flags[0]: from the
// neighbour above, flags[1]: from the neighbour below).
extern "C" __global__ void peer_rows_wait(const unsigned int* flags, const unsigned int* count) {
    if (threadIdx.x == 0) {
        const unsigned int target = *count;
        const volatile unsigned int* f = flags;
        while (f[0] < target || f[1] < target) {
            __nanosleep(64);
        }
    }
    __syncthreads();
    __threadfence_system();
}
"""

_PUT_THREADS = 1024


@functools.cache
def _kernels():
    import cupy

    module = cupy.RawModule(code=_SOURCE)
    return module.get_function("peer_rows_put"), module.get_function("peer_rows_wait")


def check_peer_rows(grid, arch, halo_width) -> None:
    """Raise ConfigurationError (same verdict on every rank) unless the peer-row exchange applies."""
    problems = []
    if not arch.is_gpu:
        problems.append("it needs GPUs (--backend cupy)")
    if grid.comm.size < 2:
        problems.append("it needs at least 2 ranks")
    if grid.comm.n_nodes != 1:
        problems.append(f"CUDA IPC reaches GPUs of one node only; the job spans {grid.comm.n_nodes} nodes")
    if len(grid.dims) != 2 or grid.dims[1] != 1:
        problems.append(f"the grid must be split along rows only (--dims {grid.comm.size},1); it is {tuple(grid.dims)}")
    elif grid.periodic[1]:
        problems.append("columns must not be periodic (a periodic axis with one block needs local ghost copies)")
    if tuple(halo_width)[0] != 1:
        problems.append(f"ghost rows must be 1 deep, not {tuple(halo_width)[0]}")
    if problems:
        raise ConfigurationError("--peer-halo cannot be used: " + "; ".join(problems))


class PeerRowExchange:
    """Neighbour ghost rows by direct stores into mapped peer memory (module docstring).

    Parameters
    ----------
    grid : hpcgpu.Decomposition -- 2D, split along axis 0 only, periodic along it or not
    arch : hpcgpu.arch.GPU
    buffers : (Field, Field) -- the two ping-pong fields; their arrays never change afterwards

    Collective over the communicator (IPC handles travel by MPI once).
    """

    def __init__(self, grid, arch, buffers):
        check_peer_rows(grid, arch, buffers[0].halo_width)
        import cupy

        _kernels()   # compile and load now, not inside the timed loop or a graph capture
        self.arch = arch
        self.buffers = tuple(buffers)
        comm = grid.comm
        data = [b.data for b in self.buffers]
        rows, pitch = data[0].shape
        itemsize = data[0].dtype.itemsize
        self.row_bytes = (pitch - 2) * itemsize   # the owned columns 1 .. pitch-2 of a row
        if self.row_bytes % 4:
            raise ConfigurationError("--peer-halo copies 32-bit words; the row length in bytes must be a multiple of 4")
        self.n_words = self.row_bytes // 4
        # flags[0]: counter raised by the neighbour above, flags[1]: by the neighbour below; count[0]: own.
        self.flags = cupy.zeros(2, dtype=cupy.uint32)
        self.count = cupy.zeros(1, dtype=cupy.uint32)
        self._unused_flags = cupy.zeros(2, dtype=cupy.uint32)   # targets for a missing (wall) neighbour
        self._unused_rows = cupy.zeros(self.n_words, dtype=cupy.uint32)
        mine = {"window": export_addresses({"buffer0": data[0].data.ptr, "buffer1": data[1].data.ptr,
                                            "flags": self.flags.data.ptr}),
                "rows": rows, "pitch": pitch, "itemsize": itemsize}
        everyone = comm.mpi.allgather(mine)
        up, down = grid.neighbor((-1, 0)), grid.neighbor((1, 0))
        # Map both neighbours' windows; a rank that cannot is the same error on every rank.
        up_window, down_window = on_every_rank(comm, lambda: (
            open_addresses(everyone[up]["window"]) if up is not None else None,
            open_addresses(everyone[down]["window"]) if down is not None else None))[comm.rank]
        # My first owned row -> the upper neighbour's bottom ghost row; my last -> the lower one's top row.
        self._targets = []
        for which in (0, 1):
            if up is not None:
                peer = everyone[up]
                up_row = up_window[f"buffer{which}"] + ((peer["rows"] - 1) * peer["pitch"] + 1) * itemsize
                up_flag = up_window["flags"] + 4   # its "from below" counter
            else:
                up_row, up_flag = self._unused_rows.data.ptr, self._unused_flags.data.ptr
            if down is not None:
                down_row = down_window[f"buffer{which}"] + 1 * itemsize   # row 0, column 1
                down_flag = down_window["flags"]      # its "from above" counter
            else:
                down_row, down_flag = self._unused_rows.data.ptr, self._unused_flags.data.ptr + 4
            self._targets.append((up_row, down_row, up_flag, down_flag))
        # A wall (non-periodic edge) never signals: start that counter out of reach of the wait.
        if up is None:
            self.flags[0] = np.uint32(0xFFFFFFFF)
        if down is None:
            self.flags[1] = np.uint32(0xFFFFFFFF)
        self._rows = [(d.data.ptr + (1 * pitch + 1) * itemsize, d.data.ptr + ((rows - 2) * pitch + 1) * itemsize)
                      for d in data]
        ready_for_peer_stores(comm)   # every mapping is open and every counter zeroed before anyone stores

    def wait(self) -> None:
        """Queue on the current stream: wait until both neighbours finished the previous step."""
        _, wait = _kernels()
        wait((1,), (32,), (self.flags, self.count))

    def put(self, target) -> None:
        """Queue on the current stream: store ``target``'s first and last owned rows into the neighbours'
        ghost rows of the same buffer, then signal them. ``target`` is one of the two buffers."""
        which = 0 if target is self.buffers[0] else 1
        up_row, down_row, up_flag, down_flag = self._targets[which]
        first, last = self._rows[which]
        put, _ = _kernels()
        put((1,), (_PUT_THREADS,), (pointer_arg(first), pointer_arg(last), pointer_arg(up_row),
                                    pointer_arg(down_row), np.int32(self.n_words), pointer_arg(up_flag),
                                    pointer_arg(down_flag), self.count))

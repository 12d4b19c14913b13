"""Ghost lists and ghost refreshes on the GPU: no host round trip, no per-direction synchronisation.

:class:`~hpcgpu.particles.GhostExchange` uses these kernels when the positions are CuPy arrays.

Build (rebuild steps): which owned particles go in which of the 26 directions is one flag matrix
``flags[k, i]`` (direction ``k`` of :attr:`ParticleDomain.neighbors`, particle ``i``), filled by one
kernel. Its inclusive prefix sum gives every selected ``(k, i)`` its row in the send list, in the
order the host code uses (direction first, then particle index), and the 26 direction totals come back
in ONE small device-to-host copy (instead of 26 ``nonzero`` calls, each a synchronisation)::

    flags (26, n) --cumsum--> rows --scatter--> send_index (n_send,), send_direction (n_send,)

Refresh (every other step): every ghost row is either a periodic image of an owned particle of this
rank (``source >= 0``: ``positions[source] + shift``) or a row received from another rank
(``source < 0``: row ``-source - 1`` of the receive buffer). One gather kernel writes all ghost rows::

    pack (remote sends only) -> exchange of the job's transport -> gather (self images + received rows)

On one rank (every neighbour is the rank itself) the refresh is that single gather kernel. On the
``nccl`` transport the exchange is one NCCL group on the current stream, in the order of the kernels
around it: nothing synchronises the host (the MPI transports synchronise the stream before sending).
"""

from __future__ import annotations

import functools

import numpy as np

THREADS_PER_BLOCK = 128

_CUDA_SOURCE = r"""
/* flags[k * n + i] = 1 if particle i goes in direction k (offsets: 26 x 3 values in {-1, 0, 1}). */
template <typename real>
__global__ void particles_ghost_flags(const real* __restrict__ positions, int n,
                                      real low_x, real low_y, real low_z, real high_x, real high_y, real high_z,
                                      const int* __restrict__ offsets, int* __restrict__ flags) {
    const int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n) return;
    const real x[3] = {positions[3 * i], positions[3 * i + 1], positions[3 * i + 2]};
    const real low[3] = {low_x, low_y, low_z}, high[3] = {high_x, high_y, high_z};
    bool near_lower[3], near_upper[3];
    for (int a = 0; a < 3; ++a) { near_lower[a] = x[a] < low[a]; near_upper[a] = x[a] >= high[a]; }
    for (int k = 0; k < 26; ++k) {
        bool selected = true;
        for (int a = 0; a < 3; ++a) {
            const int d = offsets[3 * k + a];
            if (d > 0) selected = selected && near_upper[a];
            else if (d < 0) selected = selected && near_lower[a];
        }
        flags[(long long)k * n + i] = selected ? 1 : 0;
    }
}

/* Selected (k, i) pairs to their rows: rows is the inclusive prefix sum of flags. */
extern "C" __global__ void particles_ghost_scatter(const int* __restrict__ flags, const long long* __restrict__ rows,
                                                   long long n_flags, int n, long long* __restrict__ send_index,
                                                   int* __restrict__ send_direction) {
    const long long index = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (index >= n_flags || !flags[index]) return;
    const long long row = rows[index] - 1;
    send_index[row] = index % n;
    send_direction[row] = (int)(index / n);
}

/* Send buffer rows: out[r] = positions[index[r]] + shift[r]. */
template <typename real>
__global__ void particles_ghost_pack(const real* __restrict__ positions, const long long* __restrict__ index,
                                     const real* __restrict__ shifts, int n_rows, real* __restrict__ out) {
    const int r = blockDim.x * blockIdx.x + threadIdx.x;
    if (r >= n_rows) return;
    const long long j = index[r];
    for (int a = 0; a < 3; ++a) out[3 * r + a] = positions[3 * j + a] + shifts[3 * r + a];
}

/* Ghost rows: an image of an owned particle (source >= 0) or a received row (source < 0). */
template <typename real>
__global__ void particles_ghost_gather(real* positions, int n_local, int n_ghost,
                                       const long long* __restrict__ source, const real* __restrict__ shifts,
                                       const real* __restrict__ received) {
    const int g = blockDim.x * blockIdx.x + threadIdx.x;
    if (g >= n_ghost) return;
    const long long s = source[g];
    real* out = positions + 3 * ((long long)n_local + g);
    if (s >= 0) {
        for (int a = 0; a < 3; ++a) out[a] = positions[3 * s + a] + shifts[3 * g + a];
    } else {
        const real* row = received + 3 * (-s - 1);
        for (int a = 0; a < 3; ++a) out[a] = row[a];
    }
}
"""

_NAMES = tuple(f"{kernel}<{real}>" for kernel in ("particles_ghost_flags", "particles_ghost_pack",
                                                 "particles_ghost_gather") for real in ("float", "double"))


@functools.lru_cache(maxsize=None)
def _module():
    import cupy

    return cupy.RawModule(code=_CUDA_SOURCE, options=("-std=c++17",), name_expressions=_NAMES)


@functools.lru_cache(maxsize=None)
def _kernel(name, dtype=None):
    if dtype is None:
        return _module().get_function(name)
    real = "float" if np.dtype(dtype) == np.float32 else "double"
    return _module().get_function(f"{name}<{real}>")


def _blocks(n_items: int) -> int:
    return max(1, (int(n_items) + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK)


def select_send_rows(positions, lower, upper, width: float, offsets):
    """Send list of the 26 directions, built on the device (CuPy only).

    Parameters
    ----------
    positions : cupy.ndarray, shape (n_local, 3), float32/float64 -- owned particles
    lower, upper : array_like, shape (3,) -- this rank's sub-box
    width : float -- ghost width
    offsets : sequence of 26 (dx, dy, dz) -- the directions, in :attr:`ParticleDomain.neighbors` order

    Returns
    -------
    send_index : cupy.ndarray, shape (n_send,), int64 -- particle of each send row, direction-major
    send_direction : cupy.ndarray, shape (n_send,), int32 -- direction of each send row
    send_counts : list of 26 int
    """
    import cupy

    n_local = int(positions.shape[0])
    n_directions = len(offsets)
    if n_local == 0:
        return cupy.zeros(0, cupy.int64), cupy.zeros(0, cupy.int32), [0] * n_directions
    real = positions.dtype.type
    low = np.asarray(lower, np.float64) + width
    high = np.asarray(upper, np.float64) - width
    offset_table = cupy.asarray(np.asarray(offsets, dtype=np.int32).reshape(n_directions, 3))
    flags = cupy.empty(n_directions * n_local, dtype=cupy.int32)
    _kernel("particles_ghost_flags", positions.dtype)(
        (_blocks(n_local),), (THREADS_PER_BLOCK,),
        (positions, np.int32(n_local), *(real(v) for v in low), *(real(v) for v in high), offset_table, flags))
    rows = cupy.cumsum(flags, dtype=cupy.int64)
    # The 26 running totals at the end of each direction: one small copy, the only synchronisation.
    ends = rows[cupy.arange(1, n_directions + 1, dtype=cupy.int64) * n_local - 1].get()
    send_counts = np.diff(np.concatenate([[0], ends])).astype(np.int64).tolist()
    n_send = int(ends[-1])
    send_index = cupy.empty(n_send, dtype=cupy.int64)
    send_direction = cupy.empty(n_send, dtype=cupy.int32)
    if n_send:
        n_flags = n_directions * n_local
        _kernel("particles_ghost_scatter")((_blocks(n_flags),), (THREADS_PER_BLOCK,),
                                           (flags, rows, np.int64(n_flags), np.int32(n_local), send_index,
                                            send_direction))
    return send_index, send_direction, send_counts


def pack_rows(positions, index, shifts, out) -> None:
    """``out[r] = positions[index[r]] + shifts[r]`` on the device (CuPy; shapes (n, 3), (m,), (m, 3), (m, 3))."""
    n_rows = int(index.shape[0])
    if n_rows:
        _kernel("particles_ghost_pack", positions.dtype)((_blocks(n_rows),), (THREADS_PER_BLOCK,),
                                                         (positions, index, shifts, np.int32(n_rows), out))


def gather_ghosts(positions, n_local: int, source, shifts, received) -> None:
    """Write every ghost row of ``positions`` (CuPy, (n_local + n_ghost, 3)) in place; see the module docstring."""
    n_ghost = int(source.shape[0])
    if n_ghost:
        _kernel("particles_ghost_gather", positions.dtype)((_blocks(n_ghost),), (THREADS_PER_BLOCK,),
                                                           (positions, np.int32(n_local), np.int32(n_ghost), source,
                                                            shifts, received))

"""Periodic boundaries on one rank: wrapping owned atoms and building ghost images.

Layout used by every MD kernel::

    positions[:n_local]             owned atoms, inside the box [0, L) after wrap_positions
    positions[n_local:]             ghost atoms: images ``positions[source] + shift`` of owned atoms

Ghosts cover the slab ``[-width, L + width)`` on every axis (``width = cutoff + skin``). They are built
axis by axis (x, then y, then z, each pass also copying the ghosts of earlier passes), which yields edge and
corner images without enumerating 26 directions -- the same sweep the distributed exchange performs with
neighbouring ranks (LAMMPS ``comm``). ``width`` may exceed ``L``: then several images per axis are made.
Between neighbour-list rebuilds only :func:`update_ghost_positions` runs (a gather + shift per ghost).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from hpcgpu.errors import ConfigurationError

from ._arrays import THREADS_PER_BLOCK, _is_cupy, array_module, blocks_for, check_array, raw_kernel


class Ghosts(NamedTuple):
    """Periodic ghost images of owned atoms.

    Attributes
    ----------
    positions : array, shape (n_ghost, 3), dtype of the owned positions, sigma
    source : array, shape (n_ghost,), int64 -- index of the owned atom each ghost copies (use it to copy
        ids, types, velocities)
    shifts : array, shape (n_ghost, 3), dtype of positions -- ``positions == owned[source] + shifts``
    """

    positions: object
    source: object
    shifts: object


def make_periodic_ghosts(positions, box, width: float) -> Ghosts:
    """Ghost images of the owned atoms that lie within ``width`` outside the periodic box.

    Parameters
    ----------
    positions : array, shape (n_local, 3), float32/float64 (NumPy or CuPy), sigma
        Owned atoms, wrapped into ``[0, box)`` (see :func:`wrap_positions`).
    box : array_like, shape (3,), sigma
        Box lengths; the box starts at the origin.
    width : float
        Ghost shell thickness (sigma), normally ``cutoff + skin``.

    Returns
    -------
    Ghosts
        ``(positions, source, shifts)`` on the same backend as the input.
    """
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    xp = array_module(positions)
    box = np.asarray(box, dtype=np.float64)
    if box.shape != (3,) or np.any(box <= 0):
        raise ConfigurationError(f"box: expected 3 positive lengths, found {box}")
    if not width >= 0:
        raise ConfigurationError(f"ghost width: expected a non-negative length, found {width}")
    all_positions = positions
    all_source = xp.arange(positions.shape[0], dtype=xp.int64)
    all_shifts = xp.zeros_like(positions)
    n_local = positions.shape[0]
    for axis in range(3):
        length = float(box[axis])
        coordinate = all_positions[:, axis]
        new_positions, new_source, new_shifts = [], [], []
        for image in range(1, int(math.ceil(width / length)) + 1):
            # +image copies atoms near the low face to beyond the high face, -image the reverse.
            for sign, selected in ((+1, coordinate < width - (image - 1) * length),
                                   (-1, coordinate >= image * length - width)):
                index = xp.nonzero(selected)[0]
                shift = xp.zeros((1, 3), dtype=positions.dtype)
                shift[0, axis] = sign * image * length
                new_positions.append(all_positions[index] + shift)
                new_source.append(all_source[index])
                new_shifts.append(all_shifts[index] + shift)
        all_positions = xp.concatenate([all_positions] + new_positions)
        all_source = xp.concatenate([all_source] + new_source)
        all_shifts = xp.concatenate([all_shifts] + new_shifts)
    return Ghosts(
        positions=xp.ascontiguousarray(all_positions[n_local:]),
        source=xp.ascontiguousarray(all_source[n_local:]),
        shifts=xp.ascontiguousarray(all_shifts[n_local:]),
    )


def update_ghost_positions(positions, n_local: int, source, shifts) -> None:
    """Refresh ghost rows in place: ``positions[n_local + g] = positions[source[g]] + shifts[g]``.

    Parameters
    ----------
    positions : array, shape (n_local + n_ghost, 3), float32/float64
    n_local : int
    source : array, shape (n_ghost,), int64
    shifts : array, shape (n_ghost, 3), same dtype as positions

    Returns None (mutates ``positions``).
    """
    n_ghost = positions.shape[0] - n_local
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("source", source, shape=(n_ghost,), dtypes=[np.int64], like=positions)
    check_array("shifts", shifts, shape=(n_ghost, 3), dtypes=[positions.dtype], like=positions)
    if n_ghost == 0:
        return
    if _is_cupy(positions):
        kernel = _kernel("md_update_ghosts", positions.dtype)
        kernel((blocks_for(n_ghost),), (THREADS_PER_BLOCK,),
               (positions, np.int32(n_local), np.int32(n_ghost), source, shifts))
    else:
        _update_ghosts_cpu(positions, n_local, source, shifts)


def wrap_positions(positions, images, box) -> None:
    """Wrap owned positions into ``[0, box)`` in place, counting box crossings in ``images``.

    Parameters
    ----------
    positions : array, shape (n_local, 3), float32/float64, sigma
    images : array, shape (n_local, 3), int32 -- image flags (unwrapped = positions + images * box)
    box : array_like, shape (3,), sigma

    Returns None (mutates both arrays).
    """
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    check_array("images", images, shape=(positions.shape[0], 3), dtypes=[np.int32], like=positions)
    box = np.asarray(box, dtype=np.float64)
    if _is_cupy(positions):
        kernel = _kernel("md_wrap", positions.dtype)
        real = positions.dtype.type
        kernel((blocks_for(positions.shape[0]),), (THREADS_PER_BLOCK,),
               (positions, images, np.int32(positions.shape[0]), real(box[0]), real(box[1]), real(box[2])))
    else:
        _wrap_cpu(positions, images, box.astype(positions.dtype))


@numba.njit(parallel=True, cache=True)
def _update_ghosts_cpu(positions, n_local, source, shifts):
    for g in numba.prange(source.shape[0]):
        for axis in range(3):
            positions[n_local + g, axis] = positions[source[g], axis] + shifts[g, axis]


@numba.njit(parallel=True, cache=True)
def _wrap_cpu(positions, images, box):
    for i in numba.prange(positions.shape[0]):
        for axis in range(3):
            crossings = math.floor(positions[i, axis] / box[axis])
            positions[i, axis] -= crossings * box[axis]
            # Rounding can leave x == L after subtracting; keep the half-open interval.
            if positions[i, axis] >= box[axis]:
                positions[i, axis] -= box[axis]
                crossings += 1
            images[i, axis] += np.int32(crossings)


_CUDA_SOURCE = r"""
template <typename real>
__global__ void md_update_ghosts(real* positions, int n_local, int n_ghost,
                                 const long long* __restrict__ source, const real* __restrict__ shifts) {
    int g = blockDim.x * blockIdx.x + threadIdx.x;
    if (g >= n_ghost) return;
    long long j = source[g];
    for (int axis = 0; axis < 3; ++axis)
        positions[3 * (n_local + g) + axis] = positions[3 * j + axis] + shifts[3 * g + axis];
}

template <typename real>
__global__ void md_wrap(real* positions, int* images, int n_local, real box_x, real box_y, real box_z) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n_local) return;
    const real box[3] = {box_x, box_y, box_z};
    for (int axis = 0; axis < 3; ++axis) {
        real x = positions[3 * i + axis];
        int crossings = (int)floor(x / box[axis]);
        x -= crossings * box[axis];
        if (x >= box[axis]) { x -= box[axis]; crossings += 1; }
        positions[3 * i + axis] = x;
        images[3 * i + axis] += crossings;
    }
}
"""

_NAMES = tuple(f"{kernel}<{real}>" for kernel in ("md_update_ghosts", "md_wrap") for real in ("float", "double"))


def _kernel(name, dtype):
    real = "float" if np.dtype(dtype) == np.float32 else "double"
    return raw_kernel(_CUDA_SOURCE, _NAMES, f"{name}<{real}>")

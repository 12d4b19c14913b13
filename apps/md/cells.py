"""Cell binning: a uniform grid of cells no smaller than the neighbour cutoff, filled by counting sort.

Two atoms closer than the cutoff lie in the same or in adjacent cells, so a neighbour search visits the
3 x 3 x 3 block of cells around an atom instead of all atoms. Counting sort gives, for every cell ``c``,
the contiguous slice ``cell_atoms[cell_start[c]:cell_start[c + 1]]`` of the atoms it holds::

    count atoms per cell  ->  exclusive prefix sum (cell_start)  ->  scatter atom indices (cell_atoms)

``cell_atoms`` is also the permutation that orders atoms by cell; applying it to the owned atoms now and
then keeps atoms that are close in space close in memory (cache locality on CPU and GPU). On the CPU the
scatter is sequential and stable (deterministic); on the GPU it uses atomics, which leave the atoms of a
cell in a run-dependent order, so a last kernel sorts each cell's slice (one thread per cell, insertion
sort of ~20 entries): the GPU cell list is then the CPU one, and runs are bitwise reproducible.

The grid spans the rank's box plus the ghost shell; it is not periodic (ghosts stand in for images).
Cells are numbered ``(cz * ny + cy) * nx + cx``; atoms outside the grid are clamped to the edge cells.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from hpcgpu.errors import ConfigurationError

from ._arrays import THREADS_PER_BLOCK, _is_cupy, array_module, blocks_for, check_array, raw_kernel


class CellGrid(NamedTuple):
    """A uniform cell grid. ``origin``/``cell_size`` in sigma (float64, shape (3,)); ``shape`` (nx, ny, nz)."""

    origin: np.ndarray
    cell_size: np.ndarray
    shape: tuple

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape))


class CellList(NamedTuple):
    """Atoms binned by cell.

    Attributes
    ----------
    cell_start : array, shape (n_cells + 1,), int32 -- first entry of each cell in ``cell_atoms``
    cell_atoms : array, shape (n_atoms,), int32 -- atom indices ordered by cell
    """

    cell_start: object
    cell_atoms: object


def make_cell_grid(lower, upper, halo_width: float, min_cell_size: float) -> CellGrid:
    """Grid over ``[lower - halo_width, upper + halo_width)`` with cells at least ``min_cell_size`` wide.

    Parameters
    ----------
    lower, upper : array_like, shape (3,), sigma -- the owned region (a rank's sub-box or the whole box)
    halo_width : float -- ghost shell thickness (sigma)
    min_cell_size : float -- normally the neighbour cutoff ``cutoff + skin`` (sigma)
    """
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    if not min_cell_size > 0:
        raise ConfigurationError(f"cell size: expected a positive length, found {min_cell_size}")
    if np.any(upper <= lower):
        raise ConfigurationError(f"cell grid: expected upper > lower on every axis, found {lower} and {upper}")
    origin = lower - halo_width
    extent = (upper - lower) + 2.0 * halo_width
    shape = tuple(max(1, int(math.floor(e / min_cell_size))) for e in extent)
    return CellGrid(origin=origin, cell_size=extent / np.array(shape), shape=shape)


def bin_atoms(positions, grid: CellGrid) -> CellList:
    """Counting-sort the atoms of ``positions`` (shape (n_atoms, 3), float32/64) into the cells of ``grid``."""
    check_array("positions", positions, shape=(None, 3), dtypes=[np.float32, np.float64])
    xp = array_module(positions)
    n_atoms = positions.shape[0]
    cell_start = xp.zeros(grid.n_cells + 1, dtype=xp.int32)
    cell_atoms = xp.empty(n_atoms, dtype=xp.int32)
    inverse_size = (1.0 / grid.cell_size).astype(positions.dtype)
    origin = grid.origin.astype(positions.dtype)
    shape = np.asarray(grid.shape, dtype=np.int32)
    if _is_cupy(positions):
        _bin_gpu(positions, origin, inverse_size, shape, cell_start, cell_atoms)
    else:
        atom_cell = np.empty(n_atoms, dtype=np.int32)
        _cell_index_cpu(positions, origin, inverse_size, shape, atom_cell)
        _counting_sort_cpu(atom_cell, cell_start, cell_atoms)
    return CellList(cell_start=cell_start, cell_atoms=cell_atoms)


@numba.njit(inline="always")
def _clamp(value, n):
    return min(max(value, 0), n - 1)


@numba.njit(parallel=True, cache=True)
def _cell_index_cpu(positions, origin, inverse_size, shape, atom_cell):
    for i in numba.prange(positions.shape[0]):
        cx = _clamp(np.int32(math.floor((positions[i, 0] - origin[0]) * inverse_size[0])), shape[0])
        cy = _clamp(np.int32(math.floor((positions[i, 1] - origin[1]) * inverse_size[1])), shape[1])
        cz = _clamp(np.int32(math.floor((positions[i, 2] - origin[2]) * inverse_size[2])), shape[2])
        atom_cell[i] = (cz * shape[1] + cy) * shape[0] + cx


@numba.njit(cache=True)
def _counting_sort_cpu(atom_cell, cell_start, cell_atoms):
    # Sequential on purpose: O(n) and stable, so the CPU path is deterministic.
    n_cells = cell_start.shape[0] - 1
    for i in range(atom_cell.shape[0]):
        cell_start[atom_cell[i] + 1] += 1
    for c in range(n_cells):
        cell_start[c + 1] += cell_start[c]
    cursor = cell_start[:-1].copy()
    for i in range(atom_cell.shape[0]):
        c = atom_cell[i]
        cell_atoms[cursor[c]] = i
        cursor[c] += 1


_CUDA_SOURCE = r"""
template <typename real>
__device__ __forceinline__ int md_cell_of(const real* p, real ox, real oy, real oz,
                                          real ix, real iy, real iz, int nx, int ny, int nz) {
    int cx = min(max((int)floor((p[0] - ox) * ix), 0), nx - 1);
    int cy = min(max((int)floor((p[1] - oy) * iy), 0), ny - 1);
    int cz = min(max((int)floor((p[2] - oz) * iz), 0), nz - 1);
    return (cz * ny + cy) * nx + cx;
}

/* Pass 1: cell of each atom and per-cell counts (stored at cell_start[c + 1]). */
template <typename real>
__global__ void md_bin_count(const real* __restrict__ positions, int n_atoms, real ox, real oy, real oz,
                             real ix, real iy, real iz, int nx, int ny, int nz,
                             int* __restrict__ atom_cell, int* __restrict__ cell_start) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n_atoms) return;
    int c = md_cell_of<real>(positions + 3 * i, ox, oy, oz, ix, iy, iz, nx, ny, nz);
    atom_cell[i] = c;
    atomicAdd(cell_start + c + 1, 1);
}

/* Pass 2 (after the prefix sum): scatter atom indices; cursor starts as a copy of cell_start. */
extern "C" __global__ void md_bin_scatter(const int* __restrict__ atom_cell, int n_atoms, int* __restrict__ cursor,
                               int* __restrict__ cell_atoms) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n_atoms) return;
    cell_atoms[atomicAdd(cursor + atom_cell[i], 1)] = i;
}

/* Pass 3: ascending atom index inside every cell (the atomics above left a run-dependent order). */
extern "C" __global__ void md_bin_sort_cells(const int* __restrict__ cell_start, int n_cells,
                                             int* __restrict__ cell_atoms) {
    int c = blockDim.x * blockIdx.x + threadIdx.x;
    if (c >= n_cells) return;
    const int begin = cell_start[c], end = cell_start[c + 1];
    for (int k = begin + 1; k < end; ++k) {
        const int value = cell_atoms[k];
        int m = k - 1;
        while (m >= begin && cell_atoms[m] > value) { cell_atoms[m + 1] = cell_atoms[m]; --m; }
        cell_atoms[m + 1] = value;
    }
}
"""

_NAMES = ("md_bin_count<float>", "md_bin_count<double>", "md_bin_scatter", "md_bin_sort_cells")


def _bin_gpu(positions, origin, inverse_size, shape, cell_start, cell_atoms):
    import cupy

    n_atoms = positions.shape[0]
    real = positions.dtype.type
    real_name = "float" if positions.dtype == np.float32 else "double"
    atom_cell = cupy.empty(n_atoms, dtype=cupy.int32)
    blocks = (blocks_for(n_atoms),)
    count = raw_kernel(_CUDA_SOURCE, _NAMES, f"md_bin_count<{real_name}>")
    count(blocks, (THREADS_PER_BLOCK,),
          (positions, np.int32(n_atoms), *(real(v) for v in origin), *(real(v) for v in inverse_size),
           *(np.int32(v) for v in shape), atom_cell, cell_start))
    cell_start[:] = cupy.cumsum(cell_start)  # int64 result cast back into the int32 array
    cursor = cell_start[:-1].copy()
    scatter = raw_kernel(_CUDA_SOURCE, _NAMES, "md_bin_scatter")
    scatter(blocks, (THREADS_PER_BLOCK,), (atom_cell, np.int32(n_atoms), cursor, cell_atoms))
    n_cells = cell_start.shape[0] - 1
    raw_kernel(_CUDA_SOURCE, _NAMES, "md_bin_sort_cells")((blocks_for(n_cells),), (THREADS_PER_BLOCK,),
                                                          (cell_start, np.int32(n_cells), cell_atoms))

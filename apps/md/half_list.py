"""CPU half neighbour lists with Newton's third law: each pair's force computed once, on both atoms.

A full list (:mod:`apps.md.neighbors`, the GPU layout) holds every pair twice and computes its force
twice. On the CPU this module keeps each pair of *owned* atoms once and applies ``+f`` to one atom and
``-f`` to the other, as LAMMPS ``lj/cut`` with ``newton on``. A pair of an owned atom and a ghost stays in
the owned atom's list only, and only the owned atom receives the force (LAMMPS ``newton off`` for those
pairs): the ghost's owner computes the same pair from its own side, so no force travels back to the
owners of ghosts, and the ghost exchange is unchanged.

Build (binned, half stencil). For the owned atoms of cell ``c``, the candidates are: the atoms of ``c``
after it (owned) and the ghosts of ``c``; every atom of the 13 "upper" neighbour cells (offset
``(dz, dy, dx)`` lexicographically after ``(0, 0, 0)``); the ghosts of the 13 "lower" cells. Each owned
pair is then found once, from the cell that comes first; the distance tests are about half those of a
full list. Ghosts come after the owned atoms in every cell (the counting sort is stable and ghost indices
follow owned ones), so a cell's ghosts are the tail of its slice.

Storage: atoms are visited in cell order (``order``, the owned atoms cell by cell), and the neighbours of
the ``p``-th visited atom are ``neighbors[p, :counts[p]]`` (row-major: one atom's neighbours are adjacent
in memory). Overflow is never silent: the build keeps counting past the capacity, and the caller grows
it and builds again.

Deterministic forces on any number of threads. Scattered ``-f`` updates would race between threads, and
per-thread force copies would make the sums depend on the thread count. Instead the visit is cut into
*tasks*, each a block of 2 x 2 rows of cells along x (rows ``cy``, ``cy + 1`` times ``cz``, ``cz + 1``,
both even), and each task runs sequentially on one thread. A pair joins atoms of rows at most one apart
in y and in z, so a task touches its own rows and their direct neighbours only, and tasks whose block
coordinates ``(cy // 2, cz // 2)`` agree modulo 2 never touch the same atom: the 4 classes (colours) run
one after the other, the tasks of a colour in parallel (4 parallel regions per force call). Every force
sum is then added in one fixed order -- the same bits on 1 or 64 threads.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import numba
import numpy as np

from .cells import CellGrid, CellList

#: Owned atoms below which the build and the forces run on the calling thread alone: a small system's
#: work per colour is shorter than a parallel region's start and barrier (far shorter when the cores are
#: shared). The schedule is the same, so are the bits.
SERIAL_BELOW = 4096

#: Colours of the task schedule: tasks (2 x 2 blocks of rows) with equal (cz // 2 % 2, cy // 2 % 2).
N_COLORS = 4


class HalfNeighborList(NamedTuple):
    """A half list of one rank's owned atoms (CPU arrays), in visit order.

    Attributes
    ----------
    neighbors : numpy.ndarray, shape (n_local, capacity), int32 -- row p: neighbours of ``order[p]``
        (owned or ghost indices into the positions)
    counts : numpy.ndarray, shape (n_local,), int32 -- neighbours of ``order[p]``
    order : numpy.ndarray, shape (n_local,), int32 -- owned atoms in visit (cell) order
    row_start : numpy.ndarray, shape (n_rows + 1,), int64 -- row r of cells (r = cz * ny + cy) visits
        ``order[row_start[r]:row_start[r + 1]]``
    group_rows : numpy.ndarray, shape (n_rows,), int64 -- the rows, task by task (a task: 2 x 2 rows)
    group_start : numpy.ndarray, shape (n_tasks + 1,), int64 -- task g runs the rows
        ``group_rows[group_start[g]:group_start[g + 1]]``
    color_start : numpy.ndarray, shape (N_COLORS + 1,), int64 -- colour c: tasks ``color_start[c]`` to
        ``color_start[c + 1] - 1``
    cutoff, skin : float (sigma) -- list cutoff ``pair cutoff + skin`` and the skin
    reference_positions : numpy.ndarray, shape (n_local, 3) -- owned positions at build time
    n_reallocations : int -- how many times this build grew the capacity
    """

    neighbors: np.ndarray
    counts: np.ndarray
    order: np.ndarray
    row_start: np.ndarray
    group_rows: np.ndarray
    group_start: np.ndarray
    color_start: np.ndarray
    cutoff: float
    skin: float
    reference_positions: np.ndarray
    n_reallocations: int

    @property
    def capacity(self) -> int:
        return int(self.neighbors.shape[1])

    @property
    def n_local(self) -> int:
        return int(self.neighbors.shape[0])


def build_half_neighbor_list(positions: np.ndarray, n_local: int, cell_list: CellList, grid: CellGrid,
                             cutoff: float, skin: float, capacity: int, growth: float) -> HalfNeighborList:
    """The half list of the first ``n_local`` atoms of ``positions`` (NumPy), grown until every neighbour fits.

    Parameters
    ----------
    positions : numpy.ndarray, shape (n_local + n_ghost, 3), float32/float64, sigma -- owned then ghosts
    cell_list, grid : :func:`apps.md.cells.bin_atoms` of these positions on ``grid`` (cells >= ``cutoff``)
    cutoff : float -- list cutoff, pair cutoff + skin (sigma); skin : float (sigma)
    capacity : int -- starting capacity (neighbours per atom); growth : float -- factor after an overflow
    """
    nx, ny, nz = (int(v) for v in grid.shape)
    cell_start, cell_atoms = cell_list.cell_start, cell_list.cell_atoms
    owned_in_cell = np.empty(nx * ny * nz, dtype=np.int64)
    _count_owned(cell_start, cell_atoms, n_local, owned_in_cell)
    cell_first = np.zeros(nx * ny * nz + 1, dtype=np.int64)   # visit position of each cell's first owned atom
    np.cumsum(owned_in_cell, out=cell_first[1:])
    row_start = cell_first[::nx].copy()                        # rows of nx cells, numbered cz * ny + cy
    cz, cy = np.divmod(np.arange(ny * nz), ny)
    color = (cz // 2 % 2) * 2 + cy // 2 % 2
    group = (cz // 2) * ((ny + 1) // 2) + cy // 2               # the 2 x 2 block of rows
    group_rows = np.lexsort((cy, cz, group, color)).astype(np.int64)
    ordered = group[group_rows]
    new_group = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    group_start = np.r_[new_group, len(group_rows)].astype(np.int64)
    color_start = np.searchsorted(color[group_rows[new_group]], np.arange(N_COLORS + 1)).astype(np.int64)
    order = np.empty(n_local, dtype=np.int32)
    counts = np.zeros(n_local, dtype=np.int32)
    capacity = max(1, int(capacity))
    n_reallocations = 0
    while True:
        neighbors = np.empty((n_local, capacity), dtype=np.int32)
        needed = 0
        if n_local:
            with _threads_for(n_local):
                _build_half(positions, n_local, cell_start, cell_atoms, cell_first, nx, ny, nz,
                            positions.dtype.type(cutoff * cutoff), order, neighbors, counts)
            needed = int(counts.max())
        if needed <= capacity:
            break
        capacity = int(math.ceil(needed * growth)) + 8
        n_reallocations += 1
    return HalfNeighborList(neighbors=neighbors, counts=counts, order=order, row_start=row_start,
                            group_rows=group_rows, group_start=group_start, color_start=color_start,
                            cutoff=float(cutoff), skin=float(skin),
                            reference_positions=positions[:n_local].copy(), n_reallocations=n_reallocations)


@contextlib.contextmanager
def _threads_for(n_local: int):
    """Numba's threads for a kernel over ``n_local`` owned atoms: one below :data:`SERIAL_BELOW`."""
    if n_local >= SERIAL_BELOW:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def half_capacity_estimate(n_atoms: int, grid: CellGrid, cutoff: float) -> int:
    """Capacity guess: half the mean number of atoms in the cutoff sphere, with a 30 % margin (the
    atoms at a sub-box face keep all their ghost neighbours: up to 5/8 of a sphere)."""
    density = n_atoms / float(np.prod(grid.cell_size) * grid.n_cells)
    return int(math.ceil(1.3 * 0.625 * density * 4.0 / 3.0 * math.pi * cutoff**3)) + 8


@numba.njit(parallel=True, cache=True)
def _count_owned(cell_start, cell_atoms, n_local, owned_in_cell):
    for cell in numba.prange(owned_in_cell.shape[0]):
        owned = 0
        for k in range(cell_start[cell], cell_start[cell + 1]):
            owned += cell_atoms[k] < n_local
        owned_in_cell[cell] = owned


@numba.njit(parallel=True, cache=True)
def _build_half(positions, n_local, cell_start, cell_atoms, cell_first, nx, ny, nz, cutoff_sq, order,
                neighbors, counts):
    """Fill ``order``, ``neighbors``, ``counts`` (module docstring); counts may exceed the capacity."""
    capacity = neighbors.shape[1]
    for cell in numba.prange(nx * ny * nz):
        first, last = cell_start[cell], cell_start[cell + 1]
        n_owned = 0
        for k in range(first, last):
            n_owned += cell_atoms[k] < n_local
        if n_owned == 0:
            continue
        cz, cy, cx = cell // (nx * ny), (cell // nx) % ny, cell % nx
        # Candidates: this cell (all), upper cells (all), lower cells (ghosts only).
        n_candidates = last - first
        for z in range(max(cz - 1, 0), min(cz + 2, nz)):
            for y in range(max(cy - 1, 0), min(cy + 2, ny)):
                for x in range(max(cx - 1, 0), min(cx + 2, nx)):
                    block = (z * ny + y) * nx + x
                    if block > cell:
                        n_candidates += cell_start[block + 1] - cell_start[block]
                    elif block < cell:
                        for k in range(cell_start[block], cell_start[block + 1]):
                            n_candidates += cell_atoms[k] >= n_local
        index = np.empty(n_candidates, dtype=np.int32)
        xs = np.empty(n_candidates, dtype=positions.dtype)
        ys = np.empty(n_candidates, dtype=positions.dtype)
        zs = np.empty(n_candidates, dtype=positions.dtype)
        m = 0
        for k in range(first, last):
            j = cell_atoms[k]
            index[m], xs[m], ys[m], zs[m] = j, positions[j, 0], positions[j, 1], positions[j, 2]
            m += 1
        for z in range(max(cz - 1, 0), min(cz + 2, nz)):
            for y in range(max(cy - 1, 0), min(cy + 2, ny)):
                for x in range(max(cx - 1, 0), min(cx + 2, nx)):
                    block = (z * ny + y) * nx + x
                    if block == cell:
                        continue
                    for k in range(cell_start[block], cell_start[block + 1]):
                        j = cell_atoms[k]
                        if block > cell or j >= n_local:
                            index[m], xs[m], ys[m], zs[m] = j, positions[j, 0], positions[j, 1], positions[j, 2]
                            m += 1
        distance_sq = np.empty(n_candidates, dtype=positions.dtype)
        found = np.empty(n_candidates, dtype=np.int32)
        for q in range(n_owned):          # the cell's owned atoms are its first n_owned entries
            i = index[q]
            p = cell_first[cell] + q
            order[p] = i
            xi, yi, zi = xs[q], ys[q], zs[q]
            for m in range(n_candidates):   # from 0, not q + 1: a loop LLVM vectorises
                dx = xi - xs[m]
                dy = yi - ys[m]
                dz = zi - zs[m]
                distance_sq[m] = dx * dx + dy * dy + dz * dz
            count = 0
            for m in range(q + 1, n_candidates):
                found[count] = index[m]
                count += distance_sq[m] < cutoff_sq
            for m in range(min(count, capacity)):  # past capacity: keep counting, write nothing
                neighbors[p, m] = found[m]
            counts[p] = count


def half_forces(positions, types, half_list: HalfNeighborList, pair_table, forces, energy_per_atom,
                virial_per_atom) -> None:
    """Forces on the owned atoms from a half list, in place; optionally each atom's E_pair and W share.

    Parameters
    ----------
    positions : numpy.ndarray, shape (n_local + n_ghost, 3), float32/float64, sigma
    types : numpy.ndarray, shape (n_local + n_ghost,), int32
    half_list : HalfNeighborList over these positions
    pair_table : numpy.ndarray, shape (n_types, n_types, 5), dtype of positions
    forces : numpy.ndarray, shape (n_local, 3), dtype of positions -- overwritten (epsilon / sigma)
    energy_per_atom, virial_per_atom : numpy.ndarray, shape (n_local,), float64, or None (not computed)
        -- overwritten: half of each pair's E(r) and r.f(r) (epsilon) goes to each owned atom of the pair

    Pair terms in float64 from separations in the positions' dtype; sums in float64 (arrays zeroed by the
    caller: ``forces``/``energies`` of the kernels hold zeros on entry). Ghost rows of the
    float64 scratch sums receive the reaction forces too and are dropped (no branch in the inner loop).
    Returns None.
    """
    n_local = half_list.n_local
    compute_energy = energy_per_atom is not None
    # Zeroed here, in one memset, rather than in one more parallel region of the kernel.
    accumulated = np.zeros((positions.shape[0], 3))
    energies = np.zeros((positions.shape[0], 2)) if compute_energy else np.zeros((0, 2))
    kernel = _half_forces_one_type if pair_table.shape[0] == 1 else _half_forces_typed
    with _threads_for(n_local):
        kernel(positions, types, half_list.neighbors, half_list.counts, half_list.order, half_list.row_start,
               half_list.group_rows, half_list.group_start, half_list.color_start, pair_table, compute_energy,
               accumulated, energies)
    forces[:] = accumulated[:n_local]
    if compute_energy:
        energy_per_atom[:] = energies[:n_local, 0]
        virial_per_atom[:] = energies[:n_local, 1]


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _half_forces_one_type(positions, types, neighbors, counts, order, row_start, group_rows, group_start, color_start,
                          table, compute_energy, forces, energies):
    """One atom type: per atom, separations gathered into scratch rows, pair terms computed without
    branches (vectorised; beyond the cutoff they are 0), then the sums and the reactions in list order."""
    capacity = neighbors.shape[1]
    c12, c6, cutoff_sq, energy_shift, force_shift = table[0, 0, 0], table[0, 0, 1], table[0, 0, 2], \
        table[0, 0, 3], table[0, 0, 4]
    for color in range(color_start.shape[0] - 1):
        for task in numba.prange(color_start[color], color_start[color + 1]):
            real = positions.dtype
            dxs, dys, dzs = np.empty(capacity, real), np.empty(capacity, real), np.empty(capacity, real)
            rsqs, forces_over_r = np.empty(capacity, real), np.empty(capacity)
            for number in range(group_start[task], group_start[task + 1]):
                row = group_rows[number]
                for p in range(row_start[row], row_start[row + 1]):
                    i = order[p]
                    xi, yi, zi = positions[i, 0], positions[i, 1], positions[i, 2]
                    count = counts[p]
                    for k in range(count):
                        j = neighbors[p, k]
                        dx = xi - positions[j, 0]
                        dy = yi - positions[j, 1]
                        dz = zi - positions[j, 2]
                        dxs[k], dys[k], dzs[k] = dx, dy, dz
                        rsqs[k] = dx * dx + dy * dy + dz * dz
                    for k in range(count):
                        inv_r2 = 1.0 / rsqs[k]
                        inv_r6 = inv_r2 * inv_r2 * inv_r2
                        inside = rsqs[k] < cutoff_sq
                        forces_over_r[k] = (12.0 * c12 * inv_r6 - 6.0 * c6) * inv_r6 * inv_r2 if inside else 0.0
                    if force_shift != 0.0:
                        for k in range(count):
                            if rsqs[k] < cutoff_sq:
                                forces_over_r[k] -= force_shift / math.sqrt(rsqs[k])
                    fx = 0.0
                    fy = 0.0
                    fz = 0.0
                    for k in range(count):
                        j = neighbors[p, k]
                        fpx = dxs[k] * forces_over_r[k]
                        fpy = dys[k] * forces_over_r[k]
                        fpz = dzs[k] * forces_over_r[k]
                        fx += fpx
                        fy += fpy
                        fz += fpz
                        forces[j, 0] -= fpx
                        forces[j, 1] -= fpy
                        forces[j, 2] -= fpz
                    forces[i, 0] += fx
                    forces[i, 1] += fy
                    forces[i, 2] += fz
                    if compute_energy:
                        energy = 0.0
                        virial = 0.0
                        for k in range(count):
                            if rsqs[k] < cutoff_sq:
                                inv_r2 = 1.0 / rsqs[k]
                                inv_r6 = inv_r2 * inv_r2 * inv_r2
                                pair_energy = (c12 * inv_r6 - c6) * inv_r6 - energy_shift
                                if force_shift != 0.0:
                                    pair_energy += force_shift * math.sqrt(rsqs[k])
                                pair_virial = rsqs[k] * forces_over_r[k]
                                energy += pair_energy
                                virial += pair_virial
                                j = neighbors[p, k]
                                energies[j, 0] += 0.5 * pair_energy
                                energies[j, 1] += 0.5 * pair_virial
                        energies[i, 0] += 0.5 * energy
                        energies[i, 1] += 0.5 * virial


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _half_forces_typed(positions, types, neighbors, counts, order, row_start, group_rows, group_start, color_start,
                       table, compute_energy, forces, energies):
    """Several atom types: the pair coefficients looked up per pair; otherwise as the one-type kernel."""
    for color in range(color_start.shape[0] - 1):
        for task in numba.prange(color_start[color], color_start[color + 1]):
            for number in range(group_start[task], group_start[task + 1]):
                row = group_rows[number]
                for p in range(row_start[row], row_start[row + 1]):
                    i = order[p]
                    xi, yi, zi = positions[i, 0], positions[i, 1], positions[i, 2]
                    type_i = types[i]
                    fx = 0.0
                    fy = 0.0
                    fz = 0.0
                    energy = 0.0
                    virial = 0.0
                    for k in range(counts[p]):
                        j = neighbors[p, k]
                        dx = xi - positions[j, 0]
                        dy = yi - positions[j, 1]
                        dz = zi - positions[j, 2]
                        rsq = dx * dx + dy * dy + dz * dz
                        type_j = types[j]
                        if rsq < table[type_i, type_j, 2]:
                            c12 = table[type_i, type_j, 0]
                            c6 = table[type_i, type_j, 1]
                            force_shift = table[type_i, type_j, 4]
                            inv_r2 = 1.0 / rsq
                            inv_r6 = inv_r2 * inv_r2 * inv_r2
                            force_over_r = (12.0 * c12 * inv_r6 - 6.0 * c6) * inv_r6 * inv_r2
                            if force_shift != 0.0:
                                force_over_r -= force_shift / math.sqrt(rsq)
                            fpx = dx * force_over_r
                            fpy = dy * force_over_r
                            fpz = dz * force_over_r
                            fx += fpx
                            fy += fpy
                            fz += fpz
                            forces[j, 0] -= fpx
                            forces[j, 1] -= fpy
                            forces[j, 2] -= fpz
                            if compute_energy:
                                pair_energy = (c12 * inv_r6 - c6) * inv_r6 - table[type_i, type_j, 3]
                                if force_shift != 0.0:
                                    pair_energy += force_shift * math.sqrt(rsq)
                                pair_virial = rsq * force_over_r
                                energy += pair_energy
                                virial += pair_virial
                                energies[j, 0] += 0.5 * pair_energy
                                energies[j, 1] += 0.5 * pair_virial
                    forces[i, 0] += fx
                    forces[i, 1] += fy
                    forces[i, 2] += fz
                    if compute_energy:
                        energies[i, 0] += 0.5 * energy
                        energies[i, 1] += 0.5 * virial

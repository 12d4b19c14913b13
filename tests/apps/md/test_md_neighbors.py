"""Ghosts, cell binning and neighbour lists against brute force; overflow handling; rebuild criterion."""

import numpy as np
import pytest

from apps.md import cells, forces, ghosts, neighbors, potential
from md_reference import neighbor_setup


def _random_gas(n_atoms=400, box=(7.0, 8.0, 9.0), seed=3):
    rng = np.random.default_rng(seed)
    box = np.asarray(box)
    return np.ascontiguousarray(rng.uniform(0, 1, (n_atoms, 3)) * box), box


def test_neighbor_list_equals_brute_force_on_random_gas():
    positions, box = _random_gas()
    all_positions, ghost, neighbor_list = neighbor_setup(positions, box, 2.5, 0.3)
    cutoff_sq = (2.5 + 0.3) ** 2
    counts = neighbor_list.counts
    for i in range(positions.shape[0]):
        listed = np.sort(neighbor_list.neighbors[: counts[i], i])
        distance_sq = ((all_positions - all_positions[i]) ** 2).sum(axis=1)
        expected = np.nonzero(distance_sq < cutoff_sq)[0]
        np.testing.assert_array_equal(listed, expected[expected != i])
    # Boxes wider than 2 * cutoff: the full list is exactly the minimum-image neighbour set.
    delta = positions[:, None, :] - positions[None, :, :]
    delta -= box * np.round(delta / box)
    minimum_image = ((delta**2).sum(-1) < cutoff_sq).sum(axis=1) - 1
    np.testing.assert_array_equal(counts, minimum_image)
    sources = [set(np.where(neighbor_list.neighbors[: counts[i], i] < positions.shape[0],
                            neighbor_list.neighbors[: counts[i], i],
                            ghost.source[neighbor_list.neighbors[: counts[i], i] - positions.shape[0]]))
               for i in range(positions.shape[0])]
    assert all(i in sources[j] for i in range(positions.shape[0]) for j in sources[i])  # symmetric


def test_list_order_is_the_27_cells_in_order_then_each_cell_in_atom_order():
    """The order the GPU build kernel and the thermo's bits depend on: the cell block z, y, x, each cell's
    atoms ascending (the stable counting sort), whatever way the CPU kernel walks it."""
    positions, box = _random_gas()
    all_positions, _, neighbor_list = neighbor_setup(positions, box, 2.5, 0.3)
    grid = cells.make_cell_grid(np.zeros(3), box, 2.8, 2.8)
    cell_list = cells.bin_atoms(all_positions, grid)
    nx, ny, nz = grid.shape
    cell_of = np.empty(all_positions.shape[0], dtype=int)
    for cell in range(grid.n_cells):
        cell_of[cell_list.cell_atoms[cell_list.cell_start[cell]:cell_list.cell_start[cell + 1]]] = cell
    for i in range(positions.shape[0]):
        cz, cy, cx = cell_of[i] // (nx * ny), cell_of[i] // nx % ny, cell_of[i] % nx
        expected = [j for z in range(max(cz - 1, 0), min(cz + 2, nz)) for y in range(max(cy - 1, 0), min(cy + 2, ny))
                    for x in range(max(cx - 1, 0), min(cx + 2, nx))
                    for j in cell_list.cell_atoms[cell_list.cell_start[(z * ny + y) * nx + x]:
                                                  cell_list.cell_start[(z * ny + y) * nx + x + 1]]
                    if j != i and ((all_positions[j] - all_positions[i]) ** 2).sum() < 2.8 ** 2]
        np.testing.assert_array_equal(neighbor_list.neighbors[:neighbor_list.counts[i], i], expected)


def test_periodic_ghosts_are_shifted_copies_covering_the_shell():
    positions, box = _random_gas(n_atoms=200, box=(5.0, 6.0, 4.0))
    width = 2.8  # wider than half the z box: several images per axis
    ghost = ghosts.make_periodic_ghosts(positions, box, width)
    np.testing.assert_allclose(ghost.positions, positions[ghost.source] + ghost.shifts)
    assert np.all(ghost.positions >= -width) and np.all(ghost.positions < box + width)
    image = np.round(ghost.shifts / box).astype(int)
    assert np.all(np.any(image != 0, axis=1))
    # Count check: every image of every atom that lands in the extended box appears exactly once.
    expected = 0
    n_images = np.ceil(width / box).astype(int)
    for shift in np.array(np.meshgrid(*[np.arange(-n, n + 1) for n in n_images], indexing="ij")).reshape(3, -1).T:
        if np.any(shift != 0):
            moved = positions + shift * box
            expected += np.all((moved >= -width) & (moved < box + width), axis=1).sum()
    assert ghost.positions.shape[0] == expected
    assert len({(s, *i) for s, i in zip(ghost.source.tolist(), image.tolist())}) == expected


def test_counting_sort_bins_every_atom_in_its_cell():
    positions, box = _random_gas()
    grid = cells.make_cell_grid(np.zeros(3), box, 0.0, 2.0)
    cell_list = cells.bin_atoms(positions, grid)
    assert sorted(cell_list.cell_atoms.tolist()) == list(range(positions.shape[0]))
    index = np.floor(positions / grid.cell_size).astype(int)
    flat = (index[:, 2] * grid.shape[1] + index[:, 1]) * grid.shape[0] + index[:, 0]
    for cell in range(grid.n_cells):
        members = cell_list.cell_atoms[cell_list.cell_start[cell]: cell_list.cell_start[cell + 1]]
        np.testing.assert_array_equal(members, np.nonzero(flat == cell)[0])  # stable order on CPU


def test_overflow_reallocates_and_gives_the_same_forces(perturbed_fcc):
    positions, types, box, _ = perturbed_fcc
    lj = potential.lennard_jones(cutoff=2.5, variant="shift")
    all_positions, ghost, small = neighbor_setup(positions, box, 2.5, 0.3, capacity=4)
    _, _, large = neighbor_setup(positions, box, 2.5, 0.3, capacity=500)
    assert small.n_reallocations >= 1 and small.capacity >= int(large.counts.max())
    np.testing.assert_array_equal(small.counts, large.counts)
    all_types = np.zeros(all_positions.shape[0], np.int32)
    results = []
    for neighbor_list in (small, large):
        out = np.empty_like(positions)
        energy = forces.compute_forces(all_positions, all_types, neighbor_list, lj.pair_table(), out)
        results.append((out, energy))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_build_kernel_reports_needed_capacity_without_writing_past_it(perturbed_fcc):
    positions, _, box, _ = perturbed_fcc
    all_positions, _, reference = neighbor_setup(positions, box, 2.5, 0.3)
    grid = cells.make_cell_grid(np.zeros(3), box, 2.8, 2.8)
    cell_list = cells.bin_atoms(all_positions, grid)
    capacity = 10
    storage = np.full((capacity + 1, positions.shape[0]), -7, dtype=np.int32)  # last row is a guard
    counts = np.zeros(positions.shape[0], np.int32)
    needed = neighbors._build_once(all_positions, positions.shape[0], cell_list, grid, 2.8, storage[:capacity], counts)
    assert needed == int(reference.counts.max()) > capacity
    assert np.all(storage[capacity] == -7)


def test_binning_and_the_list_stay_in_bounds_for_any_positions():
    """The buffers sized in advance (cell_atoms: one slot per atom; the neighbour rows: a capacity) at the
    inputs that could break them: positions that are NaN, infinite or far outside the grid are clamped
    into an edge cell, and 120 atoms on one point need far more neighbours than the estimate; the list
    grows to fit and the kernel never writes past the capacity it was given (a guard row stays intact)."""
    positions, box = _random_gas()
    positions[:120] = box / 2                                    # one point: 119 neighbours each
    positions[120:126] = [[np.nan] * 3, [np.inf] * 3, [-np.inf] * 3, [1e300, -1e300, 0], [-1e300, 1e300, 5],
                          [np.nan, 1.0, np.inf]]
    grid = cells.make_cell_grid(np.zeros(3), box, 0.0, 2.8)
    cell_list = cells.bin_atoms(positions, grid)
    assert sorted(cell_list.cell_atoms.tolist()) == list(range(positions.shape[0]))
    assert cell_list.cell_start[0] == 0 and cell_list.cell_start[-1] == positions.shape[0]
    assert np.all(np.diff(cell_list.cell_start) >= 0)
    n_local = positions.shape[0]
    built = neighbors.build_neighbor_list(positions, n_local, cell_list, grid, 2.5, 0.3, capacity=1)
    assert built.n_reallocations >= 1 and built.capacity >= int(built.counts.max()) >= 119
    assert np.all(built.counts[120:126] == 0)                    # NaN and infinite atoms have no neighbours
    storage = np.full((9, n_local), -7, dtype=np.int32)          # capacity 8, the last row a guard
    counts = np.zeros(n_local, np.int32)
    needed = neighbors._build_once(positions, n_local, cell_list, grid, 2.8, storage[:8], counts)
    assert needed == int(built.counts.max()) and np.all(storage[8] == -7)


def test_rebuild_criterion_is_half_the_skin(perturbed_fcc):
    positions, _, box, _ = perturbed_fcc
    all_positions, _, neighbor_list = neighbor_setup(positions, box, 2.5, 0.4)
    moved = all_positions.copy()
    moved[5, 1] += 0.199
    assert not neighbors.needs_rebuild(moved, neighbor_list)
    moved[5, 1] += 0.002
    assert neighbors.needs_rebuild(moved, neighbor_list)


def test_cells_narrower_than_cutoff_are_rejected():
    positions, box = _random_gas()
    grid = cells.make_cell_grid(np.zeros(3), box, 2.8, 1.0)
    with pytest.raises(Exception, match="at least"):
        neighbors.build_neighbor_list(positions, positions.shape[0], cells.bin_atoms(positions, grid), grid, 2.5, 0.3)

"""CPU half lists with Newton's third law: the pairs of the full list, each owned pair once, the same
forces, energy and virial as the full list to rounding, and the same bits on any number of threads."""

import numba
import numpy as np
import pytest

from apps.md import cells, forces, half_list, lattice, potential
from md_reference import neighbor_setup


def _half_setup(positions, box, pair_cutoff, skin, capacity=4):
    all_positions, ghost, full = neighbor_setup(positions, box, pair_cutoff, skin)
    width = pair_cutoff + skin
    grid = cells.make_cell_grid(np.zeros(3), box, width, width)
    half = half_list.build_half_neighbor_list(all_positions, positions.shape[0], cells.bin_atoms(all_positions, grid),
                                              grid, width, skin, capacity, 1.25)
    return all_positions, ghost, full, half


def test_each_owned_pair_once_and_every_ghost_pair_on_the_owned_side(perturbed_fcc):
    positions, _, box, _ = perturbed_fcc
    all_positions, _, full, half = _half_setup(positions, box, 2.5, 0.3)
    n_local = positions.shape[0]
    assert half.n_reallocations >= 1          # capacity 4 was too small: grown, nothing lost
    assert sorted(half.order.tolist()) == list(range(n_local))
    full_pairs = {(i, int(j)) for i in range(n_local) for j in full.neighbors[:full.counts[i], i]}
    half_pairs = [(int(half.order[p]), int(j)) for p in range(n_local) for j in half.neighbors[p, :half.counts[p]]]
    assert len(half_pairs) == len(set(half_pairs))
    owned = [(i, j) for i, j in half_pairs if j < n_local]
    ghost = {(i, j) for i, j in half_pairs if j >= n_local}
    assert {(i, j) for i, j in full_pairs if j >= n_local} == ghost
    assert len(owned) * 2 == sum(1 for _, j in full_pairs if j < n_local)
    assert set(owned) | {(j, i) for i, j in owned} == {(i, j) for i, j in full_pairs if j < n_local}


@pytest.mark.parametrize("variant", ["plain", "force_shift"])
def test_forces_energy_virial_equal_the_full_list(perturbed_fcc, variant):
    positions, types, box, _ = perturbed_fcc
    lj = potential.lennard_jones(epsilon=[1.0, 0.6], sigma=[1.0, 0.85], cutoff=2.3, variant=variant,
                                 mixing="arithmetic")
    all_positions, ghost, full, half = _half_setup(positions, box, lj.max_cutoff, 0.3)
    all_types = np.concatenate([types, types[ghost.source]]).astype(np.int32)
    table = lj.pair_table()
    expected, found = np.empty_like(positions), np.empty_like(positions)
    expected_shares = forces.compute_forces_per_atom(all_positions, all_types, full, table, expected)
    found_shares = forces.compute_forces_per_atom(all_positions, all_types, half, table, found)
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-11)
    for mine, theirs in zip(found_shares, expected_shares):
        assert mine.sum() == pytest.approx(theirs.sum(), rel=1e-13)
    assert np.abs(found.sum(axis=0)).max() < 1e-10     # Newton's third law: no net force
    alone = np.empty_like(positions)
    assert forces.compute_forces(all_positions, all_types, half, table, alone, compute_energy=False) is None
    np.testing.assert_array_equal(alone, found)


def test_same_bits_on_one_and_two_threads():
    """11^3 fcc cells (5,324 atoms, above SERIAL_BELOW: the colours run on the threads), one type."""
    positions, _, box = lattice.make_lattice("fcc", 0.8442, (11, 11, 11))
    positions = (positions + np.random.default_rng(5).uniform(-0.1, 0.1, positions.shape)) % box
    assert positions.shape[0] >= half_list.SERIAL_BELOW
    all_positions, _, _, half = _half_setup(np.ascontiguousarray(positions), box, 2.5, 0.3, capacity=64)
    table = potential.lennard_jones(cutoff=2.5).pair_table()
    types = np.zeros(all_positions.shape[0], np.int32)
    results = []
    previous = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            result = np.empty_like(positions)
            shares = forces.compute_forces_per_atom(all_positions, types, half, table, result)
            results.append((result, *shares))
    finally:
        numba.set_num_threads(previous)
    for first, second in zip(results[0], results[-1]):
        np.testing.assert_array_equal(first, second)

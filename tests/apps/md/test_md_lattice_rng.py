"""Lattices, id-keyed thermal velocities and the counter-based random numbers."""

import numpy as np
import pytest

from apps.md import lattice, rng, thermo

_MASK = (1 << 64) - 1


def _splitmix64_reference(z):
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _gaussian3_reference(seed, step, atom_id):
    """Pure-Python big-integer reference of apps.md.rng (documents the exact bit recipe)."""
    key = _splitmix64_reference(_splitmix64_reference(_splitmix64_reference(seed & _MASK) ^ (step & _MASK))
                                ^ (atom_id & _MASK))
    u = [((_splitmix64_reference((key + k) & _MASK) >> 11) + 1) * 2.0**-53 for k in range(4)]
    r01, r2 = np.sqrt(-2 * np.log(u[0])), np.sqrt(-2 * np.log(u[2]))
    return [r01 * np.cos(2 * np.pi * u[1]), r01 * np.sin(2 * np.pi * u[1]), r2 * np.cos(2 * np.pi * u[3])]


@pytest.mark.parametrize("lattice_kind,n_basis", [("fcc", 4), ("bcc", 2), ("sc", 1)])
def test_lattice_density_and_nearest_neighbour_distance(lattice_kind, n_basis):
    positions, atom_ids, box = lattice.make_lattice(lattice_kind, 0.8442, (3, 4, 5))
    assert positions.shape == (60 * n_basis, 3)
    assert positions.shape[0] / np.prod(box) == pytest.approx(0.8442)
    np.testing.assert_array_equal(atom_ids, np.arange(1, positions.shape[0] + 1))
    delta = positions[:, None] - positions[None]
    delta -= box * np.round(delta / box)
    distance = np.sqrt((delta**2).sum(-1)) + np.eye(len(positions)) * 1e9
    a = lattice.lattice_constant(lattice_kind, 0.8442)
    expected = {"fcc": a / np.sqrt(2), "bcc": a * np.sqrt(3) / 2, "sc": a}[lattice_kind]
    assert distance.min() == pytest.approx(expected)


def test_sub_box_lattices_partition_the_sites_with_the_same_ids():
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (4, 4, 4))
    half = box / 2
    parts = [lattice.make_lattice("fcc", 0.8442, (4, 4, 4), lower=[x, 0, 0], upper=[x + half[0], box[1], box[2]])
             for x in (0.0, half[0])]
    ids = np.concatenate([p[1] for p in parts])
    np.testing.assert_array_equal(np.sort(ids), atom_ids)
    for part_positions, part_ids, _ in parts:
        np.testing.assert_array_equal(part_positions, positions[part_ids - 1])


def test_thermal_velocities_exact_temperature_zero_momentum_and_id_keyed():
    _, atom_ids, _ = lattice.make_lattice("fcc", 0.8442, (3, 3, 3))
    masses = np.where(atom_ids % 3 == 0, 2.0, 1.0)
    velocities = lattice.thermal_velocities(atom_ids, masses, 1.44, seed=87287)
    np.testing.assert_allclose((masses[:, None] * velocities).sum(axis=0), 0.0, atol=1e-12)
    assert thermo.temperature(thermo.kinetic_energy(velocities, masses), atom_ids.size) == pytest.approx(1.44, rel=1e-13)
    order = np.random.default_rng(1).permutation(atom_ids.size)
    permuted = lattice.thermal_velocities(atom_ids[order], masses[order], 1.44, seed=87287)
    np.testing.assert_allclose(permuted, velocities[order], rtol=1e-13, atol=1e-14)


def test_two_rank_emulation_matches_one_rank():
    _, atom_ids, _ = lattice.make_lattice("fcc", 0.8442, (3, 3, 3))
    masses = np.ones(atom_ids.size)
    reference = lattice.thermal_velocities(atom_ids, masses, 1.44, 5)
    parts = [slice(0, 40), slice(40, None)]
    # Pass 1: collect each rank's contribution to the first allreduce (momentum, mass, count).
    first = [None, None]
    for rank, part in enumerate(parts):
        def capture(values, rank=rank):
            if first[rank] is None:
                first[rank] = values.copy()
            return values
        lattice.thermal_velocities(atom_ids[part], masses[part], 1.44, 5, allreduce_fn=capture)
    first_total = first[0] + first[1]
    # Pass 2: with the global first sum known, collect the kinetic-energy contributions.
    second = [None, None]
    for rank, part in enumerate(parts):
        def capture_second(values, rank=rank):
            if values.size == 5:
                return first_total
            second[rank] = values.copy()
            return values
        lattice.thermal_velocities(atom_ids[part], masses[part], 1.44, 5, allreduce_fn=capture_second)
    second_total = second[0] + second[1]
    result = [lattice.thermal_velocities(atom_ids[part], masses[part], 1.44, 5,
                                         allreduce_fn=lambda v: first_total if v.size == 5 else second_total)
              for part in parts]
    np.testing.assert_allclose(np.concatenate(result), reference, rtol=1e-13, atol=1e-14)


def test_numba_gaussians_match_the_bit_exact_reference():
    atom_ids = np.array([1, 2, 3, 1000, 2**40 + 7, 31999], dtype=np.int64)
    for seed, step in [(0, 0), (87287, 15), (-3, rng.VELOCITY_STREAM)]:
        result = rng.gaussian_noise(seed, step, atom_ids)
        expected = np.array([_gaussian3_reference(seed, step, int(i)) for i in atom_ids])
        np.testing.assert_allclose(result, expected, rtol=1e-14, atol=1e-15)


def test_gaussian_noise_statistics():
    noise = rng.gaussian_noise(11, 3, np.arange(1, 200001, dtype=np.int64))
    assert np.abs(noise.mean(axis=0)).max() < 0.01
    np.testing.assert_allclose(noise.var(axis=0), 1.0, atol=0.01)
    assert abs(np.corrcoef(noise.T)[0, 1]) < 0.01
    other_step = rng.gaussian_noise(11, 4, np.arange(1, 200001, dtype=np.int64))
    assert abs(np.corrcoef(noise[:, 0], other_step[:, 0])[0, 1]) < 0.01

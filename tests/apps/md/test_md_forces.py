"""Forces, energy and virial: LAMMPS bench/in.lj reference values, lattice sums, finite differences."""

import numpy as np
import pytest

from apps.md import forces, lattice, potential, serial, thermo
from md_reference import neighbor_setup, reference_energy_forces


def _in_lj_thermo(cells):
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells, cells, cells))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3)
    state = serial.init(positions, velocities, box, config, atom_ids=atom_ids)
    return serial.thermo(state, config), atom_ids.size, float(np.prod(box))


def test_lammps_bench_in_lj_step_zero():
    """LAMMPS bench/in.lj log, step 0: Temp 1.44, E_pair -6.7733681, TotEng -4.6134356, Press -5.0197073."""
    sample, n_atoms, _ = _in_lj_thermo(20)
    assert n_atoms == 32000
    assert sample.temperature == pytest.approx(1.44, rel=1e-12)
    assert f"{sample.pair_energy:.8g}" == "-6.7733681"
    assert f"{sample.total_energy:.8g}" == "-4.6134356"
    assert f"{sample.pressure:.8g}" == "-5.0197073"
    assert thermo.format_thermo(sample).split() == ["0", "1.44", "-6.7733681", "-4.6134356", "-5.0197073"]


def _fcc_lattice_sum(density, cutoff):
    """Per-atom energy and virial of a perfect fcc crystal: sum over lattice vectors within the cutoff."""
    a = lattice.lattice_constant("fcc", density)
    n = int(np.ceil(2 * cutoff / a)) + 1
    grid = np.array(np.meshgrid(*[np.arange(-n, n + 1)] * 3, indexing="ij")).reshape(3, -1).T
    grid = grid[(grid.sum(axis=1) % 2 == 0) & np.any(grid != 0, axis=1)]  # fcc = even-sum half-integer lattice
    r = np.linalg.norm(grid * a / 2, axis=1)
    r = r[r < cutoff]
    lj = potential.lennard_jones(cutoff=cutoff)
    return 0.5 * lj.energy(r, 0, 0).sum(), 0.5 * (r * lj.force(r, 0, 0)).sum()


def test_in_lj_10_cells_matches_lattice_sum():
    sample, n_atoms, volume = _in_lj_thermo(10)
    energy_per_atom, virial_per_atom = _fcc_lattice_sum(0.8442, 2.5)
    assert sample.pair_energy == pytest.approx(energy_per_atom, rel=1e-12)
    expected_pressure = (n_atoms - 1) * 1.44 / volume + n_atoms * virial_per_atom / (3 * volume)
    assert sample.pressure == pytest.approx(expected_pressure, rel=1e-12)
    assert f"{energy_per_atom:.8g}" == "-6.7733681"


@pytest.mark.parametrize("variant", ["plain", "shift", "force_shift"])
def test_forces_match_numpy_reference_and_finite_differences(perturbed_fcc, variant):
    positions, types, box, _ = perturbed_fcc
    lj = potential.lennard_jones(epsilon=[1.0, 0.6], sigma=[1.0, 0.85], cutoff=2.3, variant=variant,
                                 mixing="arithmetic")
    table = lj.pair_table()

    def energy_and_forces(owned):
        all_positions, ghost, neighbor_list = neighbor_setup(owned, box, lj.max_cutoff, 0.3)
        all_types = np.concatenate([types, types[ghost.source]])
        result = np.empty_like(owned)
        energy_virial = forces.compute_forces(all_positions, all_types, neighbor_list, table, result)
        return energy_virial, result

    (energy, virial), result = energy_and_forces(positions)
    ref_energy, ref_forces, ref_virial = reference_energy_forces(positions, types, box, lj)
    assert energy == pytest.approx(ref_energy, rel=1e-12)
    assert virial == pytest.approx(ref_virial, rel=1e-12)
    np.testing.assert_allclose(result, ref_forces, rtol=1e-10, atol=1e-10)
    # Central differences of the total energy for a few coordinates: f = -dE/dx.
    step = 1e-5
    for atom, axis in [(0, 0), (17, 1), (101, 2), (254, 0)]:
        plus, minus = positions.copy(), positions.copy()
        plus[atom, axis] += step
        minus[atom, axis] -= step
        derivative = (energy_and_forces(plus)[0][0] - energy_and_forces(minus)[0][0]) / (2 * step)
        assert -derivative == pytest.approx(result[atom, axis], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("variant", ["plain", "shift", "force_shift"])
def test_one_type_cpu_kernel_gives_the_general_kernels_bits(perturbed_fcc, variant, dtype):
    positions, _, box, _ = perturbed_fcc
    lj = potential.lennard_jones(cutoff=2.5, variant=variant)
    all_positions, _, neighbor_list = neighbor_setup(positions, box, lj.max_cutoff, 0.3)
    all_positions = all_positions.astype(dtype)
    types = np.zeros(all_positions.shape[0], dtype=np.int32)
    table = lj.pair_table(dtype=dtype)
    results = []
    for kernel in (forces._forces_cpu, forces._forces_cpu_one_type):
        result = (np.empty((positions.shape[0], 3), dtype=dtype), np.empty(positions.shape[0]),
                  np.empty(positions.shape[0]))
        kernel(all_positions, types, neighbor_list.neighbors, neighbor_list.counts, table, *result)
        results.append(result)
    for general, one_type in zip(*results):
        np.testing.assert_array_equal(one_type, general)


def test_float32_forces_close_to_float64(perturbed_fcc):
    positions, types, box, _ = perturbed_fcc
    lj = potential.lennard_jones(cutoff=2.5)
    all_positions, ghost, neighbor_list = neighbor_setup(positions, box, 2.5, 0.3)
    all_types = np.concatenate([types * 0, types[ghost.source] * 0])
    result64 = np.empty_like(positions)
    ev64 = forces.compute_forces(all_positions, all_types, neighbor_list, lj.pair_table(), result64)
    positions32 = all_positions.astype(np.float32)
    result32 = np.empty(positions.shape, np.float32)
    ev32 = forces.compute_forces(positions32, all_types, neighbor_list, lj.pair_table(np.float32), result32)
    np.testing.assert_allclose(result32, result64, atol=2e-3 * np.abs(result64).max())
    np.testing.assert_allclose(ev32, ev64, rtol=1e-4)

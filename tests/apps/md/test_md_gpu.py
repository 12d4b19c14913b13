"""CPU/GPU parity of the MD kernels (CuPy RawKernels). Run on a GPU machine:

    python -m pytest tests/apps/md/test_md_gpu.py -m gpu -q
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from apps.md import cells, forces, ghosts, integrate, lattice, neighbors, potential, rng, serial, thermo
from md_reference import neighbor_setup

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # CuPy installed without a usable GPU
        pytest.skip("no CUDA device")
    return cupy


def _gpu_neighbor_setup(cupy, positions, box, pair_cutoff, skin, dtype):
    width = pair_cutoff + skin
    owned = cupy.asarray(positions, dtype=dtype)
    ghost = ghosts.make_periodic_ghosts(owned, box, width)
    all_positions = cupy.ascontiguousarray(cupy.concatenate([owned, ghost.positions]))
    grid = cells.make_cell_grid(np.zeros(3), box, width, width)
    cell_list = cells.bin_atoms(all_positions, grid)
    neighbor_list = neighbors.build_neighbor_list(all_positions, positions.shape[0], cell_list, grid,
                                                  pair_cutoff, skin)
    return all_positions, ghost, neighbor_list


def test_random_numbers_match_cpu(cupy):
    atom_ids = np.arange(1, 5001, dtype=np.int64) * 7919
    cpu = rng.gaussian_noise(123, 45, atom_ids)
    gpu = rng.gaussian_noise(123, 45, cupy.asarray(atom_ids)).get()
    np.testing.assert_allclose(gpu, cpu, rtol=1e-13, atol=1e-13)


def test_neighbor_sets_and_ghosts_match_cpu(cupy, perturbed_fcc):
    positions, _, box, _ = perturbed_fcc
    cpu_positions, cpu_ghost, cpu_list = neighbor_setup(positions, box, 2.5, 0.3)
    gpu_positions, gpu_ghost, gpu_list = _gpu_neighbor_setup(cupy, positions, box, 2.5, 0.3, np.float64)
    np.testing.assert_array_equal(gpu_ghost.source.get(), cpu_ghost.source)
    np.testing.assert_allclose(gpu_positions.get(), cpu_positions)
    np.testing.assert_array_equal(gpu_list.counts.get(), cpu_list.counts)
    gpu_neighbors = gpu_list.neighbors.get()
    for i in range(positions.shape[0]):
        count = cpu_list.counts[i]
        assert set(gpu_neighbors[:count, i]) == set(cpu_list.neighbors[:count, i])  # order may differ on GPU


def test_gpu_overflow_reallocates(cupy, perturbed_fcc):
    positions, _, box, _ = perturbed_fcc
    owned = cupy.asarray(positions)
    ghost = ghosts.make_periodic_ghosts(owned, box, 2.8)
    all_positions = cupy.concatenate([owned, ghost.positions])
    grid = cells.make_cell_grid(np.zeros(3), box, 2.8, 2.8)
    small = neighbors.build_neighbor_list(all_positions, positions.shape[0], cells.bin_atoms(all_positions, grid),
                                          grid, 2.5, 0.3, capacity=3)
    assert small.n_reallocations >= 1 and small.capacity >= int(small.counts.max())


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-11), (np.float32, 2e-4)])
@pytest.mark.parametrize("variant", ["plain", "force_shift"])
def test_forces_energy_virial_match_cpu(cupy, perturbed_fcc, dtype, tolerance, variant):
    positions, types, box, _ = perturbed_fcc
    lj = potential.lennard_jones(epsilon=[1.0, 0.6], sigma=[1.0, 0.85], cutoff=2.5, variant=variant)
    cpu_positions, cpu_ghost, cpu_list = neighbor_setup(positions, box, 2.5, 0.3)
    cpu_types = np.concatenate([types, types[cpu_ghost.source]])
    cpu_forces = np.empty_like(positions)
    cpu_ev = forces.compute_forces(cpu_positions, cpu_types, cpu_list, lj.pair_table(), cpu_forces)
    gpu_positions, gpu_ghost, gpu_list = _gpu_neighbor_setup(cupy, positions, box, 2.5, 0.3, dtype)
    gpu_types = cupy.asarray(np.concatenate([types, types[gpu_ghost.source.get()]]))
    gpu_forces = cupy.empty(positions.shape, dtype=dtype)
    gpu_ev = forces.compute_forces(gpu_positions, gpu_types, gpu_list, forces.device_pair_table(lj, gpu_positions),
                                   gpu_forces).get()
    scale = np.abs(cpu_forces).max()
    np.testing.assert_allclose(gpu_forces.get(), cpu_forces, atol=tolerance * scale)
    np.testing.assert_allclose(gpu_ev, cpu_ev, rtol=tolerance)
    assert forces.compute_forces(gpu_positions, gpu_types, gpu_list, forces.device_pair_table(lj, gpu_positions),
                                 gpu_forces, compute_energy=False) is None
    # Per-atom (E_pair, W) shares on the device, atom by atom like the CPU's (the device thermo sums them).
    cpu_energy, cpu_virial = forces.compute_forces_per_atom(cpu_positions, cpu_types, cpu_list, lj.pair_table(),
                                                            np.empty_like(positions))
    gpu_energy, gpu_virial = forces.compute_forces_per_atom(gpu_positions, gpu_types, gpu_list,
                                                            forces.device_pair_table(lj, gpu_positions), gpu_forces)
    assert gpu_energy.shape == (positions.shape[0],) and gpu_energy.dtype == np.float64
    np.testing.assert_allclose(gpu_energy.get(), cpu_energy, rtol=tolerance, atol=tolerance * np.abs(cpu_energy).max())
    np.testing.assert_allclose(gpu_virial.get(), cpu_virial, rtol=tolerance, atol=tolerance * np.abs(cpu_virial).max())
    ones = np.ones(positions.shape[0])
    np.testing.assert_allclose(thermo.kinetic_energy_per_atom(cupy.asarray(cpu_forces), cupy.asarray(ones)).get(),
                               thermo.kinetic_energy_per_atom(cpu_forces, ones), rtol=1e-14)


def test_integrators_and_kinetic_energy_match_cpu(cupy):
    generator = np.random.default_rng(3)
    n_atoms = 1000
    arrays = {name: generator.normal(size=(n_atoms, 3)) for name in ("positions", "velocities", "forces")}
    masses = generator.uniform(1, 2, n_atoms)
    atom_ids = generator.permutation(n_atoms).astype(np.int64) + 1
    gpu = {name: cupy.asarray(value) for name, value in arrays.items()}
    gpu_masses, gpu_ids = cupy.asarray(masses), cupy.asarray(atom_ids)
    integrate.velocity_verlet_first_half(arrays["positions"], arrays["velocities"], arrays["forces"], masses, 0.005)
    integrate.velocity_verlet_first_half(gpu["positions"], gpu["velocities"], gpu["forces"], gpu_masses, 0.005)
    integrate.langevin_forces(arrays["forces"], arrays["velocities"], masses, atom_ids, 1.2, 0.5, 0.005, 9, 100)
    integrate.langevin_forces(gpu["forces"], gpu["velocities"], gpu_masses, gpu_ids, 1.2, 0.5, 0.005, 9, 100)
    integrate.velocity_verlet_second_half(arrays["velocities"], arrays["forces"], masses, 0.005)
    integrate.velocity_verlet_second_half(gpu["velocities"], gpu["forces"], gpu_masses, 0.005)
    for name in arrays:
        np.testing.assert_allclose(gpu[name].get(), arrays[name], rtol=1e-12, atol=1e-12)
    assert thermo.kinetic_energy(gpu["velocities"], gpu_masses) == pytest.approx(
        thermo.kinetic_energy(arrays["velocities"], masses), rel=1e-12)


def test_wrap_and_ghost_update_match_cpu(cupy):
    generator = np.random.default_rng(4)
    box = np.array([5.0, 6.0, 7.0])
    positions = generator.uniform(-8, 15, (300, 3))
    images = np.zeros((300, 3), np.int32)
    gpu_positions, gpu_images = cupy.asarray(positions), cupy.asarray(images)
    ghosts.wrap_positions(positions, images, box)
    ghosts.wrap_positions(gpu_positions, gpu_images, box)
    np.testing.assert_allclose(gpu_positions.get(), positions, atol=1e-12)
    np.testing.assert_array_equal(gpu_images.get(), images)
    ghost = ghosts.make_periodic_ghosts(gpu_positions, box, 2.8)
    everything = cupy.concatenate([gpu_positions, ghost.positions])
    everything[:300] += 0.01
    ghosts.update_ghost_positions(everything, 300, ghost.source, ghost.shifts)
    np.testing.assert_allclose(everything[300:].get(), (everything[:300][ghost.source] + ghost.shifts).get())


@pytest.mark.parametrize("thermostat", [None, "langevin"])
def test_serial_steps_match_cpu_in_float64(cupy, thermostat):
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (5, 5, 5))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), thermostat=thermostat,
                             temperature=1.0, damping=0.5)
    cpu = serial.init(positions, velocities, box, config, atom_ids=atom_ids)
    gpu = serial.init(positions, velocities, box, config, atom_ids=atom_ids, xp=cupy)
    for _ in range(25):
        serial.step(cpu, config)
        serial.step(gpu, config)
    cpu_arrays, gpu_arrays = serial.host_arrays_by_id(cpu), serial.host_arrays_by_id(gpu)
    np.testing.assert_allclose(gpu_arrays["positions"] + gpu_arrays["images"] * box,
                               cpu_arrays["positions"] + cpu_arrays["images"] * box, atol=1e-8)
    np.testing.assert_allclose(gpu_arrays["velocities"], cpu_arrays["velocities"], atol=1e-8)
    assert serial.thermo(gpu, config).pair_energy == pytest.approx(serial.thermo(cpu, config).pair_energy, rel=1e-10)


def test_float32_fast_path_tracks_float64(cupy):
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (6, 6, 6))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5))
    samples = []
    for dtype in (np.float64, np.float32):
        state = serial.init(positions, velocities, box, config, atom_ids=atom_ids, xp=cupy, dtype=dtype)
        assert serial.thermo(state, config).pair_energy == pytest.approx(-6.7733681, rel=1e-5)
        for _ in range(20):
            serial.step(state, config)
        samples.append(serial.thermo(state, config))
    assert samples[1].total_energy == pytest.approx(samples[0].total_energy, abs=1e-4)
    assert samples[1].temperature == pytest.approx(samples[0].temperature, rel=1e-3)


def test_benchmark_runs(cupy):
    """``benchmarks/md_serial_step.py`` (the one-process GPU step benchmark) at a tiny size."""
    spec = importlib.util.spec_from_file_location(
        "md_serial_step", Path(__file__).resolve().parents[3] / "benchmarks" / "md_serial_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.benchmark_step(cells=6, steps=5, warmup_steps=2)
    assert result["n_atoms"] == 864 and result["atom_steps_per_second"] > 0

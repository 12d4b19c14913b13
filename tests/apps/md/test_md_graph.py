"""CUDA graphs of the MD step (apps.md.step_graph) and deterministic GPU binning.

A run that replays the sync-free parts of its steps as CUDA graphs must be BITWISE the run that launches
the same kernels one by one (NVE and Langevin, 100 steps with rebuilds, lazy checks with replays). GPU
binning sorts each cell, so its cell list equals the CPU's stable counting sort. Run on the GPU machine::

    python -m pytest tests/apps/md/test_md_graph.py -m gpu -q
"""

import numpy as np
import pytest

from apps.md import cells, distributed, lattice, potential, serial

pytestmark = pytest.mark.gpu


def test_gpu_cell_list_equals_cpu(cupy):
    rng = np.random.default_rng(5)
    positions = rng.uniform(0, 12, (5000, 3))
    grid = cells.make_cell_grid(np.zeros(3), np.full(3, 12.0), 0.0, 2.8)
    cpu = cells.bin_atoms(positions, grid)
    gpu = cells.bin_atoms(cupy.asarray(positions), grid)
    np.testing.assert_array_equal(gpu.cell_start.get(), cpu.cell_start)
    np.testing.assert_array_equal(gpu.cell_atoms.get(), cpu.cell_atoms)


def _run(comm, graph, dtype, thermostat, steps=100, cells_per_axis=6):
    import cupy

    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    arch = hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)   # the compute stream, as the app uses it
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells_per_axis,) * 3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, check_interval=10,
                             thermostat=thermostat, temperature=1.0, damping=0.5, graph=graph, resident=False)
    domain = ParticleDomain(comm, box, config.ghost_width)
    state = distributed.init(domain, positions, velocities, config, atom_ids=atom_ids, xp=cupy, dtype=dtype)
    samples = [tuple(distributed.thermo(state, config))]
    for _ in range(steps):
        want = (state.step + 1) % 25 == 0
        distributed.step(state, config, compute_energy=want)
        if want:
            samples.append(tuple(distributed.thermo(state, config)))
    distributed.settle(state, config)
    # Capturing a graph must leave the compute stream current (all later work, and the phase timers'
    # events, are ordered on it); CuPy's ``with stream:`` would have left the null stream instead.
    assert cupy.cuda.get_current_stream().ptr == arch.compute_stream.ptr
    return np.array(samples), distributed.gather_by_id(state), state


@pytest.mark.mpi(ranks=[1], timeout=300)
def test_graph_run_is_bitwise_the_eager_run(comm, cupy):
    """NVE fp32, Langevin fp32 and fp64: 100 steps with rebuilds and lazy checks, graph on vs off."""
    for dtype, thermostat in ((np.float32, None), (np.float32, "langevin"), (np.float64, "langevin")):
        case = f"{np.dtype(dtype).name} {thermostat}"
        graph_thermo, graph_atoms, graph_state = _run(comm, True, dtype, thermostat)
        eager_thermo, eager_atoms, eager_state = _run(comm, False, dtype, thermostat)
        assert eager_state.graphs is None and graph_state.graphs is not None, case
        summary = graph_state.graphs.summary()
        print(case, "graphs", summary, "builds", graph_state.n_builds, "checks", graph_state.watch.summary())
        assert summary["launches"] > 100 and summary["captures"] >= graph_state.n_builds - 1, (case, summary)
        assert graph_state.n_builds == eager_state.n_builds > 3, case
        assert graph_state.watch.summary() == eager_state.watch.summary(), case
        np.testing.assert_array_equal(graph_thermo, eager_thermo, err_msg=case)
        for name in ("atom_ids", "positions", "velocities", "images"):
            np.testing.assert_array_equal(graph_atoms[name], eager_atoms[name], err_msg=f"{case}: {name}")


@pytest.mark.mpi(ranks=[1], timeout=300)
def test_graph_run_is_reproducible(comm, cupy):
    """Two graph runs (GPU binning with atomics, then per-cell sorts) give the same bits."""
    first, first_atoms, _ = _run(comm, True, np.float32, "langevin", steps=60)
    second, second_atoms, _ = _run(comm, True, np.float32, "langevin", steps=60)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first_atoms["positions"], second_atoms["positions"])

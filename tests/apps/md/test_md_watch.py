"""Lazy neighbour-list checks (apps.md.watch): reading the device watch every N steps and replaying steps
after a missed crossing of skin/2 gives exactly the run of an every-step check (CPU, float64, bitwise).
"""

import numpy as np
import pytest

from apps.md import distributed, distributed_state, lattice, potential, serial, watch


def _run(comm, check_interval, steps=60, thermo_every=20, thermostat=None, fixed_schedule=False, monkeypatch=None):
    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    hpcgpu.arch.auto(comm, backend="numpy")
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (5, 5, 5))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, thermostat=thermostat,
                             temperature=1.0, damping=0.5, seed=5, check_interval=check_interval)
    if fixed_schedule:
        # Check only every `check_interval` steps: crossings between checks are then frequent and
        # every one of them must be replayed.
        monkeypatch.setattr(watch.RebuildWatch, "_steps_to_next_check", lambda self, step, largest: self.check_interval)
    domain = ParticleDomain(comm, box, config.ghost_width)
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine])
    samples = [tuple(distributed.thermo(state, config))]
    for _ in range(steps):
        want = (state.step + 1) % thermo_every == 0
        distributed.step(state, config, compute_energy=want)
        if want:
            samples.append(tuple(distributed.thermo(state, config)))
    gathered = distributed.gather_by_id(state)
    return samples, gathered, state


@pytest.mark.mpi(ranks=[1, 2], timeout=120)
def test_lazy_checks_give_the_every_step_run_bitwise(comm, monkeypatch):
    expected, expected_atoms, eager = _run(comm, check_interval=1)
    assert eager.watch is None and eager.n_builds > 3
    for fixed in (False, True):
        found, atoms, lazy = _run(comm, check_interval=7, fixed_schedule=fixed, monkeypatch=monkeypatch)
        assert lazy.watch is not None
        assert found == expected                                  # every thermo value, exactly
        assert lazy.n_builds == eager.n_builds
        if comm.rank == 0:
            for name in ("positions", "velocities", "images", "atom_ids"):
                np.testing.assert_array_equal(atoms[name], expected_atoms[name])
        assert lazy.watch.n_checks < 60                           # fewer host reads than steps
        if fixed:
            assert lazy.watch.n_rollbacks > 0                     # the replay path was exercised
        monkeypatch.undo()


@pytest.mark.mpi(ranks=[1], timeout=120)
def test_lazy_checks_with_langevin_and_settle_at_odd_steps(comm):
    expected, expected_atoms, _ = _run(comm, check_interval=1, steps=37, thermo_every=1000, thermostat="langevin")
    found, atoms, lazy = _run(comm, check_interval=9, steps=37, thermo_every=1000, thermostat="langevin")
    assert found == expected
    np.testing.assert_array_equal(atoms["positions"], expected_atoms["positions"])
    assert lazy.watch.verified_step == 37


def test_watch_kernel_records_first_step_and_largest_displacement():
    reference = np.zeros((4, 3))
    positions = reference.copy()
    velocities = np.zeros((4, 3))
    velocities[2, 0] = 20.0    # moves 0.1 per step with dt 0.005
    forces = np.zeros((4, 3))
    masses = np.ones(4)
    values = np.array([watch.NOT_EXCEEDED, 0], dtype=np.int32)
    for step in range(1, 4):
        watch.first_half_and_watch(positions, velocities, forces, masses, 0.005, reference, 0.15**2, step, values)
    assert values[0] == 2                                         # 0.2 > 0.15 first at step 2
    largest = float(values[1:2].view(np.float32)[0])
    assert largest == pytest.approx(0.3**2, rel=1e-6)
    np.testing.assert_allclose(positions[2], [0.3, 0, 0])


class _HostStepGraphs:
    """CPU stand-in for apps.md.step_graph.StepGraphs: same calls, eager kernels (tests the driver's flow)."""

    def __init__(self, dtype):
        self.n_launches = 0

    def first_half(self, state, dt, rebuild_watch):
        watch.first_half_and_watch(state.positions, state.velocities, state.forces, state.masses, dt,
                                   state.neighbor_list.reference_positions, rebuild_watch.threshold_sq,
                                   state.step + 1, rebuild_watch.values)
        self.n_launches += 1

    def second_half(self, state, config):
        from apps.md.integrate import langevin_forces, velocity_verlet_second_half

        state.ghosts.forward(state.positions)
        distributed._forces(state, False)
        if config.thermostat == "langevin":
            langevin_forces(state.forces, state.velocities, state.masses, state.atom_ids, config.temperature,
                            config.damping, config.dt, config.seed, state.step)
        velocity_verlet_second_half(state.velocities, state.forces, state.masses, config.dt)
        self.n_launches += 1

    def summary(self):
        return {"captures": 0, "launches": self.n_launches}


@pytest.mark.mpi(ranks=[1], timeout=120)
def test_step_graph_branches_of_the_driver_give_the_same_run(comm, monkeypatch):
    """The driver's graph path (first half / check / second half, early return) with eager stand-ins."""
    expected, expected_atoms, _ = _run(comm, check_interval=7, steps=45, thermo_every=15, thermostat="langevin",
                                       fixed_schedule=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(distributed_state, "graphs_apply", lambda state, config: True)
    monkeypatch.setattr(distributed_state, "StepGraphs", _HostStepGraphs)
    found, atoms, state = _run(comm, check_interval=7, steps=45, thermo_every=15, thermostat="langevin",
                               fixed_schedule=True, monkeypatch=monkeypatch)
    assert state.graphs.n_launches > 45 and state.watch.n_rollbacks > 0
    assert found == expected
    for name in ("positions", "velocities", "images"):
        np.testing.assert_array_equal(atoms[name], expected_atoms[name])

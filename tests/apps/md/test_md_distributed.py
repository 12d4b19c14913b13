"""Distributed MD (apps.md.distributed) against the single-domain driver (apps.md.serial).

Thermo quantities of 1, 2, 3, 4 (and 8 on a tiny system) ranks must match the serial run to 1e-10
relative (absolute 1e-10 near zero) over the first 100 steps in float64: NVE from the fcc lattice, then
Langevin (noise keyed by atom id) and Nose-Hoover, which must not depend on the decomposition either.
"""

import time

import numpy as np
import pytest

from apps.md import distributed, lattice, potential, serial
from hpcgpu.errors import DecompositionError


def _system(cells, thermostat=None, variant="plain"):
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells,) * 3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5, variant=variant), skin=0.3,
                             thermostat=thermostat, temperature=1.0, damping=0.5, seed=11)
    return positions, velocities, atom_ids, box, config


def _reference(comm, system, steps, every):
    """Serial thermo samples, computed on rank 0 only (the other ranks would only compete for cores)."""
    result = _serial_samples(system, steps, every) if comm.rank == 0 else (None, None)
    _polite_barrier(comm)
    return comm.mpi.bcast(result, root=0)


def _polite_barrier(comm):
    """A barrier that sleeps while waiting: MPICH spins in blocking waits, which would steal the cores of
    an oversubscribed CI machine from rank 0 while it computes the reference."""
    request = comm.mpi.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def _serial_samples(system, steps, every):
    positions, velocities, atom_ids, box, config = system
    state = serial.init(positions, velocities, box, config, atom_ids=atom_ids)
    samples = [serial.thermo(state, config)]
    for _ in range(steps):
        serial.step(state, config, compute_energy=(state.step + 1) % every == 0)
        if state.step % every == 0:
            samples.append(serial.thermo(state, config))
    return np.array(samples), state


def _distributed_samples(comm, system, steps, every, dims=None):
    import hpcgpu
    from hpcgpu.particles import ParticleDomain

    hpcgpu.arch.auto(comm, backend="numpy")   # Numba threads shared by the ranks of the node
    positions, velocities, atom_ids, box, config = system
    domain = ParticleDomain(comm, box, config.ghost_width, dims=dims)
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine])
    samples = [distributed.thermo(state, config)]
    for _ in range(steps):
        distributed.step(state, config, compute_energy=(state.step + 1) % every == 0)
        if state.step % every == 0:
            samples.append(distributed.thermo(state, config))
    return np.array(samples), state


def _assert_thermo_close(found, expected):
    assert found.shape == expected.shape
    np.testing.assert_array_equal(found[:, 0], expected[:, 0])        # steps
    np.testing.assert_allclose(found[:, 1:], expected[:, 1:], rtol=1e-10, atol=1e-10)


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=120)
def test_thermo_of_any_rank_count_matches_one_domain(comm):
    """6x6x6 fcc cells (864 atoms): NVE 100 steps, Langevin 50, Nose-Hoover 50."""
    for thermostat, steps in ((None, 100), ("langevin", 50), ("nose_hoover", 50)):
        system = _system(6, thermostat)
        expected, serial_state = _reference(comm, system, steps, 10)
        found, state = _distributed_samples(comm, system, steps, 10)
        _assert_thermo_close(found, expected)
        assert comm.allreduce(state.n_local) == 864
        if thermostat is None:
            assert state.n_builds >= 3, "atoms must have moved enough to rebuild (and migrate) several times"
            gathered = distributed.gather_by_id(state)
            if comm.rank == 0:
                reference = serial.host_arrays_by_id(serial_state)
                np.testing.assert_array_equal(gathered["atom_ids"], reference["atom_ids"])
                np.testing.assert_allclose(gathered["positions"] + gathered["images"] * system[3],
                                           reference["positions"] + reference["images"] * system[3],
                                           rtol=0, atol=1e-9)


@pytest.mark.mpi(ranks=[8], timeout=150)
def test_eight_ranks_on_a_tiny_system_match_one_domain(comm):
    """4x4x4 fcc cells (256 atoms) on 2 x 2 x 2 sub-boxes of 3.36 sigma (ghost width 2.8)."""
    system = _system(4)
    expected, _ = _reference(comm, system, 100, 20)
    found, state = _distributed_samples(comm, system, 100, 20)
    assert state.domain.dims == (2, 2, 2)
    _assert_thermo_close(found, expected)


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_every_step_rebuild_and_fixed_dims_agree(comm):
    """Rebuild (and migrate) every step along a forced 1 x 1 x 2 grid: same thermo as the serial run."""
    positions, velocities, atom_ids, box, config = _system(5, variant="force_shift")
    config = serial.MDConfig(potential=config.potential, skin=0.3, rebuild_every=1, rebuild_check=False)
    system = (positions, velocities, atom_ids, box, config)
    expected, _ = _reference(comm, system, 40, 10)
    found, state = _distributed_samples(comm, system, 40, 10, dims=(1, 1, 2))
    assert state.domain.dims == (1, 1, 2) and state.n_builds == 41
    _assert_thermo_close(found, expected)
    with pytest.raises(DecompositionError, match="fewer ranks"):
        _distributed_samples(comm, _system(2), 1, 1)

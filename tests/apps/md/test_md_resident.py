"""Device-resident MD steps: whole steps, rebuilds included, as CUDA graphs -- on one GPU
(apps.md.resident) and, with 2 ranks, on two GPUs cut into slabs (apps.md.resident_slab).

Against the CPU and the default GPU driver in fp64 (<= 1e-10 relative in every thermo quantity over 100
steps, the same rebuild steps), capacity overflows redone to the same bits, restarts bitwise, runs
reproducible. The CPU tests check that it is refused, with the reasons, where it cannot run. GPU machine::

    python -m pytest tests/apps/md/test_md_resident.py -q
"""

import numpy as np
import pytest

from apps.md import distributed, lattice, potential, serial
from hpcgpu.errors import ConfigurationError


def _config(**changes):
    settings = dict(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, temperature=1.0, damping=0.5, seed=3)
    settings.update(changes)
    return serial.MDConfig(**settings)


def _state(comm, xp, dtype, config, cells=6):
    from hpcgpu.particles import ParticleDomain

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells,) * 3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    domain = ParticleDomain(comm, box, config.ghost_width)
    mine = domain.subbox.contains(positions)
    return distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=xp,
                            dtype=dtype)


def _run(state, config, steps, every=10):
    """Thermo rows (step, T, E_pair, TotEng, P) every ``every`` steps and the atoms by id at the end."""
    samples = [tuple(distributed.thermo(state, config))]
    for _ in range(steps):
        want = (state.step + 1) % every == 0
        distributed.step(state, config, compute_energy=want)
        if want:
            samples.append(tuple(distributed.thermo(state, config)))
    distributed.settle(state, config)
    return np.array(samples), distributed.gather_by_id(state)


def _unwrapped(atoms, box):
    return atoms["positions"] + atoms["images"] * box


# -- where it cannot run (CPU, in CI) ----------------------------------------------------------------------

@pytest.mark.mpi(ranks=[1, 2], timeout=120)
def test_resident_on_is_refused_with_the_reasons(comm):
    config = _config(resident=True, thermostat="nose_hoover")
    with pytest.raises(ConfigurationError) as error:
        _state(comm, np, np.float64, config, cells=4)
    message = str(error.value)
    assert "needs a GPU" in message and "Nose-Hoover" in message and "at least 3 cells" in message
    assert ("undivided axes" in message) == (comm.size > 1)


@pytest.mark.mpi(ranks=[1], timeout=120)
def test_resident_auto_stays_off_on_the_cpu(comm):
    state = _state(comm, np, np.float64, _config())
    assert state.resident is None and state.ghosts is not None


# -- GPU -----------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_resident_matches_cpu_and_default_gpu_driver_in_fp64(comm, cupy):
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    for thermostat in (None, "langevin"):
        config = _config(thermostat=thermostat)
        cpu_state = _state(comm, np, np.float64, config)
        cpu, cpu_atoms = _run(cpu_state, config, 100)
        default_state = _state(comm, cupy, np.float64, _config(thermostat=thermostat, resident=False))
        default, _ = _run(default_state, config, 100)
        state = _state(comm, cupy, np.float64, _config(thermostat=thermostat, resident=True))
        resident, atoms = _run(state, config, 100)
        assert state.resident is not None and default_state.resident is None
        summary = state.resident.summary()
        print(thermostat, "builds", state.n_builds, summary)
        assert state.n_builds == cpu_state.n_builds == default_state.n_builds > 3, thermostat
        assert summary["chunks"] >= 10 and summary["chunks_redone"] == 0
        np.testing.assert_allclose(resident[:, 1:], cpu[:, 1:], rtol=1e-10, atol=1e-10, err_msg=str(thermostat))
        np.testing.assert_allclose(resident[:, 1:], default[:, 1:], rtol=1e-10, atol=1e-10, err_msg=str(thermostat))
        if comm.rank > 0:
            continue   # gather_by_id: every atom on rank 0
        np.testing.assert_array_equal(atoms["atom_ids"], cpu_atoms["atom_ids"])
        np.testing.assert_allclose(_unwrapped(atoms, state.box), _unwrapped(cpu_atoms, state.box), atol=1e-9)
        np.testing.assert_allclose(atoms["velocities"], cpu_atoms["velocities"], atol=1e-9)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_resident_overflow_is_redone_to_the_same_bits(comm, cupy):
    """Capacities cut below what the lists need: every chunk that overflowed is grown and redone."""
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    config = _config(thermostat="langevin", resident=True)
    roomy_state = _state(comm, cupy, np.float64, config)
    roomy, roomy_atoms = _run(roomy_state, config, 60)
    state = _state(comm, cupy, np.float64, config)
    state.resident.neighbor_capacity = 8    # the arrays stay as large as before: only the stored counts shrink
    state.resident.cell_capacity = 2
    tight, tight_atoms = _run(state, config, 60)
    summary = state.resident.summary()
    assert summary["chunks_redone"] >= 1 and state.n_reallocations >= 1, summary
    assert state.resident.neighbor_capacity > 8 and state.resident.cell_capacity > 2
    assert state.n_builds == roomy_state.n_builds
    np.testing.assert_array_equal(tight, roomy)
    for name in ("positions", "velocities", "images") if comm.rank == 0 else ():
        np.testing.assert_array_equal(tight_atoms[name], roomy_atoms[name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_resident_restart_continues_bitwise(comm, cupy):
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    config = _config(thermostat="langevin", resident=True)
    full_state = _state(comm, cupy, np.float64, config)
    full, full_atoms = _run(full_state, config, 40)
    first = _state(comm, cupy, np.float64, config)
    _run(first, config, 20)
    particles, replicated = distributed.checkpoint_payload(first)
    resumed_state = distributed.restore(first.domain, particles, replicated, config, np.float64, xp=cupy)
    assert resumed_state.resident is not None and resumed_state.step == 20
    resumed, resumed_atoms = _run(resumed_state, config, 20)
    np.testing.assert_array_equal(resumed[-1], full[-1])
    assert resumed_state.n_builds == full_state.n_builds
    for name in ("positions", "velocities", "images") if comm.rank == 0 else ():
        np.testing.assert_array_equal(resumed_atoms[name], full_atoms[name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_graph_if_nodes_change_no_bit(comm, cupy, monkeypatch):
    """The [flag] kernels inside CUDA graph IF nodes (skipped as a whole on steps without a rebuild) or as
    plain launches that return at once: the same bits, the same rebuilds. On 2 ranks: the slab driver,
    whose IF nodes also hold the migration (peer exchange) and the ghost send lists."""
    import hpcgpu
    from apps.md import chunked_graphs

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    config = _config(thermostat="langevin", resident=True)
    runs = {}
    for conditionals in (False, True):
        monkeypatch.setattr(chunked_graphs, "GRAPH_CONDITIONALS", conditionals)
        state = _state(comm, cupy, np.float64, config, cells=8)
        runs[conditionals] = _run(state, config, 100) + (state.n_builds,)
        summary = state.resident.summary()
        assert summary["graph_conditionals"] is conditionals and summary["chunks_redone"] == 0, summary
        if hasattr(state.resident, "close"):   # the slab driver: its NCCL communicator and peer mappings
            state.resident.close()
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    assert runs[True][2] == runs[False][2] >= 5
    if comm.rank == 0:
        for name in ("positions", "velocities", "images", "atom_ids"):
            np.testing.assert_array_equal(runs[True][1][name], runs[False][1][name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_resident_runs_are_reproducible_and_fp32_tracks_fp64(comm, cupy):
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    config = _config(thermostat="langevin")
    runs = [_run(_state(comm, cupy, np.float32, config, cells=8), config, 60) for _ in range(2)]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    if comm.rank == 0:
        np.testing.assert_array_equal(runs[0][1]["positions"], runs[1][1]["positions"])
    exact, _ = _run(_state(comm, cupy, np.float64, config, cells=8), config, 60)
    np.testing.assert_allclose(runs[0][0][:, 1:], exact[:, 1:], rtol=2e-3, atol=2e-3)

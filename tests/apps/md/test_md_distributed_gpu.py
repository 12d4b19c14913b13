"""Distributed MD on GPUs (CuPy arrays, host-staged migration and ghost exchange) against the CPU path.

Run on the GPU machine (1 and 2 GPUs)::

    python -m pytest tests/apps/md/test_md_distributed_gpu.py -q
"""

import numpy as np
import pytest

from apps.md import distributed, lattice, potential, serial


def _run(comm, xp, dtype, thermostat=None, steps=50):
    from hpcgpu.particles import ParticleDomain

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (6, 6, 6))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, thermostat=thermostat,
                             temperature=1.0, damping=0.5, seed=3)
    domain = ParticleDomain(comm, box, config.ghost_width)
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=xp,
                             dtype=dtype)
    samples = [distributed.thermo(state, config)]
    for _ in range(steps):
        distributed.step(state, config, compute_energy=(state.step + 1) % 10 == 0)
        if state.step % 10 == 0:
            samples.append(distributed.thermo(state, config))
    return np.array(samples), state


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_gpu_distributed_thermo_matches_cpu(comm):
    cupy = pytest.importorskip("cupy")
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    for thermostat in (None, "langevin"):
        cpu, _ = _run(comm, np, np.float64, thermostat)
        gpu, state = _run(comm, cupy, np.float64, thermostat)
        assert type(state.positions).__module__.startswith("cupy")
        assert comm.allreduce(state.n_local) == 864
        np.testing.assert_allclose(gpu[:, 1:], cpu[:, 1:], rtol=1e-9, atol=1e-9)
    fast, _ = _run(comm, cupy, np.float32)
    cpu, _ = _run(comm, np, np.float64)
    np.testing.assert_allclose(fast[:, 1:], cpu[:, 1:], rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_gpu_app_in_lj_step_zero_and_short_run(comm):
    pytest.importorskip("cupy")
    import tempfile

    from apps.md.app import build_parser, run
    from hpcgpu.app.cli import parse_args

    directory = comm.mpi.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
    options = parse_args(build_parser(comm.rank), ["--backend", "cupy", "--steps", "100", "--quiet",
                                                    "--output", directory, "--dump-every", "50"])
    summary = run(options, comm)
    step0 = summary["thermo"][0]
    assert summary["backend"] == "gpu"
    assert [f"{step0[k]:.8g}" for k in ("temp", "e_pair", "toteng", "press")] == \
        ["1.44", "-6.7733681", "-4.6134356", "-5.0197073"]
    assert abs(summary["thermo"][-1]["toteng"] - step0["toteng"]) < 0.02

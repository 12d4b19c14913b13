"""GPU fast path of the MD step: device ghost lists and refreshes, the displacement watch, lazy checks.

Every new kernel against the CPU path in float64, then the whole step: lazy checks with replays equal
the every-step check on the GPU, and fp32 in.lj on the GPU follows the fp64 CPU thermo over 100 steps.
Run on the GPU machine (1 and 2 GPUs)::

    python -m pytest tests/apps/md/test_md_gpu_fast.py -m gpu -q
"""

import numpy as np
import pytest

from apps.md import distributed, lattice, potential, serial, watch

pytestmark = pytest.mark.gpu


def _fcc(cells=6, seed=3):
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells,) * 3)
    rng = np.random.default_rng(seed)
    positions = np.ascontiguousarray((positions + rng.uniform(-0.1, 0.1, positions.shape)) % box)
    return positions, atom_ids, box


@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_device_ghost_exchange_matches_host(comm, cupy):
    """Build (flag kernel + prefix sum) and forward (gather, NCCL between ranks) against the NumPy path."""
    import hpcgpu
    from hpcgpu.particles import GhostExchange, ParticleDomain

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    positions, atom_ids, box = _fcc()
    domain = ParticleDomain(comm, box, 2.8)
    mine = domain.subbox.contains(positions)
    owned = np.ascontiguousarray(positions[mine])
    host = GhostExchange(domain, owned, 2.8, carried={"ids": atom_ids[mine]})
    device = GhostExchange(domain, cupy.asarray(owned), 2.8, carried={"ids": cupy.asarray(atom_ids[mine])})
    assert device.send_counts == host.send_counts and device.receive_counts == host.receive_counts
    np.testing.assert_array_equal(device.send_index.get(), host.send_index)
    np.testing.assert_array_equal(device.positions.get(), host.positions)
    np.testing.assert_array_equal(device.carried["ids"].get(), host.carried["ids"])
    assert device.all_local == (comm.size == 1)
    moved = owned + np.random.default_rng(comm.rank).uniform(-0.05, 0.05, owned.shape)
    host_all = np.concatenate([moved, np.zeros_like(host.positions)])
    device_all = cupy.asarray(np.concatenate([moved, np.full_like(host.positions, np.nan)]))
    host.forward(host_all)
    device.forward(device_all)
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(device_all.get(), host_all)


def test_watch_kernel_matches_cpu(cupy):
    rng = np.random.default_rng(1)
    n = 3000
    reference = rng.uniform(0, 10, (n, 3))
    arrays = {"positions": reference + rng.uniform(-0.1, 0.1, (n, 3)), "velocities": rng.normal(0, 3, (n, 3)),
              "forces": rng.normal(0, 50, (n, 3)), "masses": rng.uniform(0.5, 2, n)}
    results = []
    for xp in (np, cupy):
        # Copies: np.asarray would alias the inputs, and the GPU run would start from the CPU's result.
        a = {name: xp.array(value, copy=True) for name, value in arrays.items()}
        values = xp.asarray(np.array([watch.NOT_EXCEEDED, 0], np.int32))
        for step in (4, 5, 6):
            watch.first_half_and_watch(a["positions"], a["velocities"], a["forces"], a["masses"], 0.005,
                                       xp.asarray(reference), 0.15**2, step, values)
        host = {name: (v.get() if xp is cupy else v) for name, v in a.items()}
        results.append((host, values.get() if xp is cupy else values))
    (cpu, cpu_values), (gpu, gpu_values) = results
    for name in ("positions", "velocities"):
        np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-14, atol=1e-14)
    assert gpu_values[0] == cpu_values[0] and cpu_values[0] < watch.NOT_EXCEEDED
    assert abs(int(gpu_values[1]) - int(cpu_values[1])) <= 1    # float32 bits of the largest d^2


def _run(comm, xp, dtype, check_interval, cells=6, steps=60, fixed_schedule=False, monkeypatch=None, resident=False):
    from hpcgpu.particles import ParticleDomain

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells,) * 3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    # resident=False: these tests are about the default driver's lazy checks (apps.md.watch); None lets
    # one rank on a GPU run device-resident (apps.md.resident), as the app does by default.
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, check_interval=check_interval,
                             resident=resident)
    if fixed_schedule:
        monkeypatch.setattr(watch.RebuildWatch, "_steps_to_next_check", lambda self, step, largest: self.check_interval)
    domain = ParticleDomain(comm, box, config.ghost_width)
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=xp,
                             dtype=dtype)
    samples = [tuple(distributed.thermo(state, config))]
    for _ in range(steps):
        want = (state.step + 1) % 20 == 0
        distributed.step(state, config, compute_energy=want)
        if want:
            samples.append(tuple(distributed.thermo(state, config)))
    return np.array(samples), state


@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_gpu_lazy_checks_match_every_step_check_and_cpu(comm, monkeypatch, cupy):
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    cpu, cpu_state = _run(comm, np, np.float64, check_interval=1)
    eager, eager_state = _run(comm, cupy, np.float64, check_interval=1)
    lazy, lazy_state = _run(comm, cupy, np.float64, check_interval=10, fixed_schedule=True, monkeypatch=monkeypatch)
    assert eager_state.watch is None and lazy_state.watch.n_rollbacks > 0
    assert lazy_state.n_builds == eager_state.n_builds == cpu_state.n_builds
    np.testing.assert_allclose(lazy[:, 1:], eager[:, 1:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lazy[:, 1:], cpu[:, 1:], rtol=1e-10, atol=1e-10)


@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_gpu_fp32_in_lj_follows_fp64_cpu_for_100_steps(comm, cupy):
    """in.lj (32,000 atoms), default GPU settings (lazy checks) in fp32 vs the CPU in fp64."""
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    fast, state = _run(comm, cupy, np.float32, check_interval=None, cells=20, steps=100, resident=None)
    reference, _ = _run(comm, np, np.float64, check_interval=1, cells=20, steps=100)
    # Default settings run device-resident: one GPU (apps.md.resident), two as slabs (apps.md.resident_slab).
    assert state.resident is not None and state.watch is None
    assert state.resident.summary().get("driver") == (None if comm.size == 1 else "slab")
    # Step 0: E_pair -6.7733681 and Press -5.0197073 (LAMMPS) to fp32 accuracy.
    assert fast[0, 2] == pytest.approx(-6.7733681, rel=1e-5) and fast[0, 4] == pytest.approx(-5.0197073, rel=1e-4)
    np.testing.assert_allclose(fast[:, 1:], reference[:, 1:], rtol=5e-4, atol=5e-4)

"""The slab driver (apps.md.resident_slab): device-side migration and ghosts between GPUs, as graphs.

Most of its checks are the resident tests run on 2 ranks (tests/apps/md/test_md_resident.py: thermo
against the CPU and the default GPU driver <= 1e-10 over 100 fp64 steps, list overflow redone bitwise,
restart bitwise, reproducible runs; on one node they use the peer exchange). Here: the peer exchange
(CUDA IPC stores) against NCCL's send/receive, bit for bit; the one-lane (k-major) list path; overflows of
the message and row capacities redone bitwise with either exchange; a finished run's driver finalised by
the garbage collector inside the next driver's capture; and (CPU, CI) the decompositions it refuses and the
exchange settings it rejects. GPU machine, 2 GPUs::

    mpirun -np 2 python -m pytest tests/apps/md/test_md_resident_slab.py -q
"""

import numpy as np
import pytest

from apps.md import distributed, lattice, resident, resident_slab
from hpcgpu.errors import ConfigurationError
from test_md_resident import _config, _run   # the same settings and thermo sampling as the resident tests


def _state(comm, xp, config, cells=8, dims=None, temperature=1.44):
    from hpcgpu.particles import ParticleDomain

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells,) * 3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), temperature, 87287)
    domain = ParticleDomain(comm, box, config.ghost_width, dims=dims)
    mine = domain.subbox.contains(positions)
    return distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=xp)


@pytest.mark.mpi(ranks=[4], timeout=120)
def test_slab_driver_refuses_other_decompositions(comm):
    config = _config(resident=None)
    state = _state(comm, np, config, cells=8, dims=(2, 2, 1))
    problems = resident.resident_problems(state, config)
    assert any("slab decomposition" in p and "2x2x1" in p for p in problems), problems
    with pytest.raises(ConfigurationError, match="slab decomposition"):
        _state(comm, np, _config(resident=True), cells=8, dims=(2, 2, 1))


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_slab_axis_and_thin_slabs(comm):
    config = _config()
    state = _state(comm, np, config, cells=8, dims=(1, 2, 1))
    assert resident_slab.slab_axis(state.domain) == 1
    assert resident_slab.slab_problems(state, config) == []
    thin = _state(comm, np, config, cells=6, dims=(1, 1, 2))
    assert resident_slab.slab_axis(thin.domain) == 2
    assert resident_slab.slab_problems(thin, config) == []   # 5.04 sigma slabs: thicker than 2.8


@pytest.mark.mpi(ranks=[1], timeout=60)
def test_exchange_setting_is_checked(comm):
    with pytest.raises(ConfigurationError, match="exchange"):
        _config(exchange="mpi")
    assert _config(exchange="nccl").exchange == "nccl" and _config().exchange == "auto"


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[2], timeout=300)
def test_peer_exchange_equals_nccl_bit_for_bit(comm, cupy):
    """Hot (T = 3) Langevin run: atoms cross the slab faces at most rebuilds; both exchanges move the same
    bytes into the same rows, so every bit agrees."""
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    runs = {}
    for exchange in ("nccl", "peer"):
        config = _config(thermostat="langevin", resident=True, exchange=exchange)
        state = _state(comm, cupy, config, temperature=3.0)
        runs[exchange] = _run(state, config, 100)
        summary = state.resident.summary()
        assert summary["exchange"] == exchange and summary["chunks_redone"] == 0, summary
        runs[exchange] += (state.n_builds,)
        state.resident.close()
    np.testing.assert_array_equal(runs["peer"][0], runs["nccl"][0])
    assert runs["peer"][2] == runs["nccl"][2] >= 5
    if comm.rank == 0:
        for name in ("positions", "velocities", "images", "atom_ids"):
            np.testing.assert_array_equal(runs["peer"][1][name], runs["nccl"][1][name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[2], timeout=300)
def test_slab_one_lane_list_matches_default_driver(comm, cupy, monkeypatch):
    """One thread per atom stores the list k-major (large systems); forced here on a small one."""
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    monkeypatch.setattr(resident_slab, "lanes_per_atom", lambda n: 1)
    config = _config(thermostat="langevin")
    default, default_atoms = _run(_state(comm, cupy, _config(thermostat="langevin", resident=False)), config, 60)
    state = _state(comm, cupy, _config(thermostat="langevin", resident=True))
    slab, atoms = _run(state, config, 60)
    assert state.resident.summary()["lanes_per_atom"] == 1
    assert comm.allreduce(state.n_local) == 2048
    np.testing.assert_allclose(slab[:, 1:], default[:, 1:], rtol=1e-10, atol=1e-10)
    if comm.rank == 0:
        np.testing.assert_allclose(atoms["velocities"], default_atoms["velocities"], atol=1e-9)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[2], timeout=300)
@pytest.mark.parametrize("exchange", ["peer", "nccl"])
def test_slab_row_ghost_and_migrant_overflow_is_redone_to_the_same_bits(comm, cupy, monkeypatch, exchange):
    """Rows for exactly today's atoms, 40 ghost rows and 2 migrants per side: far too few, grown and redone
    (with the peer exchange the neighbours' memory is mapped again after each growth)."""
    import hpcgpu

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    config = _config(thermostat="langevin", resident=True, exchange=exchange)
    roomy_state = _state(comm, cupy, config, temperature=3.0)
    roomy, roomy_atoms = _run(roomy_state, config, 60)
    monkeypatch.setattr(resident_slab, "INITIAL_CAPACITIES", {"rows": 0, "ghost_rows": 40, "migrants": 2})
    state = _state(comm, cupy, config, temperature=3.0)
    tight, tight_atoms = _run(state, config, 60)
    summary = state.resident.summary()
    assert summary["exchange"] == exchange
    capacities = summary["capacities"]
    assert summary["chunks_redone"] >= 1 and capacities["ghost_rows_per_side"] > 40
    assert capacities["migrants_per_side"] > 2, summary
    assert state.n_builds == roomy_state.n_builds
    np.testing.assert_array_equal(tight, roomy)
    if comm.rank == 0:
        for name in ("positions", "velocities", "images"):
            np.testing.assert_array_equal(tight_atoms[name], roomy_atoms[name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.mpi(ranks=[2], timeout=300)
def test_a_driver_collected_during_the_next_ones_capture_changes_nothing(comm, cupy, monkeypatch):
    """A driver and its state refer to each other, so the garbage collector finalises a finished run's
    driver whenever it runs -- possibly in the middle of the next driver's graph capture. The finaliser drops
    the graphs after a device synchronisation, which inside a capture would break it; it now waits for the
    capture's end (hpcgpu.runtime.capture). Forced here: the collector runs inside the second capture."""
    import gc

    import hpcgpu
    from hpcgpu.runtime import capture

    hpcgpu.arch.auto(comm, backend="cupy", allow_sharing=True)
    config = _config(thermostat="langevin", resident=True)
    closes = []
    close, save = resident_slab.SlabResidentSteps.close, resident_slab.SlabResidentSteps._record_save

    def save_and_collect(self):
        save(self)
        if not closes:
            gc.collect()

    gc.disable()   # the first run's driver stays garbage until the collect inside the second capture
    try:
        first = _run(_state(comm, cupy, config), config, 30)
        monkeypatch.setattr(resident_slab.SlabResidentSteps, "close",
                            lambda self: (closes.append(capture.in_progress()), close(self)))
        monkeypatch.setattr(resident_slab.SlabResidentSteps, "_record_save", save_and_collect)
        second = _run(_state(comm, cupy, config), config, 30)
    finally:
        gc.enable()
    assert closes[:1] == [True]   # the first driver was finalised inside the second one's capture
    np.testing.assert_array_equal(first[0], second[0])
    if comm.rank == 0:
        np.testing.assert_array_equal(first[1]["positions"], second[1]["positions"])


def test_the_kernels_shared_arrays_fit_the_blocks_they_are_launched_with():
    """The compaction kernels keep one count per warp in ``__shared__ int warp_counts[4][TILE / 32]`` and
    are launched with ``slab_plan.TILE`` threads: the two TILEs must be one number, or a block's warps
    would write past the shared array."""
    import re

    from apps.md import resident_slab_kernels, slab_plan

    defined = re.findall(r"^#define TILE (\d+)$", resident_slab_kernels._CUDA_SOURCE, re.M)
    assert defined == [str(slab_plan.TILE)] and slab_plan.TILE % 32 == 0 and slab_plan.TILE <= 1024

"""MD and particles move data between ranks only through the job's transport (hpcgpu.transport); that no
module outside it calls NCCL or MPI buffer operations is checked by
tests/transport/test_only_transport_moves_data.py.

- the counts-first row exchange of the particle code pairs the messages between two ranks in listing order,
  also when one rank is the neighbour on both sides of a periodic axis, and copies a rank's messages to
  itself;
- the slab driver, whose steps are CUDA graphs holding their exchanges, refuses a job transport that a graph
  cannot hold (checked on the CPU with the ``mpi-staged`` choice, whose collectives need no GPU to build);
- the planned exchange of the ghost refresh (messages resolved once) moves the buffers' current contents
  on every run (here through the host collectives; on NCCL the same resolved group every step);
- ``gather_by_id`` (MPI Gatherv through the host collectives) gives rank 0 every atom exactly once.
"""

from types import SimpleNamespace

import numpy as np
import pytest


@pytest.mark.mpi(ranks=[1, 2, 3], timeout=60)
def test_row_exchange_pairs_messages_in_listing_order(comm):
    """Every rank sends three messages of different lengths to its right neighbour (two) and itself (one);
    each message holds (sender, index). With one or two ranks the right neighbour is also the left one,
    or this rank itself: the listing order alone must pair them."""
    from hpcgpu.particles.messages import exchange_rows
    from hpcgpu.transport import collectives

    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size

    def message(sender, index):
        return np.full((sender + 2 * index, 2), 10 * sender + index, dtype=np.int32)

    sends = [(message(comm.rank, 0), right), (message(comm.rank, 1), comm.rank), (message(comm.rank, 2), right)]
    movers = collectives(comm, on_device=False)
    received = exchange_rows(comm, movers, sends, [left, comm.rank, left], np.int32, (2,), tag=900)
    expected = [message(left, 0), message(comm.rank, 1), message(left, 2)]
    assert [r.shape for r in received] == [e.shape for e in expected]
    for got, wanted in zip(received, expected):
        assert np.array_equal(got, wanted)


@pytest.mark.mpi(ranks=[1, 3], timeout=60)
def test_planned_exchange_moves_current_contents_on_every_run(comm):
    from hpcgpu.transport import collectives
    from hpcgpu.transport.planned_exchange import PlannedExchange

    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    outgoing = [np.zeros(4), np.zeros(0), np.zeros(3)]
    incoming = [np.full(4, -1.0), np.zeros(0), np.full(3, -1.0)]
    plan = PlannedExchange(collectives(comm, on_device=False), [(outgoing[0], right), (outgoing[1], right),
                                                                 (outgoing[2], right)],
                           [(buffer, left) for buffer in incoming], tag=300)
    for step in range(3):
        for index, buffer in enumerate(outgoing):
            buffer[...] = 100 * step + 10 * comm.rank + index + np.arange(buffer.size) / 10
        plan.run()
        for index, buffer in enumerate(incoming):
            assert np.array_equal(buffer, 100 * step + 10 * left + index + np.arange(buffer.size) / 10)


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_slab_driver_refuses_a_transport_graphs_cannot_hold(comm, monkeypatch):
    import hpcgpu
    from apps.md import lattice, resident_slab
    from hpcgpu.particles import ParticleDomain
    from test_md_resident import _config

    monkeypatch.setenv("HPCGPU_TRANSPORT", "mpi-staged")
    job = hpcgpu.Communicator(comm.mpi)   # a job that has chosen no transport yet
    config = _config()
    _, _, box = lattice.make_lattice("fcc", 0.8442, (8, 8, 8))
    domain = ParticleDomain(job, box, config.ghost_width, dims=(2, 1, 1))
    on_gpu = SimpleNamespace(domain=domain, box=box, is_gpu=True)
    problems = resident_slab.slab_problems(on_gpu, config)
    assert problems == ["several GPUs need the nccl transport (this job's is mpi-staged)"], problems


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_gather_by_id_gives_root_every_atom_once(comm):
    from apps.md import distributed, lattice, serial, potential
    from hpcgpu.particles import ParticleDomain

    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3)
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (6, 6, 6))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    domain = ParticleDomain(comm, box, config.ghost_width)
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=np)
    gathered = distributed.gather_by_id(state, root=comm.size - 1)
    if comm.rank != comm.size - 1:
        assert gathered is None
        return
    assert np.array_equal(gathered["atom_ids"], atom_ids)
    assert np.array_equal(gathered["positions"], positions) and gathered["positions"].dtype == np.float64
    assert np.array_equal(gathered["velocities"], velocities)
    assert np.array_equal(gathered["images"], np.zeros((atom_ids.size, 3), np.int32))
    assert gathered["types"].shape == (atom_ids.size,) and np.all(gathered["masses"] == 1.0)

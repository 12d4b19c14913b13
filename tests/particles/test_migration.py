"""migrate: every particle ends on the rank whose sub-box holds it, rows intact, in the documented order.

The reference is serial: every rank builds the whole system, so it knows each particle's old and new owner
(by brute force, :func:`~tests.particles.particle_reference.owner_blocks`) and hence exactly which rows it
must hold after migration, in which order -- kept rows in their old order, then the rows received from
each neighbour rank in increasing rank order, each in the sender's order::

    rank 1 before: [a b c d]      a, c stay; b -> rank 0; d -> rank 2
    rank 0 sends e, rank 2 sends f g to rank 1
    rank 1 after:  [a c | e | f g]
"""

import os

import numpy as np
import pytest

from tests.particles.particle_reference import owner_blocks, process_grids, wrap

BOX = np.array([12.0, 11.3, 12.7])
WIDTH = 2.8
N_PARTICLES = 600


def _system(layout: str, dims, dtype, seed):
    """(start, moved): positions of the whole system before and after one rebuild interval, wrapped.

    Every particle moves by less than half a sub-box per axis, so its new owner is a neighbour of the old.
    ``clustered`` puts every particle within a fifth of the box of the origin's corner, so on 3 or 4 ranks
    some ranks start with no particle at all.
    """
    rng = np.random.default_rng(seed)
    if layout == "uniform":
        start = rng.uniform(0.0, 1.0, (N_PARTICLES, 3)) * BOX
    else:
        start = rng.uniform(-0.2, 0.2, (N_PARTICLES, 3)) * BOX
    start = wrap(start.astype(dtype), BOX)
    step = rng.uniform(-0.45, 0.45, (N_PARTICLES, 3)) * (BOX / np.asarray(dims))
    return start, wrap(start + step.astype(dtype), BOX)


def _row_values(ids):
    """Per-particle arrays of several dtypes and trailing shapes, each a function of the id."""
    return {
        "ids": ids,
        "velocities": np.column_stack([ids * 0.5, -ids * 0.25, ids / 7.0]),               # float64 (n, 3)
        "charges": (ids % 5).astype(np.float32) - 2.0,                                 # float32 (n,)
        "flags": (ids[:, None, None] * np.arange(1, 5).reshape(1, 2, 2) % 251).astype(np.uint8),   # (n, 2, 2)
    }


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=90)
def test_migration_gives_the_serial_owners_rows_and_order_on_every_grid(comm, monkeypatch):
    """On one node (rank order), then on two simulated nodes (a node-aware placement of the sub-boxes)."""
    _check_every_grid(comm)
    if comm.size > 1:
        monkeypatch.setenv("HPCGPU_SIMULATE_NODES", "2:cyclic")
        _check_every_grid(comm)


def _check_every_grid(comm):
    from hpcgpu.particles import ParticleDomain, migrate

    all_ids = np.arange(1, N_PARTICLES + 1, dtype=np.int64)
    everything = _row_values(all_ids)
    for case, dims in enumerate(process_grids(comm.size)):
        domain = ParticleDomain(comm, BOX, WIDTH, dims=dims)
        rank_of = {coords: rank for rank, coords in enumerate(comm.mpi.allgather(domain.coords))}
        for dtype in (np.float64, np.float32):
            for layout in ("uniform", "clustered"):
                start, moved = _system(layout, dims, dtype, seed=[case, dtype == np.float32, layout == "uniform"])
                old_owner = np.array([rank_of[tuple(c)] for c in owner_blocks(start, BOX, dims)])
                new_owner = np.array([rank_of[tuple(c)] for c in owner_blocks(moved, BOX, dims)])
                mine = np.nonzero(old_owner == comm.rank)[0]
                positions, arrays = migrate(domain, np.ascontiguousarray(moved[mine]),
                                            {name: values[mine] for name, values in everything.items()})

                # Kept rows in their old order, then each neighbour's rows in rank order, each in its order.
                expected = [mine[new_owner[mine] == comm.rank]]
                for source in domain.neighbor_ranks:
                    expected.append(np.nonzero((old_owner == source) & (new_owner == comm.rank))[0])
                expected = np.concatenate(expected)
                what = (dims, np.dtype(dtype).name, layout, os.environ.get("HPCGPU_SIMULATE_NODES"))
                assert np.array_equal(arrays["ids"], all_ids[expected]), what
                assert positions.dtype == dtype and np.array_equal(positions, moved[expected]), what
                for name, values in everything.items():
                    assert arrays[name].dtype == values.dtype and np.array_equal(arrays[name], values[expected]), \
                        (name, what)
                assert np.all(domain.subbox.contains(positions)), what
                assert comm.allreduce(len(positions), "sum") == N_PARTICLES, what

"""hpcgpu.particles: sub-boxes, migration and ghost exchange against the single-domain reference.

Every rank builds the same random gas; after migration each particle must be owned exactly once, by
the rank whose sub-box holds it, with its other arrays alongside. Ghosts must be exactly the periodic
images within ``width`` of the sub-box that :func:`apps.md.ghosts.make_periodic_ghosts` makes for the
whole system, and ``forward`` must refresh them bit for bit.
"""

import math

import numpy as np
import pytest

from hpcgpu.errors import DecompositionError

CASES = [
    # box (x, y, z), ghost width, particles
    ((10.1, 8.3, 9.7), 2.8, 700),
    ((6.0, 7.0, 5.7), 2.8, 300),     # two blocks per axis: the same rank below and above
    ((12.0, 3.1, 4.0), 1.5, 300),    # one axis a single thin block: own periodic images on both sides
]


def _gas(box, n_particles, seed):
    rng = np.random.default_rng(seed)
    positions = rng.uniform(0.0, 1.0, (n_particles, 3)) * np.asarray(box)
    displacement = rng.uniform(-0.4, 0.4, (n_particles, 3))
    return positions, displacement


def _gather(comm, *arrays):
    parts = comm.mpi.allgather(arrays)
    return [np.concatenate([p[i] for p in parts]) for i in range(len(arrays))]


def _rows(ids, positions):
    """Rows (id, x, y, z) sorted lexicographically, for set comparison."""
    table = np.column_stack([ids.astype(np.float64), positions])
    return table[np.lexsort(table.T[::-1])]


def test_dims_respect_the_ghost_width_and_explain_failures():
    from hpcgpu.particles import choose_particle_dims

    assert choose_particle_dims(8, (10.0, 10.0, 10.0), 2.8) == (2, 2, 2)
    assert choose_particle_dims(2, (20.0, 6.0, 6.0), 2.8) == (2, 1, 1)
    assert choose_particle_dims(4, (10.0, 10.0, 10.0), 2.8, dims=(0, 0, 1)) == (2, 2, 1)
    with pytest.raises(DecompositionError, match="at most 1 x 1 x 1 ranks .* fit.*fewer ranks"):
        choose_particle_dims(2, (3.4, 3.4, 3.4), 2.8)
    with pytest.raises(DecompositionError, match="thinner box"):
        choose_particle_dims(1, (2.0, 9.0, 9.0), 2.8)


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=90)
def test_migration_and_ghosts_match_the_single_domain_reference(comm):
    from apps.md.ghosts import make_periodic_ghosts
    from hpcgpu.particles import GhostExchange, ParticleDomain, migrate

    for case, (box, width, n_particles) in enumerate(CASES):
        box = np.asarray(box)
        fits = [math.floor(length / width) for length in box]
        try:
            domain = ParticleDomain(comm, box, width)
        except DecompositionError as error:
            assert "fewer ranks" in str(error)
            assert not any(comm.size == a * b * c for a in range(1, fits[0] + 1) for b in range(1, fits[1] + 1)
                           for c in range(1, fits[2] + 1))
            continue
        start, displacement = _gas(box, n_particles, seed=case)
        ids = np.arange(1, n_particles + 1, dtype=np.int64)
        mine = domain.owner_ranks(start) == comm.rank
        moved = start[mine] + displacement[mine]
        images = np.zeros((int(mine.sum()), 3), np.int32)
        crossings = np.floor(moved / box)
        moved -= crossings * box
        images += crossings.astype(np.int32)
        arrays = {"ids": ids[mine], "tag": (ids[mine] * 3.5)[:, None] * np.ones((1, 2)), "images": images}
        positions, arrays = migrate(domain, np.ascontiguousarray(moved), arrays)

        # Every particle owned exactly once, by the rank whose sub-box holds it, arrays alongside.
        assert np.all(domain.subbox.contains(positions))
        assert np.array_equal(arrays["tag"][:, 1], arrays["ids"] * 3.5)
        all_ids, all_positions, all_images = _gather(comm, arrays["ids"], positions, arrays["images"])
        order = np.argsort(all_ids)
        assert np.array_equal(all_ids[order], ids), "each particle must be owned exactly once"
        final = all_positions[order]
        expected_final = start + displacement - np.floor((start + displacement) / box) * box
        np.testing.assert_allclose(final, expected_final, rtol=0, atol=1e-12)
        assert np.array_equal(all_images[order], np.floor((start + displacement) / box).astype(np.int32))

        # Ghosts: all periodic images of the whole system inside [lower - w, upper + w), minus own atoms.
        exchange = GhostExchange(domain, positions, width, carried={"ids": arrays["ids"]})
        reference = make_periodic_ghosts(final, box, width)
        image_ids = np.concatenate([ids, ids[reference.source]])
        image_positions = np.concatenate([final, reference.positions])
        inside = np.all((image_positions >= domain.subbox.lower - width)
                        & (image_positions < domain.subbox.upper + width), axis=1)
        is_own = np.zeros(image_ids.size, bool)
        is_own[:n_particles] = np.isin(ids, arrays["ids"])
        expected = _rows(image_ids[inside & ~is_own], image_positions[inside & ~is_own])
        found = _rows(exchange.carried["ids"], exchange.positions)
        assert exchange.n_ghost == len(expected), (case, str(domain))
        assert np.array_equal(found, expected), (case, str(domain))

        # forward(): owned atoms move a little; ghosts follow with the build-time shifts, bit for bit.
        everything = np.concatenate([positions, exchange.positions])
        shifts = everything[exchange.n_local:] - final[exchange.carried["ids"] - 1]
        shifts = np.round(shifts / box) * box
        step = np.random.default_rng(100 + case).uniform(-0.1, 0.1, (n_particles, 3))
        everything[:exchange.n_local] += step[arrays["ids"] - 1]
        exchange.forward(everything)
        new_final = final + step
        assert np.array_equal(everything[exchange.n_local:], new_final[exchange.carried["ids"] - 1] + shifts)

    if comm.size == 4:
        _a_particle_two_sub_boxes_away_is_an_error_on_every_rank(comm)


def _a_particle_two_sub_boxes_away_is_an_error_on_every_rank(comm):
    from hpcgpu.errors import NumericalError
    from hpcgpu.particles import ParticleDomain, migrate

    domain = ParticleDomain(comm, (40.0, 5.0, 5.0), 2.5, dims=(4, 1, 1))
    positions = np.array([[domain.subbox.lower[0] + 1.0, 1.0, 1.0]])
    if comm.rank == 0:
        positions[0, 0] = 25.0  # sub-box 2 of 4: not adjacent to sub-box 0
    with pytest.raises(NumericalError, match="farther than one sub-box"):
        migrate(domain, positions, {"ids": np.array([comm.rank], np.int64)})


@pytest.mark.mpi(ranks=[1, 2], timeout=90)
def test_float32_atoms_on_a_sub_box_edge_have_one_owner(comm):
    """float32 positions that round onto (or just below) an edge or L: wrapped and owned consistently.

    The box of in.lj at 160 x 80 x 80 cells cut in two along x (the failing 2-GPU run): the inner edge
    ``E = L/2`` is not a float32 number, and ``float32(E) < E`` in float64 but ``== float32(E)`` in float32.
    Rank 0 starts with such atoms (chosen in float64, as the lattice setup does); after wrapping and
    migration in float32 each atom must have exactly one owner, the rank whose float32 sub-box holds it.
    """
    from apps.md.ghosts import wrap_positions
    from hpcgpu.particles import ParticleDomain, migrate

    edge = 134.3676953106006
    box = np.array([2 * edge, 10.0, 10.0])
    domain = ParticleDomain(comm, box, 2.8, dims=(comm.size, 1, 1))
    below = np.nextafter(np.float32(edge), np.float32(0))
    top = np.float32(box[0])
    x = np.array([np.float32(edge), below, np.nextafter(np.float32(edge), np.float32(1e9)), top,
                  np.nextafter(top, np.float32(0)), np.float32(0), -np.float32(1e-6)], np.float32)
    start = np.column_stack([x, np.full(x.size, 5.0, np.float32), np.full(x.size, 5.0, np.float32)])
    assert float(np.float32(edge)) < edge      # the case: float32(E) lies below E in float64
    ids = np.arange(1, x.size + 1, dtype=np.int64)
    # Initial owners decided in float64 (as the lattice setup does), on the float64 values of the atoms.
    mine = np.all((start.astype(np.float64) >= domain.subbox.lower) & (start.astype(np.float64) < domain.subbox.upper),
                  axis=1)
    if comm.rank == 0:
        mine |= (start[:, 0] < 0) | (start[:, 0].astype(np.float64) >= box[0])   # outside the box: rank 0 takes it
    positions = np.ascontiguousarray(start[mine])
    images = np.zeros((positions.shape[0], 3), np.int32)
    wrap_positions(positions, images, box)
    assert np.all((positions >= 0) & (positions < box.astype(np.float32)))
    positions, arrays = migrate(domain, positions, {"ids": ids[mine], "images": images})
    assert np.all(domain.subbox.contains(positions))
    all_ids, all_positions, all_images = _gather(comm, arrays["ids"], positions, arrays["images"])
    order = np.argsort(all_ids)
    assert np.array_equal(all_ids[order], ids), "each atom owned exactly once"
    assert np.array_equal(np.concatenate(comm.mpi.allgather(domain.owner_ranks(positions) == comm.rank)),
                          np.ones(x.size, bool))
    unwrapped = all_positions[order].astype(np.float64) + all_images[order] * box.astype(np.float32)
    np.testing.assert_allclose(unwrapped[:, 0], start[:, 0].astype(np.float64), atol=1e-4)

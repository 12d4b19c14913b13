"""ParticleDomain: sub-boxes tile the box, owners agree with a brute-force reference, neighbours are mutual.

Every process grid of the job's rank count is tried (4 ranks: 4x1x1, 1x4x1, 1x1x4, 2x2x1, 2x1x2, 1x2x2),
on a box whose three lengths differ, so sub-boxes are not cubes and no axis is special.
"""

import itertools

import numpy as np
import pytest

from hpcgpu.errors import DecompositionError
from tests.particles.particle_reference import block_edges, owner_blocks, process_grids

BOX = np.array([12.0, 11.3, 12.7])   # four ghost widths of 2.8 fit along every axis
WIDTH = 2.8


def test_choose_particle_dims_refuses_bad_input_with_the_fix():
    from hpcgpu.particles import choose_particle_dims

    with pytest.raises(DecompositionError, match="expected 3 positive lengths"):
        choose_particle_dims(1, (10.0, 10.0), WIDTH)
    with pytest.raises(DecompositionError, match="expected 3 positive lengths"):
        choose_particle_dims(1, (10.0, -1.0, 10.0), WIDTH)
    with pytest.raises(DecompositionError, match="expected a positive ghost width"):
        choose_particle_dims(1, BOX, 0.0)
    with pytest.raises(DecompositionError, match="expected 3 entries"):
        choose_particle_dims(2, BOX, WIDTH, dims=(2, 1))
    with pytest.raises(DecompositionError, match=r"dims \(x, y, z\) = \(5, 1, 1\).*at most 4 x 4 x 4"):
        choose_particle_dims(5, BOX, WIDTH, dims=(5, 1, 1))
    assert choose_particle_dims(4, BOX, WIDTH, dims=(0, 4, 0)) == (1, 4, 1)


def test_sub_box_contains_is_half_open_in_the_positions_precision():
    from hpcgpu.particles import SubBox

    subbox = SubBox(lower=np.array([0.0, 0.0, 0.0]), upper=np.array([1.0, 0.7, 1.0]))
    points = np.array([[0.0, 0.0, 0.0], [1.0, 0.5, 0.5], [0.5, 0.7, 0.5], [0.5, np.nextafter(0.7, 0), 0.5]])
    assert subbox.contains(points).tolist() == [True, False, False, True]
    # float32(0.7) lies below 0.7: inside in float64, but it IS the edge in float32, so outside (the edge is
    # rounded to the positions' dtype first, as migration and owner_ranks decide).
    edge32 = np.float32(0.7)
    assert float(edge32) < 0.7
    points32 = np.array([[0.5, edge32, 0.5], [0.5, np.nextafter(edge32, np.float32(0)), 0.5]], dtype=np.float32)
    assert subbox.contains(points32).tolist() == [False, True]


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=90)
def test_every_process_grid_tiles_the_box_with_mutual_neighbours(comm):
    """For every grid of this rank count: the sub-boxes, owners and neighbours (one launch per rank count)."""
    from hpcgpu.particles import ParticleDomain

    rng = np.random.default_rng(11)
    for dims in process_grids(comm.size):
        domain = ParticleDomain(comm, BOX, WIDTH, dims=dims)
        assert domain.dims == dims
        _check_sub_boxes_and_owners(comm, domain, dims, rng)
        _check_neighbours(comm, domain, dims)


def _check_sub_boxes_and_owners(comm, domain, dims, rng):
    """This rank's sub-box is its block, all sub-boxes cover the box once, owners match the reference."""
    assert f"{dims[0]} x {dims[1]} x {dims[2]} sub-boxes" in domain.describe()
    for axis in range(3):
        lower, upper = block_edges(BOX[axis], dims[axis], domain.coords[axis])
        assert (domain.subbox.lower[axis], domain.subbox.upper[axis]) == (lower, upper)
    every = comm.mpi.allgather((domain.coords, domain.subbox.lower, domain.subbox.upper))
    assert sorted(coords for coords, _, _ in every) == sorted(np.ndindex(*dims))
    volume = sum(float(np.prod(upper - lower)) for _, lower, upper in every)
    assert volume == pytest.approx(float(np.prod(BOX)), rel=1e-12)

    # Owners: random points, the box's edges and points just below them, in float64 and float32.
    for dtype in (np.float64, np.float32):
        points = rng.uniform(0.0, 1.0, (500, 3)) * BOX
        edges = np.array([[block_edges(BOX[a], dims[a], c)[0] for a in range(3)]
                          for c in range(max(dims))], dtype=np.float64)
        edges = np.minimum(edges, BOX * 0.999)   # a block index beyond dims[a]: any point inside the box
        points = np.concatenate([points, edges, np.nextafter(edges, 0)]).astype(dtype)
        points = np.where(points >= BOX.astype(dtype), 0, points).astype(dtype)
        owners = domain.owner_ranks(points)
        reference = owner_blocks(points, BOX, dims)
        assert np.all(reference >= 0)
        assert np.array_equal(owners, domain.rank_table[reference[:, 0], reference[:, 1], reference[:, 2]])
        # The owner's own sub-box test agrees, and every rank computes the same owners.
        assert np.array_equal(domain.subbox.contains(points), owners == comm.rank)
        held = np.sum(comm.mpi.allgather(domain.subbox.contains(points)), axis=0)
        assert np.all(held == 1), "every point lies in exactly one sub-box"
        assert all(np.array_equal(other, owners) for other in comm.mpi.allgather(owners))


def _check_neighbours(comm, domain, dims):
    """The 26 neighbours are the adjacent blocks (periodic), with the frame shifts, and mutual."""
    coords_of = dict(enumerate(comm.mpi.allgather(domain.coords)))
    assert sorted(n.offset for n in domain.neighbors) == [
        offset for offset in itertools.product((-1, 0, 1), repeat=3) if any(offset)]
    table = {}
    for neighbor in domain.neighbors:
        target = np.add(domain.coords, neighbor.offset)
        assert coords_of[neighbor.rank] == tuple(int(c) for c in target % dims)
        # +L when the step crosses the lower boundary (the sender's frame is one box lower), -L the upper.
        expected_shift = -np.floor_divide(target, dims) * BOX
        assert np.array_equal(neighbor.shift, expected_shift), (neighbor, dims)
        table[neighbor.offset] = (neighbor.rank, neighbor.shift)
    assert domain.neighbor_ranks == sorted({rank for rank, _ in table.values()} - {comm.rank})
    # Mutual: if B is A's neighbour in direction d, A is B's in direction -d, with the opposite shift.
    tables = comm.mpi.allgather(table)
    for offset, (rank, shift) in table.items():
        back_rank, back_shift = tables[rank][tuple(-o for o in offset)]
        assert back_rank == comm.rank and np.array_equal(back_shift, -shift)

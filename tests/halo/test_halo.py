"""Halo exchange on the CPU: rank ids in ghosts, random fields against a global reference."""

import itertools

import numpy as np
import pytest

from tests.halo.halo_reference import expected_padded

CASES = [
    # (global_shape, periodic, halo_width, dims)
    ((9,), (True,), 1, None),
    ((13,), (False,), 3, None),
    ((7, 9), (False, False), 1, None),
    ((7, 9), (True, False), 2, None),
    ((8, 11), (True, True), 3, None),
    ((12, 5), (False, True), (2, 1), None),
    ((16, 9), (True, True), (1, 0), (0, 1)),   # rows only: contiguous faces sent without packing
    ((5, 6, 7), (True, True, True), 1, None),
    ((6, 6, 5), (False, True, False), 2, None),
    ((9, 4, 5), (True, False, True), (1, 2, 1), None),
]


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_each_ghost_cell_holds_its_neighbours_rank_id(comm):
    """Fill every block with its rank id; after the exchange each ghost region holds the id of the
    neighbour in that direction (faces, edges and corners), and -1 beyond non-periodic edges::

        2D, 4 ranks, periodic in x only:   ghost row above rank 0 = -1 (wall)
                                           ghost column left of rank 0 = rank 1 (wraps)
    """
    import hpcgpu
    from hpcgpu.halo.regions import directions, region_slices

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for shape, periodic in [((12,), (True,)), ((9, 10), (False, True)), ((6, 7, 8), (True, False, True))]:
        grid = hpcgpu.Decomposition(comm, shape, periodic=periodic)
        field = hpcgpu.Field(grid, arch, halo_width=2, dtype="int64")
        field.data[...] = -1
        field.interior[...] = comm.rank
        field.exchange_halos()
        for d in directions(grid.ndim):
            ghosts = field.data[region_slices("recv", d, grid.local_shape, field.halo_width)]
            neighbour = grid.neighbor(d)
            assert np.all(ghosts == (-1 if neighbour is None else neighbour)), (shape, d)
        assert np.all(field.interior == comm.rank)


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_random_fields_match_a_global_reference(comm):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for case_index, (shape, periodic, halo, dims) in enumerate(CASES):
        grid = hpcgpu.Decomposition(comm, shape, dims=dims, periodic=periodic)
        rng = np.random.default_rng(case_index)
        global_array = rng.standard_normal(shape)
        field = hpcgpu.Field(grid, arch, halo_width=halo, dtype="float64")
        field.data[...] = np.nan
        field.scatter(global_array if comm.rank == 0 else None)
        field.exchange_halos()
        expected, mask = expected_padded(global_array, grid, field.halo_width)
        assert np.array_equal(field.data[mask], expected[mask]), (case_index, str(grid))
        assert np.all(np.isnan(field.data[~mask])), "ghosts beyond a non-periodic edge must be left alone"


@pytest.mark.mpi(ranks=[1, 2, 4])
def test_several_fields_in_one_split_exchange(comm):
    """Three fields travel together; interior work between start() and wait() sees the old ghosts."""
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, (10, 12), periodic=(True, True))
    rng = np.random.default_rng(7)
    globals_ = [rng.standard_normal(grid.global_shape) for _ in range(3)]
    fields = [hpcgpu.Field(grid, arch, halo_width=1, name=f"f{i}") for i in range(3)]
    for f, g in zip(fields, globals_):
        f.scatter(g if comm.rank == 0 else None)
    pending = hpcgpu.exchange_halos(fields, wait=False)
    interior_sum = sum(float(f.interior.sum()) for f in fields)  # overlapped work
    pending.wait()
    pending.wait()  # idempotent
    for f, g in zip(fields, globals_):
        expected, mask = expected_padded(g, grid, f.halo_width)
        assert np.array_equal(f.data[mask], expected[mask])
    assert np.isfinite(interior_sum)
    # The plan is built once and reused.
    hpcgpu.exchange_halos(fields)
    assert len(fields[0]._halo_plans) == 1


@pytest.mark.mpi(ranks=[2, 4])
def test_faces_only_leaves_corners_alone(comm):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    grid = hpcgpu.Decomposition(comm, (8, 8), dims=(2, 0), periodic=(True, True))
    field = hpcgpu.Field(grid, arch, halo_width=1)
    field.data[...] = -5.0
    field.interior[...] = comm.rank
    field.exchange_halos(corners=False)
    for corner in itertools.product((0, -1), repeat=2):
        assert field.data[corner] == -5.0
    assert np.all(field.data[0, 1:-1] == grid.neighbor((-1, 0)))


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_gather_and_scatter_round_trip(comm):
    import hpcgpu

    arch = hpcgpu.arch.auto(comm, backend="numpy")
    for shape in [(7,), (5, 9), (4, 5, 6)]:
        grid = hpcgpu.Decomposition(comm, shape, periodic=True)
        field = hpcgpu.Field(grid, arch, halo_width=1, dtype="float32")
        field.set_from_global(lambda *index: sum((10 ** a) * i for a, i in enumerate(index)))
        gathered = field.gather(root=0)
        expected = np.fromfunction(lambda *index: sum((10 ** a) * i for a, i in enumerate(index)), shape)
        if comm.rank == 0:
            assert np.array_equal(gathered, expected.astype("float32"))
        else:
            assert gathered is None
        copy = hpcgpu.Field(grid, arch, halo_width=2, dtype="float32")
        copy.scatter(gathered, root=0)
        assert np.array_equal(copy.interior, field.interior)

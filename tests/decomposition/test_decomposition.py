"""Decomposition: block sizes, automatic dims, index mapping and neighbours (serial and multi-rank)."""

import numpy as np
import pytest

from hpcgpu.decomposition import choose_dims, split_extents
from hpcgpu.errors import DecompositionError


def test_split_extents_gives_remainder_to_first_blocks():
    assert split_extents(10, 3) == [4, 3, 3]
    assert split_extents(9, 3) == [3, 3, 3]
    assert split_extents(5, 5) == [1, 1, 1, 1, 1]
    assert sum(split_extents(1001, 7)) == 1001


def test_choose_dims_minimises_cut_area():
    assert choose_dims(4, (100, 100)) == (2, 2)
    assert choose_dims(4, (1000, 10)) == (4, 1)   # cut the long axis
    assert choose_dims(8, (64, 64, 64)) == (2, 2, 2)
    assert choose_dims(6, (60, 40)) == (3, 2)


def test_choose_dims_honours_fixed_entries_and_wildcards():
    assert choose_dims(6, (60, 60), dims=(0, 3)) == (2, 3)
    assert choose_dims(6, (60, 60), dims=("*", 1)) == (6, 1)
    assert choose_dims(8, (16, 16, 16), dims=(None, 2, "*"))[1] == 2


@pytest.mark.parametrize(
    "n_ranks, shape, dims",
    [(4, (3, 1), None), (5, (100, 100), (2, 0)), (2, (10, 10), (1, 1)), (3, (8,), (2,))],
)
def test_impossible_decompositions_explain_themselves(n_ranks, shape, dims):
    with pytest.raises(DecompositionError, match="cannot split|dims"):
        choose_dims(n_ranks, shape, dims)


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_blocks_tile_the_grid_and_neighbours_are_consistent(comm):
    import hpcgpu

    for shape, periodic in [((11, 7), (False, True)), ((5, 6, 7), (True, False, True)), ((13,), (True,))]:
        grid = hpcgpu.Decomposition(comm, shape, periodic=periodic)
        # Every global cell is owned exactly once.
        owned = np.zeros(shape, dtype=np.int64)
        owned[grid.local_slices] += 1
        total = comm.allreduce(owned, "sum")
        assert np.all(total == 1), str(grid)
        # owner_of / global_to_local agree with local_slices.
        corner = grid.local_start
        assert grid.owner_of(corner) == comm.rank
        assert grid.global_to_local(corner) == (0,) * grid.ndim
        assert grid.local_to_global((0,) * grid.ndim) == corner
        # Neighbour relation is symmetric: my +d neighbour has me as its -d neighbour.
        for offset, rank in grid.neighbors.items():
            mine = rank if rank is not None else -1
            theirs = comm.mpi.allgather(mine)
            opposite = tuple(-d for d in offset)
            back = comm.mpi.allgather(grid.neighbor(opposite) if grid.neighbor(opposite) is not None else -1)
            if mine >= 0:
                assert back[mine] == comm.rank, (offset, str(grid))
            del theirs
        assert "Decomposition" in str(grid)


@pytest.mark.parametrize("shape, halo, rim", [
    ((5, 7), (1, 1), None), ((2, 9), (1, 1), None), ((1, 1), (1, 1), None), ((6, 5, 4), (2, 1, 1), None),
    ((8, 8), (1, 0), None), ((9, 4), (2, 2), (1, 1)), ((3,), (1,), None),
])
def test_split_owned_covers_every_owned_cell_exactly_once(shape, halo, rim):
    from hpcgpu.halo.regions import split_owned

    interior, slabs = split_owned(shape, halo, rim)
    count = np.zeros([n + 2 * w for n, w in zip(shape, halo)], dtype=int)
    for region in ([interior] if interior else []) + slabs:
        count[tuple(slice(region[2 * a], region[2 * a + 1]) for a in range(len(shape)))] += 1
    owned = tuple(slice(w, w + n) for w, n in zip(halo, shape))
    assert np.all(count[owned] == 1)
    assert count.sum() == np.prod(shape)
    if interior:
        widths = rim or halo
        for a, w in enumerate(widths):   # the interior never touches ghost cells
            assert interior[2 * a] - w >= halo[a] and interior[2 * a + 1] + w <= halo[a] + shape[a]

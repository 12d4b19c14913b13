"""Jacobi sweep on the CPU: parity with a NumPy-slicing reference, region splits, tiling, bad input."""

import numpy as np
import pytest

from apps.stencil.jacobi import fill_initial_state, fixed_local_columns, jacobi_sweep, n_lattice_updates
from hpcgpu.errors import ConfigurationError


def reference_sweep(out, inp, region, fixed_columns):
    """NumPy slicing reference: returns (new out, residual as float64)."""
    j0, j1, i0, i1 = region
    quarter = inp.dtype.type(0.25)
    block = quarter * (
        (inp[j0:j1, i0 + 1 : i1 + 1] + inp[j0:j1, i0 - 1 : i1 - 1])
        + (inp[j0 + 1 : j1 + 1, i0:i1] + inp[j0 - 1 : j1 - 1, i0:i1])
    )
    computed = np.ones(i1 - i0, dtype=bool)
    for column in fixed_columns:
        if i0 <= column < i1:
            computed[column - i0] = False
    result = out.copy()
    result[j0:j1, i0:i1][:, computed] = block[:, computed]
    difference = block[:, computed].astype(np.float64) - inp[j0:j1, i0:i1][:, computed]
    return result, float(np.sum(difference * difference))


def random_pair(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


def split_region(region, rng, n_row_cuts=2, n_column_cuts=2):
    """Guillotine split of a 2D region into random sub-regions (some possibly empty)."""
    j0, j1, i0, i1 = region
    row_cuts = [j0, *sorted(rng.integers(j0, j1 + 1, n_row_cuts)), j1]
    pieces = []
    for a, b in zip(row_cuts[:-1], row_cuts[1:]):
        column_cuts = [i0, *sorted(rng.integers(i0, i1 + 1, n_column_cuts)), i1]
        pieces += [(a, b, c, d) for c, d in zip(column_cuts[:-1], column_cuts[1:])]
    return pieces


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "region, fixed_columns",
    [((1, 11, 1, 16), (1, 15)), ((3, 9, 2, 13), (5,)), ((1, 11, 1, 16), ()), ((4, 4, 1, 16), (1,))],
)
def test_matches_numpy_reference_bitwise(dtype, region, fixed_columns):
    out, inp = random_pair((12, 17), dtype, seed=1)
    expected, expected_residual = reference_sweep(out, inp, region, fixed_columns)
    residual = np.zeros(1)
    jacobi_sweep(out, inp, region, fixed_columns, residual)
    np.testing.assert_array_equal(out, expected)
    assert residual[0] == pytest.approx(expected_residual, rel=1e-13, abs=0.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_any_split_of_the_region_gives_the_same_result(dtype):
    out, inp = random_pair((20, 23), dtype, seed=2)
    region, fixed = (1, 19, 1, 22), (1, 21)
    whole, whole_residual = out.copy(), np.zeros(1)
    jacobi_sweep(whole, inp, region, fixed, whole_residual)
    rng = np.random.default_rng(3)
    for _ in range(5):
        pieces, residual = out.copy(), np.zeros(1)
        for sub_region in split_region(region, rng):
            jacobi_sweep(pieces, inp, sub_region, fixed, residual)
        np.testing.assert_array_equal(pieces, whole)
        assert residual[0] == pytest.approx(whole_residual[0], rel=1e-13)


def fill_periodic_rows(padded):
    """Ghost rows of a global padded array: periodic in y (ghost columns stay as they are)."""
    padded[0] = padded[-2]
    padded[-1] = padded[1]


@pytest.mark.parametrize("dtype", ["float32"])
def test_tiled_run_equals_untiled_run_bitwise(dtype):
    ny, nx, n_sweeps = 13, 17, 12
    row_edges, column_edges = (0, 5, 9, 13), (0, 6, 17)  # uneven tiles, Dirichlet columns in two tiles
    current = np.zeros((ny + 2, nx + 2), dtype)
    fill_initial_state(current, (0, 0), (ny, nx))
    untiled, untiled_next = current.copy(), current.copy()
    tiled, tiled_next = current.copy(), current.copy()
    for _ in range(n_sweeps):
        fill_periodic_rows(untiled)
        untiled_residual = np.zeros(1)
        jacobi_sweep(untiled_next, untiled, (1, ny + 1, 1, nx + 1), (1, nx), untiled_residual)
        untiled, untiled_next = untiled_next, untiled

        fill_periodic_rows(tiled)
        tiled_residual = np.zeros(1)
        for y0, y1 in zip(row_edges[:-1], row_edges[1:]):
            for x0, x1 in zip(column_edges[:-1], column_edges[1:]):
                # A tile's padded arrays, ghosts filled from the global array (what a halo exchange does).
                tile_in = tiled[y0 : y1 + 2, x0 : x1 + 2].copy()
                tile_out = tiled_next[y0 : y1 + 2, x0 : x1 + 2].copy()
                fixed = fixed_local_columns(x0, x1 - x0, nx)
                jacobi_sweep(tile_out, tile_in, (1, y1 - y0 + 1, 1, x1 - x0 + 1), fixed, tiled_residual)
                tiled_next[y0 + 1 : y1 + 1, x0 + 1 : x1 + 1] = tile_out[1:-1, 1:-1]
        tiled, tiled_next = tiled_next, tiled
        assert tiled_residual[0] == pytest.approx(untiled_residual[0], rel=1e-12)
    np.testing.assert_array_equal(tiled[1:-1, 1:-1], untiled[1:-1, 1:-1])


def test_fixed_columns_are_never_written():
    out, inp = random_pair((6, 9), "float64", seed=4)
    before = out.copy()
    jacobi_sweep(out, inp, (1, 5, 1, 8), (1, 7))
    np.testing.assert_array_equal(out[:, [0, 1, 7, 8]], before[:, [0, 1, 7, 8]])
    assert n_lattice_updates((1, 5, 1, 8), (1, 7)) == 4 * 5
    assert n_lattice_updates((1, 5, 2, 7), (1, 7)) == 4 * 5


def test_ghost_columns_beyond_the_dirichlet_columns_are_never_read():
    """Why Jacobi declares no physical boundary condition (hpcgpu.halo.boundaries): the cells next to
    its x edges are the fixed columns, which the sweep skips, so NaN in the ghost columns beyond them
    changes nothing (ghost rows are periodic, filled by the exchange)."""
    out, inp = random_pair((6, 9), "float64", seed=6)
    reference_out, residual = out.copy(), np.zeros(1)
    jacobi_sweep(reference_out, inp, (1, 5, 1, 8), (1, 7), residual)
    inp[:, [0, 8]] = np.nan
    poisoned_residual = np.zeros(1)
    jacobi_sweep(out, inp, (1, 5, 1, 8), (1, 7), poisoned_residual)
    np.testing.assert_array_equal(out, reference_out)
    assert poisoned_residual[0] == residual[0]


def test_residual_accumulates_into_existing_value():
    out, inp = random_pair((6, 9), "float32", seed=5)
    residual = np.array([2.5])
    _, expected = reference_sweep(out, inp, (1, 5, 1, 8), ())
    jacobi_sweep(out, inp, (1, 5, 1, 8), (), residual)
    assert residual[0] == pytest.approx(2.5 + expected, rel=1e-13)


def test_bad_arguments_raise_clear_errors():
    out, inp = random_pair((6, 9), "float64", seed=6)
    with pytest.raises(ConfigurationError, match="share memory"):
        jacobi_sweep(inp, inp, (1, 5, 1, 8))
    with pytest.raises(ConfigurationError, match="float32 or float64"):
        jacobi_sweep(out.astype(np.int64), inp.astype(np.int64), (1, 5, 1, 8))
    with pytest.raises(ConfigurationError, match="must match"):
        jacobi_sweep(out.astype(np.float32), inp, (1, 5, 1, 8))
    with pytest.raises(ConfigurationError, match="2-d padded array"):
        jacobi_sweep(out[None], inp[None], (1, 5, 1, 8))
    with pytest.raises(ConfigurationError, match="ghost cells cannot be updated"):
        jacobi_sweep(out, inp, (0, 5, 1, 8))
    with pytest.raises(ConfigurationError, match="ghost cells cannot be updated"):
        jacobi_sweep(out, inp, (1, 5, 1, 9))
    with pytest.raises(ConfigurationError, match="4 integers"):
        jacobi_sweep(out, inp, (1, 5, 1))
    with pytest.raises(ConfigurationError, match="at most 2 distinct fixed columns"):
        jacobi_sweep(out, inp, (1, 5, 1, 8), (1, 2, 3))
    with pytest.raises(ConfigurationError, match="1-element float64"):
        jacobi_sweep(out, inp, (1, 5, 1, 8), (), np.zeros(1, dtype=np.float32))
    with pytest.raises(ConfigurationError, match="GPU variant"):
        jacobi_sweep(out, inp, (1, 5, 1, 8), variant="march_vec2")
    with pytest.raises(ConfigurationError, match="numpy or cupy array"):
        jacobi_sweep(out.tolist(), inp, (1, 5, 1, 8))

"""heat3d step on the CPU: NumPy-slicing reference parity, region splits, tiling, bad input."""

import numpy as np
import pytest

from apps.stencil.heat3d import heat3d_step, n_lattice_updates
from hpcgpu.errors import ConfigurationError, NumericalError


def reference_step(out, inp, region, r):
    """NumPy slicing reference of one step over ``region`` (same association order as the kernels)."""
    k0, k1, j0, j1, i0, i1 = region
    dtype = inp.dtype.type

    def shifted(dk, dj, di):
        return inp[k0 + dk : k1 + dk, j0 + dj : j1 + dj, i0 + di : i1 + di]

    center = shifted(0, 0, 0)
    neighbours = ((shifted(0, 0, 1) + shifted(0, 0, -1)) + (shifted(0, 1, 0) + shifted(0, -1, 0))) + (
        shifted(1, 0, 0) + shifted(-1, 0, 0)
    )
    result = out.copy()
    result[k0:k1, j0:j1, i0:i1] = center + dtype(r) * (neighbours - dtype(6.0) * center)
    return result


def random_pair(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("region", [(1, 7, 1, 8, 1, 10), (2, 5, 3, 7, 1, 4), (1, 7, 3, 3, 1, 10)])
def test_matches_numpy_reference_bitwise(dtype, region):
    out, inp = random_pair((8, 9, 11), dtype, seed=1)
    expected = reference_step(out, inp, region, 0.13)
    heat3d_step(out, inp, region, 0.13)
    np.testing.assert_array_equal(out, expected)


def split_region(region, rng):
    """Split a 3D region into random boxes: random cuts along each axis (a product grid of pieces)."""
    cuts = []
    for axis in range(3):
        start, stop = region[2 * axis], region[2 * axis + 1]
        edges = [start, *sorted(rng.integers(start, stop + 1, 2)), stop]
        cuts.append(list(zip(edges[:-1], edges[1:])))
    return [(*a, *b, *c) for a in cuts[0] for b in cuts[1] for c in cuts[2]]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_any_split_of_the_region_gives_the_same_result(dtype):
    out, inp = random_pair((9, 8, 10), dtype, seed=2)
    region = (1, 8, 1, 7, 1, 9)
    whole = out.copy()
    heat3d_step(whole, inp, region, 1.0 / 6.0)
    rng = np.random.default_rng(3)
    for _ in range(3):
        pieces = out.copy()
        for sub_region in split_region(region, rng):
            heat3d_step(pieces, inp, sub_region, 1.0 / 6.0)
        np.testing.assert_array_equal(pieces, whole)


def fill_periodic_ghosts(padded):
    """Periodic ghost layer of width 1 on every axis (what the halo exchange gives one rank)."""
    padded[...] = np.pad(padded[1:-1, 1:-1, 1:-1], 1, mode="wrap")


def test_tiled_run_equals_untiled_run_bitwise():
    shape, n_steps, r = (7, 6, 9), 8, 0.15
    edges = ((0, 3, 7), (0, 4, 6), (0, 2, 5, 9))  # uneven tiles on every axis
    rng = np.random.default_rng(4)
    untiled = np.zeros(tuple(n + 2 for n in shape))
    untiled[1:-1, 1:-1, 1:-1] = rng.standard_normal(shape)
    tiled = untiled.copy()
    untiled_next, tiled_next = untiled.copy(), tiled.copy()
    for _ in range(n_steps):
        fill_periodic_ghosts(untiled)
        heat3d_step(untiled_next, untiled, (1, shape[0] + 1, 1, shape[1] + 1, 1, shape[2] + 1), r)
        untiled, untiled_next = untiled_next, untiled

        fill_periodic_ghosts(tiled)
        for z0, z1 in zip(edges[0][:-1], edges[0][1:]):
            for y0, y1 in zip(edges[1][:-1], edges[1][1:]):
                for x0, x1 in zip(edges[2][:-1], edges[2][1:]):
                    tile_in = tiled[z0 : z1 + 2, y0 : y1 + 2, x0 : x1 + 2].copy()
                    tile_out = np.zeros_like(tile_in)
                    heat3d_step(tile_out, tile_in, (1, z1 - z0 + 1, 1, y1 - y0 + 1, 1, x1 - x0 + 1), r)
                    tiled_next[z0 + 1 : z1 + 1, y0 + 1 : y1 + 1, x0 + 1 : x1 + 1] = tile_out[1:-1, 1:-1, 1:-1]
        tiled, tiled_next = tiled_next, tiled
    np.testing.assert_array_equal(tiled[1:-1, 1:-1, 1:-1], untiled[1:-1, 1:-1, 1:-1])


def test_lattice_update_count():
    assert n_lattice_updates((1, 3, 1, 5, 2, 4)) == 2 * 4 * 2
    assert n_lattice_updates((1, 1, 1, 5, 2, 4)) == 0


def test_bad_arguments_raise_clear_errors():
    out, inp = random_pair((5, 6, 7), "float64", seed=5)
    region = (1, 4, 1, 5, 1, 6)
    with pytest.raises(NumericalError, match="1/6"):
        heat3d_step(out, inp, region, 0.17)
    with pytest.raises(NumericalError, match="1/6"):
        heat3d_step(out, inp, region, -0.01)
    with pytest.raises(ConfigurationError, match="real diffusion number"):
        heat3d_step(out, inp, region, "fast")
    with pytest.raises(ConfigurationError, match="3-d padded array"):
        heat3d_step(out[0], inp[0], region, 0.1)
    with pytest.raises(ConfigurationError, match="6 integers"):
        heat3d_step(out, inp, region[:4], 0.1)
    with pytest.raises(ConfigurationError, match="ghost cells cannot be updated"):
        heat3d_step(out, inp, (1, 5, 1, 5, 1, 6), 0.1)
    with pytest.raises(ConfigurationError, match="share memory"):
        heat3d_step(inp[:, :, :], inp, region, 0.1)
    with pytest.raises(ConfigurationError, match="must match"):
        heat3d_step(out.astype(np.float32), inp, region, 0.1)

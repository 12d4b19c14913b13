"""The shallow-water core: one set of discrete equations, one kernel, two grids.

The lat-lon expressions with the channel's metrics (unit factors, 1/dx and 1/dy per row, f per row
broadcast along x, a flat bottom) are the channel's expressions bit for bit; and the core's one
Numba kernel reproduces both grids' references, its filtered-row path included.
"""

import types

import numpy as np
import pytest
from sphere_reference import reference_stage as latlon_reference
from swe_reference import reference_stage as channel_reference

from apps.stencil.swe_scheme import ROW_ARRAYS, channel_metrics, shallow_water_stage
from apps.stencil.channel import SWEParameters, tile_parameters

SHAPE = (13 + 2, 17 + 2)
REGION = (1, 14, 1, 18)


def random_fields(shape, rng, dtype=np.float64):
    h = 100.0 + 5.0 * rng.standard_normal(shape)
    return [h.astype(dtype), rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)]


def latlon_view_of(metrics, shape):
    """The channel's metrics in the form the lat-lon reference reads (``SphereTile``'s attributes)."""
    view = {name: getattr(metrics, name) for name in ROW_ARRAYS}
    view.update(coriolis=np.broadcast_to(metrics.coriolis[:, None], shape), topography=np.zeros(shape, metrics.dtype),
                gravity=metrics.gravity, rdy=metrics.rdy, dtype=metrics.dtype)  # fmt: skip
    return types.SimpleNamespace(**view)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row_start, n_rows", [(0, 13), (4, 13), (7, 13)])
def test_latlon_expressions_with_channel_metrics_are_the_channels_bitwise(dtype, row_start, n_rows):
    """South-wall, inner and north-wall tiles; no dissipation (the lat-lon grid has none)."""
    rng = np.random.default_rng(row_start)
    parameters = SWEParameters(nx=17, ny=20, viscosity=0.0, hyperviscosity=0.0)
    params = tile_parameters(parameters, row_start, n_rows, 1, dtype=dtype)
    stage, base = random_fields(SHAPE, rng, dtype), random_fields(SHAPE, rng, dtype)
    no_rows = np.zeros(SHAPE[0], np.int8)
    for a, b in ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0)):
        channel = [np.full(SHAPE, np.nan, dtype) for _ in range(3)]
        latlon = [np.full(SHAPE, np.nan, dtype) for _ in range(3)]
        unused = [np.full(SHAPE, np.nan, dtype) for _ in range(3)]
        channel_reference(channel, base, stage, a, b, 60.0, params, REGION)
        latlon_reference(latlon, base, stage, unused, a, b, 60.0, latlon_view_of(params.metrics, SHAPE), no_rows, REGION)
        for channel_field, latlon_field in zip(channel, latlon):
            np.testing.assert_array_equal(channel_field, latlon_field)


@pytest.mark.parametrize("viscosity, hyperviscosity", [(0.0, 0.0), (40.0, 0.0), (0.0, 2.0e9), (40.0, 2.0e9)])
def test_one_kernel_serves_the_channel_with_every_option(viscosity, hyperviscosity):
    """The core kernel with channel metrics, (hyper)viscosity on or off, equals the channel's reference."""
    rng = np.random.default_rng(5)
    parameters = SWEParameters(nx=17, ny=13, viscosity=viscosity, hyperviscosity=hyperviscosity)
    w = parameters.halo_width
    params = tile_parameters(parameters, 0, 13, w)
    shape = (13 + 2 * w, 17 + 2 * w)
    region = (w, 13 + w, w, 17 + w)
    stage, base = random_fields(shape, rng), random_fields(shape, rng)
    kernel = [np.full(shape, np.nan) for _ in range(3)]
    reference = [np.full(shape, np.nan) for _ in range(3)]
    shallow_water_stage(kernel, base, stage, 0.75, 0.25, 45.0, params.metrics, region)
    channel_reference(reference, base, stage, 0.75, 0.25, 45.0, params, region)
    for kernel_field, reference_field in zip(kernel, reference):
        np.testing.assert_array_equal(kernel_field, reference_field)


def test_filtered_rows_take_the_increment_on_any_metrics():
    """Filtered rows store dt*L and leave out alone; the other rows are the plain stage (channel metrics)."""
    rng = np.random.default_rng(11)
    params = tile_parameters(SWEParameters(nx=17, ny=13, hyperviscosity=0.0), 0, 13, 1)
    stage, base = random_fields(SHAPE, rng), random_fields(SHAPE, rng)
    filtered = np.zeros(SHAPE[0], np.int8)
    filtered[[1, 2, 13]] = 1
    sentinel = rng.standard_normal(SHAPE)
    out, increment = [sentinel.copy() for _ in range(3)], [sentinel.copy() for _ in range(3)]
    shallow_water_stage(out, base, stage, 0.0, 1.0, 30.0, params.metrics, REGION, increment, filtered)
    plain = [sentinel.copy() for _ in range(3)]
    shallow_water_stage(plain, base, stage, 0.0, 1.0, 30.0, params.metrics, REGION)
    rows = filtered[REGION[0]:REGION[1]] != 0
    for field in range(3):
        new, inc = out[field][1:14, 1:18], increment[field][1:14, 1:18]
        expected_new = plain[field][1:14, 1:18]
        np.testing.assert_array_equal(new[~rows], expected_new[~rows])
        np.testing.assert_array_equal(new[rows], sentinel[1:14, 1:18][rows])
        # a = 0, b = 1: plain = stage + dt*L, so the increment is plain - stage up to one rounding.
        np.testing.assert_allclose(inc[rows], (expected_new - stage[field][1:14, 1:18])[rows], rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(inc[~rows], sentinel[1:14, 1:18][~rows])


def test_channel_metrics_are_unit_factors_and_spacings():
    rows = np.linspace(1e-4, 2e-4, 9)
    metrics = channel_metrics(5.0e3, 4.0e3, rows, np.ones(9), 9.81)
    assert metrics.uniform and metrics.topography is None and metrics.stencil_reach == 1
    for name in ("cos_center", "rcos_center", "cos_face"):
        np.testing.assert_array_equal(getattr(metrics, name), 1.0)
    np.testing.assert_array_equal(metrics.rdx_center, 1.0 / 5.0e3)
    np.testing.assert_array_equal(metrics.rdy_face, 1.0 / 4.0e3)
    assert metrics.rdy == 1.0 / 4.0e3 and metrics.rdx2 == 1.0 / 25.0e6


def test_small_regions_march_fewer_rows_per_warp():
    """512 x 256 on a 132-SM GPU: 19 warps side by side need 4-row marches to reach 8 warps per SM;
    8192 x 4096 keeps the measured defaults; shapes not compiled fall back to one row ahead."""
    from apps.stencil.swe_scheme.cuda_march import MARCH_SHAPES
    from apps.stencil.swe_scheme.stage_gpu import fitted_march_shape

    assert fitted_march_shape((16, 2), 19, 256, MARCH_SHAPES, multiprocessors=132) == (4, 2)
    assert fitted_march_shape((32, 1), 19, 256, MARCH_SHAPES, multiprocessors=132) == (4, 1)
    assert fitted_march_shape((16, 2), 293, 4096, MARCH_SHAPES, multiprocessors=132) == (16, 2)
    assert fitted_march_shape((32, 1), 129, 1800, MARCH_SHAPES, multiprocessors=132) == (32, 1)
    assert fitted_march_shape((16, 2), 19, 2, MARCH_SHAPES, multiprocessors=132) == (4, 2)   # a thin rim slab
    assert fitted_march_shape((32, 2), 40, 256, ((32, 2), (8, 1)), multiprocessors=132) == (8, 1)

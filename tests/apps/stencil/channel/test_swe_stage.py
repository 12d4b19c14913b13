"""The fused stage kernel against the NumPy slicing reference, region splitting and input checks."""

import numpy as np
import pytest

from hpcgpu.errors import ConfigurationError
from swe_reference import owned_region, reference_stage

from apps.stencil.channel import SWEParameters, swe_stage, tile_parameters

# Moderate viscosities so both optional terms contribute visibly to the tendency.
PARAMETERS = SWEParameters(nx=19, ny=13, dx=5.0e3, dy=4.0e3, viscosity=40.0, hyperviscosity=2.0e9)


def random_fields(shape, rng):
    """(h, u, v) with h around 100 m and O(1) velocities: rough fields exercise every term."""
    h = 100.0 + 5.0 * rng.standard_normal(shape)
    return [h, rng.standard_normal(shape), rng.standard_normal(shape)]


def regions(shape, reach):
    """Whole owned block, interior, four rim strips, a single cell, the largest legal block, empty."""
    n_rows, n_columns = shape
    w = reach
    return [
        (w, n_rows - w, w, n_columns - w),
        (w + 2, n_rows - w - 2, w + 2, n_columns - w - 2),
        (w, w + 2, w, n_columns - w),
        (n_rows - w - 2, n_rows - w, w, n_columns - w),
        (w + 2, n_rows - w - 2, w, w + 2),
        (w + 2, n_rows - w - 2, n_columns - w - 2, n_columns - w),
        (5, 6, 7, 8),
        (reach, n_rows - reach, reach, n_columns - reach),
        (4, 4, 3, 9),
    ]


@pytest.mark.parametrize("row_start, n_rows", [(0, 13), (3, 6), (7, 6)])
@pytest.mark.parametrize("halo_width", [2, 3])
def test_stage_matches_numpy_reference_bitwise(row_start, n_rows, halo_width):
    """Random fields, fp64: kernel and reference agree to the last bit in every region.

    Tiles at the south wall, in the middle and at the north wall (different Coriolis rows and wall
    masks); cells outside the region stay untouched.
    """
    rng = np.random.default_rng(1234 + row_start + halo_width)
    params = tile_parameters(PARAMETERS, row_start, n_rows, halo_width)
    shape = (n_rows + 2 * halo_width, 11 + 2 * halo_width)
    stage = random_fields(shape, rng)
    base = random_fields(shape, rng)
    for region in regions(shape, params.stencil_reach):
        for a, b in ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0)):
            sentinel = rng.standard_normal(shape)
            out_kernel = [sentinel.copy() for _ in range(3)]
            out_reference = [sentinel.copy() for _ in range(3)]
            swe_stage(out_kernel, base, stage, a, b, 37.5, params, region)
            reference_stage(out_reference, base, stage, a, b, 37.5, params, region)
            for kernel_field, reference_field in zip(out_kernel, out_reference):
                np.testing.assert_array_equal(kernel_field, reference_field)


def test_stage_without_dissipation_matches_reference():
    """The branch without viscosity and hyperviscosity (halo 1, reach 1) is exact too."""
    parameters = SWEParameters(nx=9, ny=8, viscosity=0.0, hyperviscosity=0.0)
    params = tile_parameters(parameters, 0, 8, 1)
    rng = np.random.default_rng(7)
    shape = (10, 11)
    stage, base = random_fields(shape, rng), random_fields(shape, rng)
    out_kernel = [np.zeros(shape) for _ in range(3)]
    out_reference = [np.zeros(shape) for _ in range(3)]
    swe_stage(out_kernel, base, stage, 0.75, 0.25, 60.0, params, owned_region(shape, 1))
    reference_stage(out_reference, base, stage, 0.75, 0.25, 60.0, params, owned_region(shape, 1))
    for kernel_field, reference_field in zip(out_kernel, out_reference):
        np.testing.assert_array_equal(kernel_field, reference_field)


def test_float32_stage_matches_reference_in_float32():
    """fp32 fields compute in fp32 throughout (constants are passed in the field dtype)."""
    rng = np.random.default_rng(8)
    w = 2
    params = tile_parameters(PARAMETERS, 0, 13, w, dtype=np.float32)
    shape = (13 + 2 * w, 19 + 2 * w)
    stage = [field.astype(np.float32) for field in random_fields(shape, rng)]
    out_kernel = [np.zeros(shape, np.float32) for _ in range(3)]
    out_reference = [np.zeros(shape, np.float32) for _ in range(3)]
    swe_stage(out_kernel, stage, stage, 0.75, 0.25, 30.0, params, owned_region(shape, w))
    reference_stage(out_reference, stage, stage, 0.75, 0.25, 30.0, params, owned_region(shape, w))
    for kernel_field, reference_field in zip(out_kernel, out_reference):
        assert kernel_field.dtype == np.float32
        np.testing.assert_array_equal(kernel_field, reference_field)


def test_interior_plus_rim_equals_whole_tile():
    """Updating interior and rim separately (as while halos are in flight) is bitwise one call."""
    rng = np.random.default_rng(3)
    w = 2
    params = tile_parameters(PARAMETERS, 0, 13, w)
    shape = (13 + 2 * w, 19 + 2 * w)
    stage, base = random_fields(shape, rng), random_fields(shape, rng)
    whole = [np.zeros(shape) for _ in range(3)]
    split = [np.zeros(shape) for _ in range(3)]
    swe_stage(whole, base, stage, 0.75, 0.25, 50.0, params, owned_region(shape, w))
    n_rows, n_columns = shape
    interior = (2 * w, n_rows - 2 * w, 2 * w, n_columns - 2 * w)
    rim = [
        (w, 2 * w, w, n_columns - w),
        (n_rows - 2 * w, n_rows - w, w, n_columns - w),
        (2 * w, n_rows - 2 * w, w, 2 * w),
        (2 * w, n_rows - 2 * w, n_columns - 2 * w, n_columns - w),
    ]
    for region in [interior, *rim]:
        swe_stage(split, base, stage, 0.75, 0.25, 50.0, params, region)
    for whole_field, split_field in zip(whole, split):
        np.testing.assert_array_equal(whole_field, split_field)


def test_wall_faces_keep_zero_v():
    """v on the wall faces stays exactly 0 whatever the neighbouring flow (mask of the tendency)."""
    rng = np.random.default_rng(5)
    w = 2
    params = tile_parameters(PARAMETERS, 0, 13, w)
    shape = (13 + 2 * w, 19 + 2 * w)
    stage = random_fields(shape, rng)
    stage[2][w, :] = 0.0
    out = [np.ones(shape) for _ in range(3)]
    swe_stage(out, stage, stage, 0.0, 1.0, 50.0, params, owned_region(shape, w))
    assert np.all(out[2][w, w:-w] == 0.0)
    assert np.all(out[2][w + 1, w:-w] != 0.0)


def test_out_may_alias_base_but_not_stage():
    rng = np.random.default_rng(9)
    w = 2
    params = tile_parameters(PARAMETERS, 0, 13, w)
    shape = (13 + 2 * w, 19 + 2 * w)
    stage, base = random_fields(shape, rng), random_fields(shape, rng)
    expected = [np.zeros(shape) for _ in range(3)]
    reference_stage(expected, base, stage, 1 / 3, 2 / 3, 20.0, params, owned_region(shape, w))
    in_place = [field.copy() for field in base]
    swe_stage(in_place, in_place, stage, 1 / 3, 2 / 3, 20.0, params, owned_region(shape, w))
    for field, expected_field in zip(in_place, expected):
        owned = (slice(w, -w), slice(w, -w))
        np.testing.assert_array_equal(field[owned], expected_field[owned])
    with pytest.raises(ValueError, match="must not share memory with stage"):
        swe_stage(stage, base, stage, 1 / 3, 2 / 3, 20.0, params, owned_region(shape, w))


def test_stage_rejects_bad_inputs():
    w = 2
    params = tile_parameters(PARAMETERS, 0, 13, w)
    shape = (13 + 2 * w, 19 + 2 * w)
    fields = [np.zeros(shape) for _ in range(3)]
    out = [np.zeros(shape) for _ in range(3)]
    with pytest.raises(ValueError, match="reaches outside"):
        swe_stage(out, fields, fields, 0.0, 1.0, 1.0, params, (1, 5, 2, 5))
    with pytest.raises(ValueError, match="dtype"):
        swe_stage([np.zeros(shape, np.float32)] * 3, fields, fields, 0.0, 1.0, 1.0, params, (2, 5, 2, 5))
    with pytest.raises(ValueError, match="one entry per padded row"):
        wrong_rows = tile_parameters(PARAMETERS, 0, 12, w)
        swe_stage(out, fields, fields, 0.0, 1.0, 1.0, wrong_rows, (2, 5, 2, 5))
    with pytest.raises(ValueError, match="C-contiguous"):
        strided = [np.zeros((shape[0], 2 * shape[1]))[:, ::2] for _ in range(3)]
        swe_stage(out, strided, fields, 0.0, 1.0, 1.0, params, (2, 5, 2, 5))
    with pytest.raises(ConfigurationError, match="too narrow"):
        tile_parameters(PARAMETERS, 0, 13, 1)


def test_threaded_path_matches_reference_and_serial_path():
    """A region above PARALLEL_MIN_CELLS runs the threaded loop: same bits as the reference and as
    the same cells updated in small (serial) pieces."""
    from apps.stencil.swe_scheme.stage_cpu import PARALLEL_MIN_CELLS

    rng = np.random.default_rng(17)
    w = 2
    parameters = SWEParameters(nx=136, ny=128, viscosity=40.0, hyperviscosity=2.0e9)
    params = tile_parameters(parameters, 0, 128, w)
    shape = (128 + 2 * w, 136 + 2 * w)
    assert 128 * 136 >= PARALLEL_MIN_CELLS
    stage, base = random_fields(shape, rng), random_fields(shape, rng)
    threaded = [np.zeros(shape) for _ in range(3)]
    reference = [np.zeros(shape) for _ in range(3)]
    pieces = [np.zeros(shape) for _ in range(3)]
    swe_stage(threaded, base, stage, 1 / 3, 2 / 3, 45.0, params, owned_region(shape, w))
    reference_stage(reference, base, stage, 1 / 3, 2 / 3, 45.0, params, owned_region(shape, w))
    for j0 in range(w, w + 128, 32):
        swe_stage(pieces, base, stage, 1 / 3, 2 / 3, 45.0, params, (j0, j0 + 32, w, w + 136))
    for threaded_field, reference_field, pieces_field in zip(threaded, reference, pieces):
        np.testing.assert_array_equal(threaded_field, reference_field)
        np.testing.assert_array_equal(threaded_field, pieces_field)

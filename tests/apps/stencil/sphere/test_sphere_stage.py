"""The fused stage kernel against the NumPy slicing reference (bitwise), region splitting, checks."""

import math

import numpy as np
import pytest
from sphere_reference import reference_stage

from apps.stencil.sphere import SphereParameters, make_filter_plan, make_initial_condition, sphere_stage, tile_parameters

PARAMETERS = SphereParameters(nx=24, ny=12, alpha=0.7, filter_latitude=math.radians(50.0))
TOPOGRAPHY = make_initial_condition("williamson5", SphereParameters(nx=24, ny=12)).topography


def random_fields(shape, rng):
    h = 5000.0 + 100.0 * rng.standard_normal(shape)
    return [h, 20.0 * rng.standard_normal(shape), 20.0 * rng.standard_normal(shape)]


def regions(shape):
    n_rows, n_columns = shape
    return [(1, n_rows - 1, 1, n_columns - 1), (2, n_rows - 2, 2, n_columns - 2), (1, 2, 1, n_columns - 1),
            (n_rows - 2, n_rows - 1, 1, n_columns - 1), (2, n_rows - 2, 1, 2), (3, 4, 5, 6), (3, 3, 1, 5)]  # fmt: skip


@pytest.mark.parametrize("row_start, n_rows", [(0, 4), (4, 3), (8, 4), (0, 12)])
def test_stage_matches_numpy_reference_bitwise(row_start, n_rows):
    """South-pole, middle and north-pole tiles (pole metrics, filtered rows, tilted Coriolis, mountain)."""
    rng = np.random.default_rng(100 + row_start)
    n_columns = 9
    params = tile_parameters(PARAMETERS, row_start, n_rows, 5, n_columns, 1, TOPOGRAPHY)
    plan = make_filter_plan(PARAMETERS, row_start, n_rows, 5, n_columns)
    shape = (n_rows + 2, n_columns + 2)
    stage, base = random_fields(shape, rng), random_fields(shape, rng)
    for region in regions(shape):
        for a, b in ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0)):
            sentinel = rng.standard_normal(shape)
            out_kernel, out_reference = [sentinel.copy() for _ in range(3)], [sentinel.copy() for _ in range(3)]
            inc_kernel, inc_reference = [sentinel.copy() for _ in range(3)], [sentinel.copy() for _ in range(3)]
            sphere_stage(out_kernel, base, stage, inc_kernel, a, b, 300.0, params, plan.filtered_rows, region)
            reference_stage(out_reference, base, stage, inc_reference, a, b, 300.0, params, plan.filtered_rows, region)
            for kernel_field, reference_field in zip(out_kernel + inc_kernel, out_reference + inc_reference):
                np.testing.assert_array_equal(kernel_field, reference_field)


def test_pole_faces_stay_closed_and_ghosts_beyond_the_pole_do_not_matter():
    """v on the pole faces never changes and garbage in the mirror ghost rows changes nothing."""
    rng = np.random.default_rng(3)
    p = SphereParameters(nx=16, ny=8, filter_latitude=math.pi / 2)
    params = tile_parameters(p, 0, 8, 0, 16)
    plan = make_filter_plan(p, 0, 8, 0, 16)
    shape = (10, 18)
    stage = random_fields(shape, rng)
    stage[2][1, :] = 0.0
    stage[2][9, :] = 0.0
    region = (1, 9, 1, 17)
    out = [np.zeros(shape) for _ in range(3)]
    inc = [np.zeros(shape) for _ in range(3)]
    sphere_stage(out, stage, stage, inc, 0.0, 1.0, 600.0, params, plan.filtered_rows, region)
    assert np.all(out[2][1, 1:17] == 0.0)
    poked = [f.copy() for f in stage]
    for f in poked:
        f[0, :] = rng.uniform(1.0, 9.0, shape[1]) * (1000.0 if f is poked[0] else 1.0)
        f[9, :] = f[9, :] if f is poked[2] else rng.uniform(1.0, 9.0, shape[1]) * (1000.0 if f is poked[0] else 1.0)
    out_poked = [np.zeros(shape) for _ in range(3)]
    sphere_stage(out_poked, poked, poked, inc, 0.0, 1.0, 600.0, params, plan.filtered_rows, region)
    for a, b in zip(out, out_poked):
        np.testing.assert_array_equal(a[region[0]:region[1], 1:17], b[region[0]:region[1], 1:17])


def test_stage_rejects_aliasing_and_bad_regions():
    p = SphereParameters(nx=8, ny=4)
    params = tile_parameters(p, 0, 4, 0, 8)
    plan = make_filter_plan(p, 0, 4, 0, 8)
    fields = [np.ones((6, 10)) for _ in range(3)]
    inc = [np.zeros((6, 10)) for _ in range(3)]
    with pytest.raises(ValueError, match="share memory"):
        sphere_stage(fields, fields, fields, inc, 0.0, 1.0, 1.0, params, plan.filtered_rows, (1, 5, 1, 9))
    with pytest.raises(ValueError, match="reaches outside"):
        sphere_stage([np.ones((6, 10)) for _ in range(3)], fields, fields, inc, 0.0, 1.0, 1.0, params,
                     plan.filtered_rows, (0, 5, 1, 9))  # fmt: skip

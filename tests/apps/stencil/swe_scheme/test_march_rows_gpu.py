"""The lat-lon grid's warp-marching GPU kernel against the one-thread-per-cell kernel and the CPU, bit for bit.

Run on the GPU machine::

    python -m pytest tests/apps/stencil/swe_scheme/test_march_rows_gpu.py -m gpu -q
"""

import math

import numpy as np
import pytest

from apps.stencil.sphere import SphereParameters, make_filter_plan, make_initial_condition, sphere_stage, tile_parameters

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nx, ny, tile", [
    (67, 36, (0, 36, 0, 67)),        # whole sphere, odd width: the last warp is partly outside
    (67, 36, (10, 13, 3, 31)),       # an inner tile
    (301, 157, (0, 157, 0, 301)),    # larger, odd: many warps and row blocks, both poles filtered
    (1441, 19, (0, 19, 0, 1441)),    # wide and short: fewer rows than one block marches
])
@pytest.mark.parametrize("alpha, mountain", [(0.7, True), (0.0, False), (0.0, True), (0.7, False)])
def test_march_kernel_is_bitwise_the_simple_kernel_and_the_cpu(cupy, dtype, nx, ny, tile, alpha, mountain):
    """Also with f constant along rows (rotation axis = polar axis) and a flat bottom, where the march
    reads one f per row and no topography."""
    from apps.stencil.swe_scheme import stage_gpu

    p = SphereParameters(nx=nx, ny=ny, alpha=alpha, filter_latitude=math.radians(50.0))
    topography = make_initial_condition("williamson5", p).topography if mountain else None
    row_start, n_rows, col_start, n_columns = tile
    rng = np.random.default_rng(nx + ny + row_start)
    shape = (n_rows + 2, n_columns + 2)
    cpu_tile = tile_parameters(p, row_start, n_rows, col_start, n_columns, 1, topography, dtype=dtype)
    gpu_tile = tile_parameters(p, row_start, n_rows, col_start, n_columns, 1, topography, xp=cupy, dtype=dtype)
    coriolis, bottom = (cupy.asnumpy(a) for a in (gpu_tile.metrics.coriolis, gpu_tile.metrics.topography))
    assert gpu_tile.metrics.coriolis_by_row == (alpha == 0.0) == bool(np.all(coriolis == coriolis[:, :1]))
    assert gpu_tile.metrics.flat == (not np.any(bottom))
    if tile == (0, ny, 0, nx):
        assert gpu_tile.metrics.flat == (not mountain)   # the whole sphere holds the mountain
    plan = make_filter_plan(p, row_start, n_rows, col_start, n_columns)
    stage = [(5000.0 + 100.0 * rng.standard_normal(shape)).astype(dtype)] + [
        (20.0 * rng.standard_normal(shape)).astype(dtype) for _ in range(2)]
    base = [(f + rng.standard_normal(shape)).astype(dtype) for f in stage]
    regions = [(1, n_rows + 1, 1, n_columns + 1), (2, n_rows, 3, n_columns - 1), (1, 2, 1, n_columns + 1),
               (1, n_rows + 1, 1, 2), (n_rows, n_rows + 1, 1, n_columns + 1)]
    assert stage_gpu.ROW_METRICS_KERNEL["name"] == "march"
    for region in regions:
        sentinel = rng.standard_normal(shape).astype(dtype)
        out_cpu, inc_cpu = [sentinel.copy() for _ in range(3)], [sentinel.copy() for _ in range(3)]
        sphere_stage(out_cpu, base, stage, inc_cpu, 0.75, 0.25, 300.0, cpu_tile, plan.filtered_rows, region)
        results = {}
        for kernel in ("march", "simple"):
            stage_gpu.ROW_METRICS_KERNEL["name"] = kernel
            try:
                out, inc = [cupy.asarray(sentinel) for _ in range(3)], [cupy.asarray(sentinel) for _ in range(3)]
                sphere_stage(out, [cupy.asarray(f) for f in base], [cupy.asarray(f) for f in stage], inc,
                             0.75, 0.25, 300.0, gpu_tile, plan.filtered_rows_like(out[0]), region)
                results[kernel] = [cupy.asnumpy(f) for f in out + inc]
            finally:
                stage_gpu.ROW_METRICS_KERNEL["name"] = "march"
        for name, march, simple, cpu in zip(["h", "u", "v", "inc h", "inc u", "inc v"], results["march"],
                                            results["simple"], out_cpu + inc_cpu):
            np.testing.assert_array_equal(march, cpu, err_msg=f"march {name} region {region}")
            np.testing.assert_array_equal(simple, cpu, err_msg=f"simple {name} region {region}")

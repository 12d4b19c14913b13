"""heat3d step on the GPU: bitwise equal to the CPU kernel for every launch shape and region split."""

import numpy as np
import pytest

from apps.stencil.heat3d import heat3d_step

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape, region",
    [((8, 9, 11), (1, 7, 1, 8, 1, 10)), ((20, 35, 70), (1, 19, 1, 34, 1, 69)), ((20, 35, 70), (3, 17, 2, 30, 5, 41))],
)
@pytest.mark.parametrize("launch", [(None, None, None), (32, 1, 1), (64, 4, 3), (16, 16, 64)])
def test_matches_cpu_bitwise(dtype, shape, region, launch):
    rng = np.random.default_rng(sum(shape))
    inp = rng.standard_normal(shape).astype(dtype)
    out = rng.standard_normal(shape).astype(dtype)
    expected = out.copy()
    heat3d_step(expected, inp, region, 0.15)
    out_gpu = cupy.asarray(out)
    threads_x, threads_y, planes = launch
    heat3d_step(out_gpu, cupy.asarray(inp), region, 0.15, threads_x=threads_x, threads_y=threads_y,
                planes_per_thread=planes)
    np.testing.assert_array_equal(cupy.asnumpy(out_gpu), expected)


def test_split_regions_on_gpu_match_the_whole_region():
    rng = np.random.default_rng(3)
    inp = cupy.asarray(rng.standard_normal((12, 10, 14)))
    whole, pieces = cupy.zeros_like(inp), cupy.zeros_like(inp)
    heat3d_step(whole, inp, (1, 11, 1, 9, 1, 13), 1.0 / 6.0)
    for sub_region in [(1, 4, 1, 9, 1, 13), (4, 11, 1, 5, 1, 13), (4, 11, 5, 9, 1, 7), (4, 11, 5, 9, 7, 13)]:
        heat3d_step(pieces, inp, sub_region, 1.0 / 6.0)
    np.testing.assert_array_equal(cupy.asnumpy(pieces), cupy.asnumpy(whole))

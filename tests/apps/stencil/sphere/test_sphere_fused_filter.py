"""The fused polar filter kernel (apps/stencil/sphere/polar_fft_gpu.py).

CPU tests: the kernel's tables (radices, twiddles, the blocks' circles). GPU tests (``gpu`` marker)::

    python -m pytest tests/apps/stencil/sphere/test_sphere_fused_filter.py -m gpu -q

check it against the NumPy filter (the CPU path) and the cuFFT path at odd, small and production
circle lengths, in fp64 and fp32: filtered circles to float64 rounding of the increment (the
transforms differ from NumPy's pocketfft and from cuFFT, so not bitwise), unfiltered circles and
untouched rows bitwise; and that repeated calls give the same bits.
"""

import math

import numpy as np
import pytest

from apps.stencil.sphere import SphereParameters, local_gather, make_filter_plan
from apps.stencil.sphere.polar_fft_gpu import circle_pairs, fused_filter_supports, radices, twiddles

# ---------------------------------------------------------------------------------------------- CPU


def test_radices_factor_the_circle_in_the_kernels_order():
    assert radices(1440) == (4, 4, 2, 3, 3, 5)
    assert radices(48) == (4, 4, 3)
    assert radices(1) == ()
    for n in (7, 97, 98, 2 * 11):
        assert radices(n) is None and not fused_filter_supports(n)
    assert fused_filter_supports(7200) and not fused_filter_supports(2 * 7200)
    for n in (2, 45, 64, 1440, 3600):
        assert math.prod(radices(n)) == n and fused_filter_supports(n)


def _root_of_unity(j, n):
    """exp(-2 pi i j / n) to about an ulp, independently of the module: the angle reduced exactly
    (integers) to at most an eighth of a turn, where the double argument's own rounding is small."""
    octant, rest = divmod(8 * j, n)              # 2 pi j / n = (octant + rest / n) * pi / 4
    if octant % 2:                               # reflect into [0, pi/4]: measure from the next octant
        angle = (n - rest) / n * math.pi / 4
        c, s = math.sin(angle), math.cos(angle)
    else:
        angle = rest / n * math.pi / 4
        c, s = math.cos(angle), math.sin(angle)
    for _ in range(octant // 2):                 # rotate by quarter turns: (c, s) -> (-s, c)
        c, s = -s, c
    return complex(c, -s)


@pytest.mark.parametrize("n", [1, 2, 6, 45, 1440, 2880])
def test_twiddles_are_the_roots_of_unity_to_rounding_and_exact_at_quarter_turns(n):
    w = twiddles(n)
    assert np.max(np.abs(w - [_root_of_unity(j, n) for j in range(n)])) <= 2.3e-16
    assert np.max(np.abs(np.abs(w) - 1)) <= 2.3e-16
    for j in range(n):
        if (4 * j) % n == 0:
            assert w[j] == {0: 1, 1: -1j, 2: -1, 3: 1j}[4 * j // n]


@pytest.mark.parametrize("nx, ny, latitude", [(48, 24, 45.0), (1440, 720, 60.0), (45, 22, 30.0)])
def test_every_circle_is_in_one_block_with_a_circle_of_its_field(nx, ny, latitude):
    p = SphereParameters(nx=nx, ny=ny, filter_latitude=math.radians(latitude))
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    n_rows = len(plan.rows)
    use_filtered = np.array([[s is not None for s in row] for row in plan.factors], dtype=np.int8).T.reshape(-1)
    assert np.array_equal(plan.use_filtered(), use_filtered)
    pairs = circle_pairs(plan)
    circles = pairs[pairs >= 0]
    assert sorted(circles.tolist()) == list(range(3 * n_rows))
    for first, second in pairs:
        if second >= 0:
            assert first // n_rows == second // n_rows and use_filtered[first] and use_filtered[second]
        if not use_filtered[first]:
            assert second == -1


# ---------------------------------------------------------------------------------------------- GPU


def _fields(rng, shape, dtype, scale=1.0):
    return [(scale * rng.standard_normal(shape)).astype(dtype) for _ in range(3)]


def _filter(cupy, method, out, base, stage, increment, plan, monkeypatch):
    from apps.stencil.sphere import polar_filter_gpu
    from apps.stencil.sphere.polar_filter import filter_and_combine

    monkeypatch.setitem(polar_filter_gpu.DEVICE_FILTER, "method", method)
    device = [[cupy.asarray(x) for x in fields] for fields in (out, base, stage, increment)]
    filter_and_combine(*device[:3], device[3], 0.75, 0.25, plan, local_gather)
    return [cupy.asnumpy(x) for x in device[0]]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("nx, ny, latitude", [(48, 24, 45.0), (45, 22, 45.0), (4, 8, 30.0), (360, 180, 60.0),
                                              (1440, 720, 60.0), (3600, 64, 20.0)])
def test_fused_filter_matches_the_cpu_and_cufft(cupy, monkeypatch, dtype, nx, ny, latitude):
    """Filtered circles within a few float64 roundings of the increment (fp32: of the field) of the
    NumPy filter and of the cuFFT path; unfiltered circles and rows bitwise the CPU's."""
    p = SphereParameters(nx=nx, ny=ny, filter_latitude=math.radians(latitude))
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    assert fused_filter_supports(nx)
    rng = np.random.default_rng(nx + ny)
    shape = (p.ny + 2, p.nx + 2)
    increment = _fields(rng, shape, dtype, scale=1e-3)
    scale = max(float(np.max(np.abs(x))) for x in increment)
    from apps.stencil.sphere.polar_filter import filter_and_combine

    for zero_base in (True, False):
        # base = stage = 0: out = 0.25 * value exactly, so the filtered values themselves are compared
        # (fp64: to 1e-14 of the increments, ~50 roundings; a wrong mode would be 1e-3 off). Then with
        # fields ~1: out rounds to 1.1e-16 of |out| whatever the filter, 2 roundings allowed.
        # fp32: the CPU and cuFFT transform fp32 circles in fp32: 1e-6 of the values, 8 roundings.
        base, stage = (_fields(rng, shape, dtype, scale=0.0 if zero_base else 1.0) for _ in range(2))
        out = [np.full(shape, 7.0, dtype=dtype) for _ in range(3)]
        cpu = [x.copy() for x in out]
        filter_and_combine(cpu, base, stage, increment, 0.75, 0.25, plan, local_gather)
        fused = _filter(cupy, "fused", out, base, stage, increment, plan, monkeypatch)
        again = _filter(cupy, "fused", out, base, stage, increment, plan, monkeypatch)
        cufft = _filter(cupy, "cufft", out, base, stage, increment, plan, monkeypatch)
        size = 0.25 * scale if zero_base else max(float(np.max(np.abs(x))) for x in cpu)
        roundings = (1e-14 if zero_base else 4.5e-16) if dtype == np.float64 else 1e-6
        for field in range(3):
            np.testing.assert_array_equal(fused[field], again[field])
            for name, reference in (("cpu", cpu), ("cufft", cufft)):
                error = np.max(np.abs(fused[field].astype(np.float64) - reference[field]))
                assert error <= roundings * size, (name, field, zero_base, error / size)
            for r, row in enumerate(plan.rows):
                if plan.factors[r][field] is None:      # not filtered on this row: the raw increment, as the CPU
                    np.testing.assert_array_equal(fused[field][row], cpu[field][row])
            untouched = plan.filtered_rows == 0
            assert np.all(fused[field][untouched] == 7.0)
            assert np.all(fused[field][:, 0] == 7.0) and np.all(fused[field][:, -1] == 7.0)   # ghost columns


@pytest.mark.gpu
def test_fused_filter_removes_the_damped_modes(cupy, monkeypatch):
    """A pure zonal mode k on a polar circle comes out multiplied by S_k (1e-14), every k at once."""
    from apps.stencil.sphere.polar_circles import damping_factors

    p = SphereParameters(nx=1440, ny=720, filter_latitude=math.radians(60.0))
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    r = 3                                   # the fourth polar row: h is filtered there
    row = plan.rows[r]
    latitude = float(p.center_latitudes(np.array([row - 1]))[0])
    factors = damping_factors(latitude, p.nx, p.filter_latitude)
    shape = (p.ny + 2, p.nx + 2)
    zeros = [np.zeros(shape) for _ in range(3)]
    columns = np.arange(p.nx)
    for k in (1, 7, 100, 719, 720):
        mode = np.cos(2 * np.pi * ((k * columns) % p.nx) / p.nx)   # the phase reduced exactly: a pure mode
        increment = [np.zeros(shape) for _ in range(3)]
        increment[0][row, 1:-1] = mode
        out = _filter(cupy, "fused", [np.zeros(shape) for _ in range(3)], zeros, zeros, increment, plan, monkeypatch)
        np.testing.assert_allclose(out[0][row, 1:-1], 0.25 * factors[k] * mode, rtol=0, atol=1e-14)

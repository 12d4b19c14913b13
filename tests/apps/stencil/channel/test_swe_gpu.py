"""CPU vs GPU parity of the stage kernel and of a short run (needs CuPy and a CUDA GPU).

Run on the GPU machine with ``python -m pytest tests/apps/stencil/channel -m gpu -q``.
"""

import numpy as np
import pytest
from swe_reference import single_tile_fill_fn

from apps.stencil.channel import (
    SWEParameters,
    fill_channel_boundaries,
    fill_initial_state,
    local_diagnostics,
    ssp_rk3_step,
    stable_dt,
    swe_stage,
    tile_parameters,
)
from apps.stencil.channel.initial_conditions import jet

pytestmark = pytest.mark.gpu

PARAMETERS = SWEParameters(nx=70, ny=45, dx=20.0e3, dy=20.0e3, viscosity=50.0, hyperviscosity=2.0e10)


def random_state(rng, shape, dtype):
    """(h, u, v) of ``shape``: h about 100 m with 5 m noise, u and v standard normal."""
    return [(100.0 + 5 * rng.standard_normal(shape)).astype(dtype)] + [
        rng.standard_normal(shape).astype(dtype) for _ in range(2)
    ]


def stage_scalars(constants, dtype, a, b, dt=40.0):
    """The scalar arguments of the stage kernels for weights (a, b) and ``dt``, in ``dtype``."""
    return (dtype(a), dtype(b), dtype(dt)) + tuple(
        constants[name] for name in ("gravity", "rdx", "rdy", "rdx2", "rdy2", "viscosity",
                                     "hyperviscosity", "half", "quarter", "two"))  # fmt: skip


@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_stage_gpu_matches_cpu(cupy, dtype, tolerance):
    rng = np.random.default_rng(21)
    w = 2
    shape = (PARAMETERS.ny + 2 * w, PARAMETERS.nx + 2 * w)
    stage = random_state(rng, shape, dtype)
    base = [field + rng.standard_normal(shape).astype(dtype) for field in stage]
    cpu_params = tile_parameters(PARAMETERS, 0, PARAMETERS.ny, w, dtype=dtype)
    gpu_params = tile_parameters(PARAMETERS, 0, PARAMETERS.ny, w, xp=cupy, dtype=dtype)
    regions = [(w, shape[0] - w, w, shape[1] - w), (w + 3, w + 5, w + 1, shape[1] - w - 7)]
    for region in regions:
        out_cpu = [np.zeros(shape, dtype) for _ in range(3)]
        out_gpu = [cupy.zeros(shape, dtype) for _ in range(3)]
        swe_stage(out_cpu, base, stage, 0.75, 0.25, 40.0, cpu_params, region)
        swe_stage(
            out_gpu, [cupy.asarray(f) for f in base], [cupy.asarray(f) for f in stage],
            0.75, 0.25, 40.0, gpu_params, region,
        )  # fmt: skip
        for cpu_field, gpu_field in zip(out_cpu, out_gpu):
            np.testing.assert_allclose(cupy.asnumpy(gpu_field), cpu_field, rtol=tolerance, atol=tolerance * 100)


def test_jet_run_gpu_matches_cpu(cupy):
    """50 SSP-RK3 steps of the jet: fp64 states agree to 1e-12 relative, diagnostics too."""
    w = PARAMETERS.halo_width
    shape = (PARAMETERS.ny + 2 * w, PARAMETERS.nx + 2 * w)
    region = (w, w + PARAMETERS.ny, w, w + PARAMETERS.nx)
    host = [np.zeros(shape) for _ in range(3)]
    fill_initial_state(jet(PARAMETERS, half_width=60.0e3), *host, PARAMETERS, (0, 0), w)
    fill = single_tile_fill_fn(PARAMETERS, w)
    fill(host)
    cpu_params = tile_parameters(PARAMETERS, 0, PARAMETERS.ny, w)
    gpu_params = tile_parameters(PARAMETERS, 0, PARAMETERS.ny, w, xp=cupy)
    dt = stable_dt(*host, cpu_params)
    device = [cupy.asarray(field) for field in host]

    def gpu_fill(fields):
        for field in fields:
            field[:, :w] = field[:, -2 * w : -w]
            field[:, -w:] = field[:, w : 2 * w]
        fill_channel_boundaries(*fields, w, at_south=True, at_north=True)

    runs = (
        (host, cpu_params, fill, np.zeros),
        (device, gpu_params, gpu_fill, cupy.zeros),
    )
    for state, params, fill_fn, zeros in runs:
        work_1 = [zeros(shape) for _ in range(3)]
        work_2 = [zeros(shape) for _ in range(3)]
        for _ in range(50):
            ssp_rk3_step(state, work_1, work_2, dt, params, region, fill_fn)
        fill_fn(state)
    for cpu_field, gpu_field in zip(host, device):
        scale = np.abs(cpu_field).max()
        np.testing.assert_allclose(cupy.asnumpy(gpu_field), cpu_field, rtol=0, atol=1e-12 * scale)
    cpu_diagnostics = local_diagnostics(*host, cpu_params)
    gpu_diagnostics = local_diagnostics(*device, gpu_params)
    for name, value in cpu_diagnostics.items():
        assert gpu_diagnostics[name] == pytest.approx(value, rel=1e-12), name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("viscosity, hyperviscosity", [(0.0, 1.0e9), (50.0, 2.0e10), (30.0, 0.0), (0.0, 0.0)])
def test_every_stage_kernel_equals_the_cpu_bitwise(cupy, dtype, viscosity, hyperviscosity):
    """Every kernel choice (march lengths, tiles, simple) gives the CPU's bits into NaN-poisoned
    outputs: whole odd-sized tiles with partial tiles at the edges, an inner region, thin strips
    (the tiled kernel's fallback), and untouched cells outside the region."""
    from apps.stencil.channel import kernel_constants, stage_gpu
    from apps.stencil.channel.stage_cpu import stage_cpu

    parameters = SWEParameters(nx=203, ny=117, dx=20.0e3, dy=20.0e3, viscosity=viscosity,
                               hyperviscosity=hyperviscosity)  # fmt: skip
    w = parameters.halo_width
    shape = (parameters.ny + 2 * w, parameters.nx + 2 * w)
    rng = np.random.default_rng(8)
    stage = random_state(rng, shape, dtype)
    base = [field + rng.standard_normal(shape).astype(dtype) for field in stage]
    cpu_params = tile_parameters(parameters, 0, parameters.ny, w, dtype=dtype)
    gpu_params = tile_parameters(parameters, 0, parameters.ny, w, xp=cupy, dtype=dtype)
    constants = kernel_constants(cpu_params)
    tiles = stage_gpu.kernel_choices(dtype)
    regions = [(w, shape[0] - w, w, shape[1] - w), (w + 3, w + 40, w + 5, w + 150),
               (w, w + 2, w, shape[1] - w), (w, shape[0] - w, shape[1] - w - 2, shape[1] - w)]  # fmt: skip
    for region in regions:
        for a, b in ((0.0, 1.0), (0.75, 0.25)):
            scalars = stage_scalars(constants, dtype, a, b)
            expected = [np.full(shape, np.nan, dtype) for _ in range(3)]
            stage_cpu(*expected, *base, *stage, cpu_params.coriolis_rows, cpu_params.v_face_mask, *scalars, *region)
            for tile in tiles:
                out = [cupy.full(shape, np.nan, dtype) for _ in range(3)]
                stage_gpu.stage_gpu(out, [cupy.asarray(f) for f in base], [cupy.asarray(f) for f in stage],
                                    gpu_params.coriolis_rows, gpu_params.v_face_mask, scalars, region, tile=tile)
                for got, want in zip(out, expected):
                    np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=f"tile {tile}, region {region}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("viscosity, hyperviscosity", [(50.0, 2.0e10), (0.0, 0.0)])
def test_first_stage_variant_equals_the_cpu_bitwise(cupy, dtype, viscosity, hyperviscosity, monkeypatch):
    """The first SSP-RK3 stage passes the state as both base and stage; the one-column march then takes
    the base values from the stage values it holds (no second load). Every march shape gives the CPU's
    bits into NaN-poisoned outputs, with even and odd row lengths (aligned and unaligned pairs), and
    an array equal to the stage but not the same memory still runs the two-input kernel, also exactly."""
    from apps.stencil.swe_scheme import stage_gpu as launcher
    from apps.stencil.channel import kernel_constants
    from apps.stencil.channel.stage_cpu import stage_cpu

    launched = []
    kernel = launcher.uniform_kernel
    monkeypatch.setattr(launcher, "uniform_kernel", lambda name: launched.append(name) or kernel(name))
    march_tiles = [tile for tile in launcher.kernel_choices(dtype) if tile[0] in ("march", "pairs")]
    for nx in (204, 203):
        parameters = SWEParameters(nx=nx, ny=117, dx=20.0e3, dy=20.0e3, viscosity=viscosity,
                                   hyperviscosity=hyperviscosity)  # fmt: skip
        w = parameters.halo_width
        shape = (parameters.ny + 2 * w, parameters.nx + 2 * w)
        state = random_state(np.random.default_rng(10), shape, dtype)
        cpu_params = tile_parameters(parameters, 0, parameters.ny, w, dtype=dtype)
        gpu_params = tile_parameters(parameters, 0, parameters.ny, w, xp=cupy, dtype=dtype)
        constants = kernel_constants(cpu_params)
        gpu_state = [cupy.asarray(f) for f in state]
        copies = [f.copy() for f in gpu_state]
        for region in [(w, shape[0] - w, w, shape[1] - w), (w + 3, w + 40, w + 4, w + 150)]:
            for a, b in ((0.0, 1.0), (0.75, 0.25)):
                scalars = stage_scalars(constants, dtype, a, b)
                expected = [np.full(shape, np.nan, dtype) for _ in range(3)]
                stage_cpu(*expected, *state, *state, cpu_params.coriolis_rows, cpu_params.v_face_mask, *scalars,
                          *region)
                for tile in [None, *march_tiles]:
                    for base in (gpu_state, copies):
                        launched.clear()
                        out = [cupy.full(shape, np.nan, dtype) for _ in range(3)]
                        launcher.uniform_stage_gpu(out, base, gpu_state, gpu_params.coriolis_rows,
                                                   gpu_params.v_face_mask, scalars, region, tile=tile)
                        shared = base is gpu_state
                        assert launched, "no kernel launched"
                        if launched[0].startswith("swe_stage_march<"):   # the pairs kernel has no variant
                            assert launched[0].endswith("true>" if shared else "false>"), launched
                        for got, want in zip(out, expected):
                            np.testing.assert_array_equal(cupy.asnumpy(got), want,
                                                          err_msg=f"tile {tile}, shared {shared}, region {region}")

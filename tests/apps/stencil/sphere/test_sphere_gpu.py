"""The latlon model on GPUs (CuPy kernels, cuFFT polar filter) against the CPU (needs CuPy and a GPU).

Run on the GPU machine (1 and 2 GPUs)::

    python -m pytest tests/apps/stencil/sphere/test_sphere_gpu.py -m gpu -q
"""

import contextlib
import math
import types

import numpy as np
import pytest
from sphere_reference import global_state, run_tiled

from apps.stencil.sphere import (
    SphereParameters,
    filter_and_combine,
    local_diagnostics,
    local_gather,
    make_filter_plan,
    make_initial_condition,
    sphere_stage,
    ssp_rk3_step,
    stability_rate,
    tile_parameters,
)
from apps.stencil.channel.boundaries import fill_channel_boundaries

pytestmark = pytest.mark.gpu

RELATIVE = 1e-12


def _relative_error(gpu, cpu):
    gpu = gpu.get() if hasattr(gpu, "get") else gpu
    scale = float(np.max(np.abs(cpu))) or 1.0
    return float(np.max(np.abs(gpu - cpu))) / scale


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row_start, n_rows", [(0, 5), (5, 6), (11, 5), (0, 16)])
def test_stage_gpu_matches_cpu(cupy, dtype, row_start, n_rows):
    """South-pole, middle, north-pole and whole-sphere tiles, tilted Coriolis, mountain, filtered rows:
    the GPU stage gives the CPU's bits (fp64 and fp32)."""
    p = SphereParameters(nx=32, ny=16, alpha=0.7, filter_latitude=math.radians(50.0))
    topography = make_initial_condition("williamson5", p).topography
    rng = np.random.default_rng(7 + row_start)
    n_columns = 13
    shape = (n_rows + 2, n_columns + 2)
    cpu_tile = tile_parameters(p, row_start, n_rows, 3, n_columns, 1, topography, dtype=dtype)
    gpu_tile = tile_parameters(p, row_start, n_rows, 3, n_columns, 1, topography, xp=cupy, dtype=dtype)
    plan = make_filter_plan(p, row_start, n_rows, 3, n_columns)
    stage = [(5000.0 + 100.0 * rng.standard_normal(shape)).astype(dtype)] + [
        (20.0 * rng.standard_normal(shape)).astype(dtype) for _ in range(2)]
    base = [(f + rng.standard_normal(shape)).astype(dtype) for f in stage]
    for region in [(1, n_rows + 1, 1, n_columns + 1), (2, n_rows, 3, n_columns - 1), (1, 2, 1, n_columns + 1)]:
        sentinel = rng.standard_normal(shape).astype(dtype)
        out_cpu, inc_cpu = [sentinel.copy() for _ in range(3)], [sentinel.copy() for _ in range(3)]
        out_gpu, inc_gpu = [cupy.asarray(sentinel) for _ in range(3)], [cupy.asarray(sentinel) for _ in range(3)]
        sphere_stage(out_cpu, base, stage, inc_cpu, 0.75, 0.25, 300.0, cpu_tile, plan.filtered_rows, region)
        sphere_stage(out_gpu, [cupy.asarray(f) for f in base], [cupy.asarray(f) for f in stage], inc_gpu,
                     0.75, 0.25, 300.0, gpu_tile, plan.filtered_rows_like(out_gpu[0]), region)
        for cpu_field, gpu_field in zip(out_cpu + inc_cpu, out_gpu + inc_gpu):
            # The core's device functions are the Numba kernel's expressions (--fmad=false): the same bits.
            np.testing.assert_array_equal(cupy.asnumpy(gpu_field), cpu_field, err_msg=f"region {region}")


@pytest.mark.parametrize("staged", [False, True])
def test_polar_filter_gpu_matches_cpu(cupy, staged):
    """Device cuFFT path (whole circles, local_gather) and host-staged path give the CPU's result."""
    p = SphereParameters(nx=48, ny=24, filter_latitude=math.radians(45.0))
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    rng = np.random.default_rng(3)
    shape = (p.ny + 2, p.nx + 2)
    base = [rng.standard_normal(shape) for _ in range(3)]
    stage = [rng.standard_normal(shape) for _ in range(3)]
    increment = [rng.standard_normal(shape) for _ in range(3)]
    out_cpu = [np.full(shape, 7.0) for _ in range(3)]
    out_gpu = [cupy.asarray(x) for x in out_cpu]
    filter_and_combine(out_cpu, base, stage, increment, 0.75, 0.25, plan, local_gather)
    gather = (lambda block: block) if staged else local_gather  # the staged path: any other gather
    filter_and_combine(out_gpu, [cupy.asarray(x) for x in base], [cupy.asarray(x) for x in stage],
                       [cupy.asarray(x) for x in increment], 0.75, 0.25, plan, gather)
    for cpu_field, gpu_field in zip(out_cpu, out_gpu):
        assert _relative_error(gpu_field, cpu_field) <= RELATIVE
        # Rows the filter does not own are untouched.
        unfiltered = plan.filtered_rows == 0
        assert np.all(cupy.asnumpy(gpu_field)[unfiltered] == 7.0)


def _single_tile_fill(p, xp):
    def fill(fields):
        for field in fields:
            field[:, 0] = field[:, p.nx]
            field[:, p.nx + 1] = field[:, 1]
        fill_channel_boundaries(*fields, 1, True, True)

    return fill


@pytest.mark.parametrize("init, alpha", [("williamson2", math.pi / 2 - 0.05), ("williamson2", 0.0), ("williamson6", 0.0)])
def test_williamson_run_gpu_matches_cpu_and_conserves_mass(cupy, init, alpha):
    """30 SSP-RK3 steps at 64 x 32 on one tile: GPU state within 1e-12 of the CPU, mass to 1e-12."""
    p = SphereParameters(nx=64, ny=32, alpha=alpha)
    state, initial = global_state(p, init)
    shape = (p.ny + 2, p.nx + 2)
    region = (1, p.ny + 1, 1, p.nx + 1)
    plan = make_filter_plan(p, 0, p.ny, 0, p.nx)
    results = {}
    for xp in (np, cupy):
        tile = tile_parameters(p, 0, p.ny, 0, p.nx, 1, initial.topography, xp=xp)
        fill = _single_tile_fill(p, xp)
        fields = [xp.zeros(shape) for _ in range(3)]
        for field, values in zip(fields, state):
            field[1:-1, 1:-1] = xp.asarray(values)
        fill(fields)
        dt = 0.8 / stability_rate(*fields, tile, p.filter_latitude)
        mass_start = local_diagnostics(*fields, tile)["mass"]
        work = [[xp.zeros(shape) for _ in range(3)] for _ in range(3)]
        for _ in range(30):
            ssp_rk3_step(fields, work[0], work[1], work[2], dt, tile, plan, region, fill, local_gather)
        fill(fields)
        results[xp.__name__] = (fields, local_diagnostics(*fields, tile), mass_start)
    cpu, gpu = results["numpy"], results["cupy"]
    for name, cpu_field, gpu_field in zip("huv", cpu[0], gpu[0]):
        assert type(gpu_field).__module__.startswith("cupy")
        assert _relative_error(gpu_field, cpu_field) <= RELATIVE, name
    assert abs(gpu[1]["mass"] - gpu[2]) <= RELATIVE * gpu[2]
    for name, value in cpu[1].items():
        assert gpu[1][name] == pytest.approx(value, rel=RELATIVE), name


class _Timers:
    def phase(self, name):
        return contextlib.nullcontext()


@pytest.mark.mpi(ranks=[1, 2], timeout=300)
@pytest.mark.parametrize("dims", [(0, 1), (1, 0)])
def test_model_on_gpus_matches_the_cpu_and_the_serial_run(comm, dims):
    """LatLonModel on 1 and 2 GPUs (latitude bands: device filter; longitude split: host-staged
    filter) equals the CPU model and the single-tile reference to 1e-12; mass to 1e-12."""
    cupy = pytest.importorskip("cupy")
    import hpcgpu
    from apps.stencil.sphere.model import LatLonModel

    n_gpus = cupy.cuda.runtime.getDeviceCount()
    if comm.size > n_gpus:
        pytest.skip(f"one GPU per rank needed (NCCL): {comm.size} ranks, {n_gpus} GPU(s)")
    dims = tuple(comm.size if d == 0 else 1 for d in dims)
    options = types.SimpleNamespace(nx=48, ny=24, init="williamson6", alpha=0.0, days=None, dt=600.0, cfl=None,
                                    dims=dims, precision="fp64", filter_latitude=60.0)  # fmt: skip
    gathered = {}
    for backend in ("numpy", "cupy"):
        arch = hpcgpu.arch.auto(comm, backend=backend)
        model = LatLonModel(comm, arch, options)
        assert model.arch.is_gpu == (backend == "cupy")
        for _ in range(6):
            model.step(_Timers())
        diagnostics = model.diagnostics()
        assert abs(diagnostics["mass_relative_change"]) <= RELATIVE
        gathered[backend] = [f.gather() for f in model.fields]
    if comm.rank == 0:
        state, initial = global_state(model.parameters, "williamson6")
        expected = run_tiled(state, model.parameters, [0, 24], [0, 48], 600.0, 6)
        for name, cpu, gpu, reference in zip("huv", gathered["numpy"], gathered["cupy"], expected):
            np.testing.assert_array_equal(cpu, reference)
            assert _relative_error(gpu, reference) <= RELATIVE, name

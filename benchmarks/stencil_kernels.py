"""Benchmark of the stencil kernels (Jacobi 5-point, heat3d 7-point, shallow-water stage) on one device.

On a GPU it first checks every Jacobi variant (and the heat3d kernel) against the CPU kernel on a
small random case, bitwise, then times each variant with CUDA events: warm-up, then the median over
repeats of a batch of sweeps that ping-pong between two buffers, with and without the residual, for a
few launch shapes (the best one goes in the table, all of them in the JSON). Arrays are the padded
local arrays of a single rank, ``(n + 2) x (n + 2)``, in two layouts: ``contiguous`` (row pitch
``n + 2``, what ``Field.data`` is) and ``aligned`` (row pitch rounded up to 32 elements, which
``march_vec4`` needs). Without a GPU it times the Numba CPU kernel against ``numpy.copyto`` on the
same arrays instead.

Throughput: one lattice update (LUP) per computed cell; effective bandwidth counts 2 x itemsize bytes
per LUP (one read, one write: the ideal for a stencil whose neighbours come from cache).

Shallow water (``--swe-size``, default 8192x4096): one SSP-RK3 step of the channel's stage kernel
(three launches over the owned cells, the app's ``--no-overlap`` schedule without the exchange) for
every tile shape of :mod:`apps.stencil.channel.stage_gpu`, after a bitwise check of each against the
Numba kernel. One update = one cell of one step; effective bandwidth counts the fewest bytes a step
must move, 24 x itemsize per update (stage 1 reads h, u, v and writes 3 fields; stages 2 and 3 also
read the 3 base fields). Every rate is printed with its fraction of the copy bandwidth measured in
the same run, and with the minimum and the median over the repeats.

Usage::

    python benchmarks/stencil_kernels.py --json jacobi.json            # 16384^2, fp32 and fp64
    python benchmarks/stencil_kernels.py --size 4096 --quick           # fewer launch shapes
    python benchmarks/stencil_kernels.py --backend cpu --size 8192     # CPU kernel vs numpy.copyto
    python benchmarks/stencil_kernels.py --variants none --swe-size 8192x4096 --swe-tiles all

A variant that fails (compile error, mismatch, launch error) is reported in the table with its error;
the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from apps.stencil.heat3d import heat3d_step  # noqa: E402
from apps.stencil.jacobi import GPU_VARIANTS, jacobi_sweep, n_lattice_updates  # noqa: E402

REFERENCE_COPY_TBS = 4.23  # H200 device-to-device copy, read + write bytes (shared/DEVICE.md)
TUNING = {  # variant: launch shapes (threads_x, threads_y, rows_per_thread) tried
    "simple": [(32, 8, 1), (64, 4, 1), (128, 2, 1), (256, 1, 1)],
    "march": [(128, 1, 8), (256, 1, 8), (128, 1, 4), (128, 1, 16), (256, 1, 16)],
    "march_vec2": [(128, 1, 8), (256, 1, 8), (64, 1, 8), (128, 1, 4), (128, 1, 16)],
    "march_vec4": [(64, 1, 8), (128, 1, 8), (32, 1, 8), (64, 1, 4), (64, 1, 16)],
}


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=16384, help="owned cells per axis n (default 16384)")
    parser.add_argument("--dtypes", default="float32,float64", help="comma-separated dtypes")
    parser.add_argument("--variants", default=",".join(GPU_VARIANTS), help="comma-separated GPU variants")
    parser.add_argument("--layouts", default="contiguous,aligned", help="contiguous and/or aligned")
    parser.add_argument("--backend", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--repeats", type=int, default=15, help="timed batches (median reported)")
    parser.add_argument("--batch", type=int, default=10, help="sweeps per timed batch (even)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    parser.add_argument("--quick", action="store_true", help="only the default launch shape per variant")
    parser.add_argument("--heat3d-size", type=int, default=512, help="heat3d cube edge (0: skip heat3d)")
    parser.add_argument("--heat3d-launches", default="default",
                        help="heat3d launch shapes tried, 'default', 'all' or TXxTYxPLANES,... (best in the table)")
    parser.add_argument("--swe-size", default="8192x4096", help="shallow-water NXxNY (0: skip)")
    parser.add_argument("--swe-tiles", default="default",
                        help="shallow-water kernels: 'default', 'all' or a list of 'simple', TXxTYxTHREADS, marchROWSxAHEAD, pairsROWSxAHEAD")
    parser.add_argument("--json", help="write all results as JSON to this path")
    arguments = parser.parse_args(argv)
    arguments.batch += arguments.batch % 2  # ping-pong ends in the starting buffers
    if arguments.variants == "none":
        arguments.variants = ""
    return arguments


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


# ------------------------------------------------------------------------------------------ checks
def check_jacobi_variant(variant, dtype):
    """Compare a GPU variant with the CPU kernel on a small random case; return None or the problem."""
    import cupy

    rng = np.random.default_rng(12)
    shape, region, fixed = (70, 300), (2, 67, 1, 299), (1, 298)
    inp = rng.standard_normal(shape).astype(dtype)
    out = rng.standard_normal(shape).astype(dtype)
    expected, expected_residual = out.copy(), np.zeros(1)
    jacobi_sweep(expected, inp, region, fixed, expected_residual)
    for launch in TUNING[variant][:2]:
        out_gpu, residual = cupy.asarray(out), cupy.zeros(1)
        jacobi_sweep(out_gpu, cupy.asarray(inp), region, fixed, residual, variant=variant,
                     threads_x=launch[0], threads_y=launch[1], rows_per_thread=launch[2])
        n_different = int(np.count_nonzero(cupy.asnumpy(out_gpu) != expected))
        if n_different:
            return f"MISMATCH: {n_different} cells differ from the CPU kernel (launch {launch})"
        relative = abs(float(residual[0]) - expected_residual[0]) / expected_residual[0]
        if relative > 1e-12:
            return f"MISMATCH: residual off by {relative:.1e} relative (launch {launch})"
    return None


def check_heat3d(dtype):
    """None, or what differs from the CPU kernel: a region of the array, and the whole owned block with
    ``periodic_ghosts`` (ghosts included)."""
    import cupy

    rng = np.random.default_rng(13)
    inp = rng.standard_normal((20, 35, 70)).astype(dtype)
    n_different = 0
    for region, periodic in (((1, 19, 2, 34, 1, 69), False), ((1, 19, 1, 34, 1, 69), True)):
        out = rng.standard_normal(inp.shape).astype(dtype)
        expected = out.copy()
        heat3d_step(expected, inp, region, 0.15, periodic_ghosts=periodic)
        out_gpu = cupy.asarray(out)
        heat3d_step(out_gpu, cupy.asarray(inp), region, 0.15, periodic_ghosts=periodic)
        n_different += int(np.count_nonzero(cupy.asnumpy(out_gpu) != expected))
    return f"MISMATCH: {n_different} cells differ from the CPU kernel" if n_different else None


# ------------------------------------------------------------------------------------------ timing
def allocate_pair(n, dtype, layout):
    """Two padded (n+2)^2 device arrays with the given layout, filled with random values."""
    import cupy

    width = n + 2
    pitch = width if layout == "contiguous" else -(-width // 32) * 32
    pair = []
    for seed in (1, 2):
        backing = cupy.random.default_rng(seed).random((width, pitch), dtype=np.float64).astype(dtype)
        pair.append(backing[:, :width])
    return pair


def time_gpu_batches(run_sweep, arrays, arguments):
    """Median and best time per sweep (ms) of batches of ping-pong sweeps, timed with CUDA events."""
    import cupy

    def batch():
        a, b = arrays
        for _ in range(arguments.batch):
            run_sweep(b, a)
            a, b = b, a

    for _ in range(arguments.warmup):
        batch()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(arguments.repeats):
        start.record()
        batch()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / arguments.batch)
    return statistics.median(times), min(times)


def measure_copy_tbs(arrays, arguments):
    """Device copy bandwidth (read + write bytes) on the same arrays, TB/s."""
    import cupy

    median_ms, _ = time_gpu_batches(lambda out, inp: cupy.copyto(out, inp), arrays, arguments)
    return 2 * arrays[0].nbytes / (median_ms * 1e-3) / 1e12


def row(kernel, variant, dtype, layout, residual, launch, n_updates, itemsize, median_ms, best_ms, status):
    result = dict(kernel=kernel, variant=variant, dtype=dtype, layout=layout, residual=residual,
                  launch=launch, status=status, ms_per_sweep=None, glups=None, tbs=None, percent_of_copy=None)
    if median_ms is not None:
        seconds = median_ms * 1e-3
        result.update(ms_per_sweep=median_ms, best_ms=best_ms, glups=n_updates / seconds / 1e9,
                      tbs=n_updates * 2 * itemsize / seconds / 1e12)
        result["percent_of_copy"] = 100.0 * result["tbs"] / REFERENCE_COPY_TBS
    return result


def benchmark_gpu(arguments):
    import cupy

    results, checks = [], {}
    n = arguments.size
    region, fixed = (1, n + 1, 1, n + 1), (1, n)
    n_updates = n_lattice_updates(region, fixed)
    copy_tbs = {}
    variants = [variant for variant in arguments.variants.split(",") if variant]
    for dtype in arguments.dtypes.split(","):
        itemsize = np.dtype(dtype).itemsize
        for variant in variants:
            try:
                problem = check_jacobi_variant(variant, dtype)
            except Exception as error:  # a failing variant must not stop the others
                problem = f"error: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
            checks[f"jacobi/{variant}/{dtype}"] = problem or "ok"
            print(f"check jacobi {variant:11s} {dtype}: {problem or 'bitwise equal to CPU'}", flush=True)
        for layout in arguments.layouts.split(",") if variants else []:
            arrays = allocate_pair(n, dtype, layout)
            copy_tbs[f"{dtype}/{layout}"] = measure_copy_tbs(arrays, arguments)
            residual_buffer = cupy.zeros(1)
            for variant in variants:
                launches = TUNING[variant][:1] if arguments.quick else TUNING[variant]
                for with_residual in (False, True):
                    residual = residual_buffer if with_residual else None
                    for launch in launches:
                        status = checks[f"jacobi/{variant}/{dtype}"]
                        try:
                            def run_sweep(out, inp, variant=variant, launch=launch, residual=residual):
                                jacobi_sweep(out, inp, region, fixed, residual, variant=variant,
                                             threads_x=launch[0], threads_y=launch[1], rows_per_thread=launch[2])

                            median_ms, best_ms = time_gpu_batches(run_sweep, arrays, arguments)
                        except Exception as error:
                            median_ms = best_ms = None
                            status = f"error: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
                        results.append(row("jacobi", variant, dtype, layout, with_residual, list(launch),
                                           n_updates, itemsize, median_ms, best_ms, status))
                        print(f"  {variant:11s} {dtype} {layout:10s} residual={with_residual!s:5s} "
                              f"launch={launch}: {results[-1]['glups'] or 0:7.1f} GLUPS  {status}", flush=True)
            del arrays
            cupy.get_default_memory_pool().free_all_blocks()
        if arguments.heat3d_size:
            results.extend(benchmark_heat3d_gpu(arguments, dtype, checks, copy_tbs))
        if arguments.swe_size != "0":
            results.extend(benchmark_swe_gpu(arguments, dtype, checks, copy_tbs))
    return results, checks, copy_tbs


HEAT3D_LAUNCHES = [(64, 8, 8), (32, 8, 16), (32, 4, 16), (64, 4, 16), (128, 2, 16), (32, 8, 32), (32, 16, 16),
                   (256, 1, 16), (128, 4, 8), (128, 8, 8), (64, 4, 8), (64, 8, 4)]


def benchmark_heat3d_gpu(arguments, dtype, checks, copy_tbs):
    import cupy

    from apps.stencil.heat3d.gpu import DEFAULT_LAUNCH

    try:
        problem = check_heat3d(dtype)
    except Exception as error:
        problem = f"error: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
    checks[f"heat3d/{dtype}"] = problem or "ok"
    n = arguments.heat3d_size
    region = (1, n + 1, 1, n + 1, 1, n + 1)
    if arguments.heat3d_launches == "default":
        launches = [DEFAULT_LAUNCH]
    elif arguments.heat3d_launches == "all":
        launches = [DEFAULT_LAUNCH] + [launch for launch in HEAT3D_LAUNCHES if launch != DEFAULT_LAUNCH]
    else:
        launches = [tuple(int(v) for v in text.split("x")) for text in arguments.heat3d_launches.split(",")]
    rows = []
    arrays = [cupy.random.default_rng(seed).random((n + 2,) * 3, dtype=np.float64).astype(dtype) * 1e-3
              for seed in (1, 2)]
    copy_tbs[f"{dtype}/heat3d"] = measure_copy_tbs(arrays, arguments)
    # march_z: the sweep alone (a rank's interior among others); march_z+periodic: the sweep that also
    # fills the face ghosts periodically, the whole step of a one-rank job (periodic_ghosts=True).
    for launch in launches:
        for variant, periodic in (("march_z", False), ("march_z+periodic", True)):
            try:
                def run_step(out, inp, launch=launch, periodic=periodic):
                    heat3d_step(out, inp, region, 0.1, threads_x=launch[0], threads_y=launch[1],
                                planes_per_thread=launch[2], periodic_ghosts=periodic)

                median_ms, best_ms = time_gpu_batches(run_step, arrays, arguments)
                status = problem or "ok"
            except Exception as error:
                median_ms = best_ms = None
                status = f"error: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
            rows.append(row("heat3d", variant, dtype, "contiguous", False, list(launch), n ** 3,
                            np.dtype(dtype).itemsize, median_ms, best_ms, status))
            print(f"  heat3d {variant} {dtype} launch={launch}: {rows[-1]['glups'] or 0:7.1f} GLUPS  {status}",
                  flush=True)
    del arrays
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


# ------------------------------------------------------------------------------------------ shallow water
SWE_VALUES_PER_UPDATE = 24
"""Fewest values one SSP-RK3 step moves per cell: 3 + 3 (stage 1), 6 + 3 (stages 2 and 3)."""


def _swe_case(nx, ny, dtype, xp, seed, viscosity=0.0, hyperviscosity=1.0e9):
    """Padded random (state, params, owned region) of a channel tile, on ``xp``."""
    from apps.stencil.channel import SWEParameters, tile_parameters

    parameters = SWEParameters(nx=nx, ny=ny, dx=5.0e3, dy=5.0e3, viscosity=viscosity, hyperviscosity=hyperviscosity)
    w = parameters.halo_width
    shape = (ny + 2 * w, nx + 2 * w)
    rng = np.random.default_rng(seed)
    host = [(100.0 + rng.standard_normal(shape)).astype(dtype)] + [rng.standard_normal(shape).astype(dtype)
                                                                   for _ in range(2)]
    params = tile_parameters(parameters, 0, ny, w, xp=xp, dtype=dtype)
    return [xp.asarray(field) for field in host], params, (w, w + ny, w, w + nx)


def _swe_scalars(params, a, b, dt):
    from apps.stencil.channel import kernel_constants

    real = params.dtype.type
    constants = kernel_constants(params)
    return (real(a), real(b), real(dt)) + tuple(
        constants[name] for name in ("gravity", "rdx", "rdy", "rdx2", "rdy2", "viscosity", "hyperviscosity",
                                     "half", "quarter", "two"))


def swe_tiles(dtype, text):
    """The kernel choices named by ``--swe-tiles`` that exist for ``dtype``."""
    from apps.stencil.channel import stage_gpu

    dtype = np.dtype(dtype)
    if text == "default":
        return [stage_gpu.DEFAULT_TILE[dtype]]
    choices = stage_gpu.kernel_choices(dtype)
    if text == "all":
        return list(choices)
    tiles = []
    for item in text.split(","):
        if item == "simple":
            tile = item
        elif item.startswith(("march", "pairs")):  # marchROWSxAHEAD, pairsROWSxAHEAD
            kind = item[:5]
            tile = (kind,) + tuple(int(v) for v in item[len(kind):].split("x"))
        else:
            tile = tuple(int(v) for v in item.split("x"))
        if tile in choices:
            tiles.append(tile)
    return tiles


def check_swe(dtype, tiles):
    """Each tile against the Numba kernel, bitwise, on odd sizes, partial tiles and thin strips."""
    import cupy

    from apps.stencil.channel.stage_cpu import stage_cpu
    from apps.stencil.channel.stage_gpu import stage_gpu

    problems = []
    for viscosity, hyperviscosity in ((0.0, 1.0e9), (40.0, 2.0e10), (25.0, 0.0)):
        host, params, owned = _swe_case(203, 117, dtype, np, 7, viscosity, hyperviscosity)
        device_params = _swe_case(203, 117, dtype, cupy, 7, viscosity, hyperviscosity)[1]
        base = [field + np.asarray(0.5, dtype) for field in host]
        w = owned[0]
        regions = [owned, (w + 3, w + 40, w + 5, w + 150), (w, w + 2, w, w + 203), (w, w + 117, w + 201, w + 203)]
        for region in regions:
            for a, b in ((0.0, 1.0), (0.75, 0.25)):
                scalars = _swe_scalars(params, a, b, 60.0)
                expected = [np.full(host[0].shape, np.nan, dtype) for _ in range(3)]
                stage_cpu(*expected, *base, *host, params.coriolis_rows, params.v_face_mask, *scalars, *region)
                for tile in tiles:
                    out = [cupy.full(host[0].shape, np.nan, dtype) for _ in range(3)]
                    stage_gpu(out, [cupy.asarray(f) for f in base], [cupy.asarray(f) for f in host],
                              device_params.coriolis_rows, device_params.v_face_mask, scalars, region, tile=tile)
                    for name, got, want in zip("huv", out, expected):
                        got = cupy.asnumpy(got)
                        different = np.count_nonzero((got != want) & ~(np.isnan(got) & np.isnan(want)))
                        if different:
                            problems.append(f"{tile} {name} region {region} nu {viscosity} nu4 {hyperviscosity}: "
                                            f"{different} cells")
    return ("MISMATCH: " + "; ".join(problems[:4])) if problems else None


def benchmark_swe_gpu(arguments, dtype, checks, copy_tbs):
    import cupy

    from apps.stencil.channel.stage import SSP_RK3_STAGES
    from apps.stencil.channel.stage_gpu import stage_gpu

    tiles = swe_tiles(dtype, arguments.swe_tiles)
    try:
        problem = check_swe(dtype, tiles)
    except Exception as error:
        problem = f"error: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
    checks[f"swe/{dtype}"] = problem or "ok"
    print(f"check swe {dtype} tiles {tiles}: {problem or 'bitwise equal to CPU'}", flush=True)
    nx, ny = (int(v) for v in arguments.swe_size.split("x"))
    state, params, owned = _swe_case(nx, ny, dtype, cupy, 3)
    # Three scratch triples: the state never changes, so every timed step does the same work.
    work = [[cupy.empty_like(field) for field in state] for _ in range(3)]
    copy_tbs[f"{dtype}/swe"] = measure_copy_tbs([state[0], work[0][0]], arguments)
    rows = []
    for tile in tiles:
        def run_step(_out, _inp, tile=tile):
            sources = (state, work[0], work[1])
            for (a, b), source, target in zip(SSP_RK3_STAGES, sources, work):
                stage_gpu(target, state, source, params.coriolis_rows, params.v_face_mask,
                          _swe_scalars(params, a, b, 30.0), owned, tile=tile)

        try:
            median_ms, best_ms = time_gpu_batches(run_step, [None, None], arguments)
            status = problem or "ok"
        except Exception as error:
            median_ms = best_ms = None
            status = f"error: {type(error).__name__}: {str(error).splitlines()[0][:150]}"
        result = row("swe", "stage", dtype, "contiguous", False, list(tile) if tile != "simple" else ["simple"],
                     nx * ny, np.dtype(dtype).itemsize, median_ms, best_ms, status)
        if median_ms is not None:  # 24 values per update, not the 2 of a Jacobi sweep
            result["tbs"] *= SWE_VALUES_PER_UPDATE / 2
            result["percent_of_copy"] *= SWE_VALUES_PER_UPDATE / 2
        rows.append(result)
        print(f"  swe {dtype} tile={tile}: {result['glups'] or 0:7.2f} G updates/s  {status}", flush=True)
    state = work = None  # free the device memory before the next dtype
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


def benchmark_cpu(arguments):
    """Numba CPU kernel against numpy.copyto on the same arrays (wall-clock, median of repeats)."""
    import numba

    results, copy_tbs = [], {}
    n = arguments.size
    region, fixed = (1, n + 1, 1, n + 1), (1, n)
    n_updates = n_lattice_updates(region, fixed)
    repeats = max(3, min(arguments.repeats, 7))
    for dtype in arguments.dtypes.split(","):
        rng = np.random.default_rng(0)
        arrays = [rng.random((n + 2, n + 2)).astype(dtype) for _ in range(2)]

        def timed(function):
            function()
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                function()
                samples.append(time.perf_counter() - start)
            return statistics.median(samples) * 1e3, min(samples) * 1e3

        copy_ms, _ = timed(lambda: np.copyto(arrays[1], arrays[0]))
        copy = 2 * arrays[0].nbytes / (copy_ms * 1e-3) / 1e12
        copy_tbs[dtype] = copy
        residual = np.zeros(1)
        for with_residual in (False, True):
            median_ms, best_ms = timed(
                lambda: jacobi_sweep(arrays[1], arrays[0], region, fixed, residual if with_residual else None)
            )
            result = row("jacobi", "cpu", dtype, "contiguous", with_residual, [numba.get_num_threads()],
                         n_updates, np.dtype(dtype).itemsize, median_ms, best_ms, "ok")
            result["percent_of_copy"] = 100.0 * result["tbs"] / copy
            results.append(result)
        del arrays
    return results, {}, copy_tbs


def best_rows(results):
    """Best launch shape per (kernel, variant, dtype, layout, residual); failures kept as they are."""
    best = {}
    for result in results:
        key = (result["kernel"], result["variant"], result["dtype"], result["layout"], result["residual"])
        if result["kernel"] == "swe":  # every tile is a kernel worth seeing
            key += (str(result["launch"]),)
        current = best.get(key)
        if current is None or (result["glups"] or 0) > (current["glups"] or 0):
            best[key] = result
    return list(best.values())


def _measured_copy(result, copy_tbs):
    """The copy bandwidth measured on this row's arrays (dtype and layout), else the largest measured."""
    for key in (f"{result['dtype']}/{result['kernel']}", f"{result['dtype']}/{result['layout']}"):
        if key in copy_tbs:
            return copy_tbs[key]
    return max(copy_tbs.values()) if copy_tbs else None


def print_table(results, copy_tbs, reference_name):
    """Median (and best) rate of each row, with its fraction of the reference and of the measured copy."""
    header = (f"{'kernel':7s} {'variant':11s} {'dtype':7s} {'layout':10s} {'resid':5s} {'launch':14s} "
              f"{'ms med':>8s} {'ms min':>8s} {'GLUPS':>8s} {'TB/s':>7s} {'%' + reference_name:>9s} "
              f"{'%copy':>6s} {'%copy@min':>9s}  status")
    print()
    print(header)
    print("-" * len(header))
    for result in best_rows(results):
        launch = "x".join(str(v) for v in result["launch"]) if result["launch"] else "-"
        copy = _measured_copy(result, copy_tbs)
        if result["ms_per_sweep"] is None:
            numbers = f"{'-':>8s} {'-':>8s} {'-':>8s} {'-':>7s} {'-':>9s} {'-':>6s} {'-':>9s}"
        else:
            best_tbs = result["tbs"] * result["ms_per_sweep"] / result["best_ms"]
            result["percent_of_measured_copy"] = 100.0 * result["tbs"] / copy if copy else None
            result["percent_of_measured_copy_at_min"] = 100.0 * best_tbs / copy if copy else None
            numbers = (f"{result['ms_per_sweep']:8.3f} {result['best_ms']:8.3f} {result['glups']:8.2f} "
                       f"{result['tbs']:7.3f} {result['percent_of_copy']:8.1f}% "
                       f"{result['percent_of_measured_copy'] or 0:5.1f}% {result['percent_of_measured_copy_at_min'] or 0:8.1f}%")
        print(f"{result['kernel']:7s} {result['variant']:11s} {result['dtype']:7s} {result['layout']:10s} "
              f"{'yes' if result['residual'] else 'no':5s} {launch:14s} {numbers}  {result['status']}")
    print("measured copy bandwidth (TB/s): " + ", ".join(f"{k} {v:.3f}" for k, v in copy_tbs.items()))
    print("GLUPS: 1e9 updates/s (swe: cell-steps, 24 x itemsize bytes each; jacobi/heat3d: 2 x itemsize)")


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    use_gpu = arguments.backend == "gpu" or (arguments.backend == "auto" and gpu_available())
    metadata = dict(benchmark="stencil_kernels", date=datetime.datetime.now().isoformat(timespec="seconds"),
                    size=arguments.size, repeats=arguments.repeats, batch=arguments.batch,
                    reference_copy_tbs=REFERENCE_COPY_TBS)
    try:
        if use_gpu:
            import cupy

            properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = properties["name"]
            metadata.update(backend="gpu", device=name.decode() if isinstance(name, bytes) else str(name),
                            cupy=cupy.__version__)
            results, checks, copy_tbs = benchmark_gpu(arguments)
            reference_name = "4.23TB"
        else:
            import numba

            metadata.update(backend="cpu", cpu_count=os.cpu_count(), numba_threads=numba.get_num_threads())
            results, checks, copy_tbs = benchmark_cpu(arguments)
            reference_name = "copyto"
    except Exception:
        traceback.print_exc()
        return 1
    # GPU only: the CPU's reference is one thread's numpy.copyto, which parallel kernels may beat.
    implausible = mark_implausible(results, copy_tbs) if use_gpu else []
    print_table(results, copy_tbs, reference_name)
    if arguments.json:
        with open(arguments.json, "w") as stream:
            json.dump(dict(metadata, measured_copy_tbs=copy_tbs, checks=checks, results=results), stream, indent=1)
    failed = [name for name, status in checks.items() if status != "ok"] + implausible
    if failed:
        print("FAILED checks: " + ", ".join(failed))
    return 1 if failed else 0


def mark_implausible(results, copy_tbs):
    """Turn every row that moves more bytes per second than the measured copy into an error; return their names.

    A sweep must at least read and write each cell once, so a rate above the copy bandwidth means the
    kernel did not do its work (or the timer did not wait for it): an error, never a result.
    """
    if not copy_tbs:
        return []
    ceiling = max(copy_tbs.values())
    names = []
    for result in results:
        if result["tbs"] is None:
            continue
        fastest_tbs = result["tbs"] * result["ms_per_sweep"] / result["best_ms"]  # the minimum time's rate
        if fastest_tbs > ceiling:
            result["status"] = (f"IMPLAUSIBLE: {result['tbs']:.2f} TB/s (fastest repeat {fastest_tbs:.2f}) > "
                                f"measured copy {ceiling:.2f} TB/s")
            result["glups"] = result["tbs"] = result["percent_of_copy"] = None
            result["ms_per_sweep"] = None
            names.append(f"{result['kernel']}/{result['variant']}/{result['dtype']}/{result['layout']}")
    return names


if __name__ == "__main__":
    sys.exit(main())

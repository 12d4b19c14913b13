"""GPU (CuPy raw kernels) launchers of the fused SSP-RK3 stage; see :mod:`apps.stencil.swe_scheme.stage`.

Per-row metrics (the lat-lon grid) run the warp-marching ``swe_stage_march_rows`` of
:mod:`apps.stencil.swe_scheme.cuda_march_rows` (or, as an option, ``row_metrics_stage`` of
:mod:`apps.stencil.swe_scheme.cuda_device`, one thread per cell; the same bits). Uniform metrics
(the channel) run one of three kernels that compute the same cells, bit for bit:

``swe_stage_march`` (the default; :mod:`apps.stencil.swe_scheme.cuda_march`)
    Each warp owns 32 adjacent columns and marches down ``rows`` rows of them, with the loads of
    the next ``ahead`` rows in flight (enough bytes in flight to cover the memory latency at the
    occupancy its registers allow); it writes the middle
    28 columns (lanes 2-29), the outer two lanes on each side only supply neighbours. Every
    intermediate quantity -- the mass fluxes U and V, the potential vorticity q, the Bernoulli
    function B and the Laplacians of u and v -- is computed once per point, in registers: x
    neighbours come from the adjacent lanes (warp shuffles), y neighbours from the registers of the
    rows above, and the loads of the next row are issued before the current row is computed. Each
    input value is loaded once per warp (32/28 with the rim lanes); no shared memory, no barrier.
    Where ``base`` is ``stage`` (the first stage), a variant takes the base values from the stage
    values it holds instead of loading them again: 6 of 9 memory streams, the same bits (fp64
    8192 x 4096 on one H200: 640 -> 563 us for that stage, 2189 -> 2114 us per step).
``swe_stage_march_pairs`` (``("pairs", rows, ahead)``, the same module)
    The march with two adjacent columns per lane (60 of 64 columns written per warp): per column
    half the shuffles, index arithmetic and load instructions (one 8- or 16-byte load per lane where
    rows and first column are even). For fp32, where the one-column march is bound by instruction
    issue (ncu: 80% SM throughput at 50% of DRAM bandwidth, one H200), not by memory.
``swe_stage_tiled`` (:mod:`apps.stencil.swe_scheme.cuda_uniform`)
    One block owns a tile of ``TX x TY`` cells staged in shared memory (u and v with a two-cell rim
    for the biharmonic term, h with one) and computes every intermediate quantity once per point in
    shared memory, then the updates. Slower than the march (more shared-memory traffic, two block
    barriers); kept as a measured alternative.
``uniform_grid_stage`` (the tiled kernel's fallback for thin regions; ``"simple"``)
    One thread per cell, every quantity evaluated where it is needed (q three times, with a
    division each; the Laplacian five times per field): the shared device functions with the
    ``UniformGrid`` metric policy.

Bytes: a stage must read ``stage`` and ``base`` (3 fields each) and write ``out`` (3 fields), 9
values per cell (6 in the first stage, where ``base`` is ``stage``). See docs/performance.md.

Every quantity is the same expression, in the same order and with the same parentheses, as the
Numba helper of :mod:`apps.stencil.swe_scheme.stage_cpu`; computing one once and reusing it gives
the same bits as computing it again (``--fmad=false``, IEEE division), so fp64 and fp32 results
equal the CPU's bitwise.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import functools

import numpy as np

from apps.stencil.swe_scheme.cuda_device import device_module, row_metrics_name, uniform_name
from apps.stencil.swe_scheme.cuda_march import MARCH_SHAPES, PAIR_SHAPES, march_name, pairs_name
from apps.stencil.swe_scheme.cuda_march_rows import (
    DEFAULT_MARCH_ROWS,
    MARCH_ROWS_SHAPES,
    march_rows_launch,
    march_rows_kernel,
)
from apps.stencil.swe_scheme.cuda_uniform import kernel_choices, tiled_name, uniform_kernel

SIMPLE_BLOCK = (32, 8, 1)
"""Block of the one-thread-per-cell kernels: 32 threads along x (contiguous in memory, coalesced loads), 8 rows."""

MARCH_WARPS = 4
"""Warps per block of the warp-marching kernel (each owns 28 columns)."""

DEFAULT_TILE = {np.dtype(np.float64): ("march", 16, 2), np.dtype(np.float32): ("pairs", 16, 1)}
"""The kernel each dtype uses unless ``uniform_stage_gpu(..., tile=...)`` says otherwise (at 8192 x 4096
on one H200, ``benchmarks/stencil_kernels.py --swe-tiles all``). fp64: the one-column march, two rows
in flight (about 120 registers, 16 warps per SM). fp32: the two-columns-per-lane march, one row
ahead, 16 rows per warp (402 us per stage against 409 us for 32 rows and 452 us for the one-column
march's two 4-byte stores per pair that it replaced; at the real clock ncu shows the fp32 kernels
limited by L2 throughput, 91%, not by instruction issue). Small regions march fewer rows per warp
(:func:`fitted_march_shape`)."""


WARPS_PER_SM = 8
"""A marching launch should have at least this many warps per multiprocessor (latency hiding)."""


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


def fitted_march_shape(shape: tuple[int, int], warp_columns: int, region_rows: int, compiled,
                       multiprocessors: int | None = None) -> tuple[int, int]:
    """``shape`` = (rows, ahead) with rows halved (down to 4) while a launch over ``warp_columns``
    warps side by side and ``region_rows`` rows would leave the GPU with fewer than
    :data:`WARPS_PER_SM` warps per multiprocessor: a small grid (512 x 256) then marches 4 rows per
    warp instead of 16-32, so enough warps run at once to hide the memory latency. ``compiled`` lists
    the available shapes (``ahead`` drops to 1 where the halved shape lacks it). Any shape gives
    the same bits. ``multiprocessors``: default, the current CUDA device's."""
    if multiprocessors is None:
        import cupy

        multiprocessors = _multiprocessors(cupy.cuda.Device().id)
    wanted = WARPS_PER_SM * multiprocessors
    rows, ahead = shape
    while rows > 4 and warp_columns * -(-region_rows // rows) < wanted:
        rows //= 2
    if (rows, ahead) not in compiled:
        ahead = 1
    return (rows, ahead) if (rows, ahead) in compiled else tuple(shape)


def _same_arrays(first, second) -> bool:
    """Whether the two triples are the same device arrays (same memory, shape and strides): the first
    SSP-RK3 stage passes the state as both ``base`` and ``stage``."""
    return all(a is b or (a.data.ptr == b.data.ptr and a.shape == b.shape and a.strides == b.strides)
               for a, b in zip(first, second))


def _simple_grid(region) -> tuple[int, int, int]:
    j0, j1, i0, i1 = region
    return (-(-(i1 - i0) // SIMPLE_BLOCK[0]), -(-(j1 - j0) // SIMPLE_BLOCK[1]), 1)


def uniform_stage_gpu(out, base, stage, coriolis_rows, v_face_mask, scalars, region, tile=None) -> None:
    """Launch the uniform-grid stage on the current CuPy stream; arguments as validated by the core's stage.

    ``scalars`` is the tuple (a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity,
    half, quarter, two), already converted to the field dtype. ``tile`` picks the kernel: ``None``
    (the dtype's :data:`DEFAULT_TILE`), ``"simple"``, a tile of
    :data:`~apps.stencil.swe_scheme.cuda_uniform.TILES` (regions narrower or shorter than the tile
    run the simple kernel), or ``("march", rows, ahead)`` of
    :data:`~apps.stencil.swe_scheme.cuda_march.MARCH_SHAPES`; all give the same bits. Returns None.
    """
    j0, j1, i0, i1 = region
    dtype = np.dtype(out[0].dtype)
    n_rows, n_columns = out[0].shape
    chosen = DEFAULT_TILE[dtype] if tile is None else tile
    if chosen not in kernel_choices(dtype):
        raise ValueError(f"tile must be None or one of {kernel_choices(dtype)} for {dtype}; found {tile!r}")
    args = (
        *out, *base, *stage, coriolis_rows, v_face_mask, *scalars,
        np.int32(j0), np.int32(j1), np.int32(i0), np.int32(i1), np.int32(n_columns), np.int32(n_rows),
    )  # fmt: skip
    if chosen[0] in ("march", "pairs"):
        pairs = chosen[0] == "pairs"
        groups = -(-(i1 - i0) // (60 if pairs else 28))
        _, rows, ahead = chosen
        if tile is None:
            rows, ahead = fitted_march_shape((rows, ahead), groups, j1 - j0, PAIR_SHAPES if pairs else MARCH_SHAPES)
        grid = (-(-groups // MARCH_WARPS), -(-(j1 - j0) // rows), 1)
        if pairs:
            # Vector loads of a lane's two columns need them at an even offset of 8-/16-byte aligned rows.
            aligned = n_columns % 2 == 0 and i0 % 2 == 0 and all(
                int(array.data.ptr) % (2 * dtype.itemsize) == 0 for array in (*out, *base, *stage))
            name = pairs_name(dtype, rows, ahead, aligned)
        else:
            name = march_name(dtype, rows, ahead, _same_arrays(base, stage))
        uniform_kernel(name)(grid, (32 * MARCH_WARPS, 1, 1), args)
        return
    if chosen == "simple" or i1 - i0 < chosen[0] or j1 - j0 < chosen[1]:
        device_module().get_function(uniform_name(dtype))(_simple_grid(region), SIMPLE_BLOCK, args)
        return
    tx, ty, threads = chosen
    grid = (-(-(i1 - i0) // tx), -(-(j1 - j0) // ty), 1)
    uniform_kernel(tiled_name(dtype, chosen))(grid, (tx, threads // tx, 1), args)


ROW_METRICS_KERNEL = {"name": "march"}
"""The per-row-metrics kernel the stage launches: ``"march"`` (the default,
:mod:`apps.stencil.swe_scheme.cuda_march_rows`) or ``"simple"`` (one thread per cell); same bits."""


def row_metrics_stage_gpu(*args, kernel: str | None = None, coriolis_by_row: bool = False, flat: bool = False) -> None:
    """Launch the per-row-metrics stage on the current CuPy stream; returns None.

    ``args`` as for the core's Numba kernel without the (hyper)viscosity scalars: (out x3, base x3,
    stage x3, increment x3, the 8 row arrays, filtered_rows, coriolis, topography, a, b, dt, gravity,
    rdy, half, quarter, j0, j1, i0, i1), scalars in the field dtype, arrays validated by
    :func:`apps.stencil.swe_scheme.stage.shallow_water_stage`. ``kernel``: ``"march"`` or
    ``"simple"`` (default: :data:`ROW_METRICS_KERNEL`); both give the same bits. ``coriolis_by_row``
    and ``flat`` (:class:`~apps.stencil.swe_scheme.metrics.GridMetrics`' flags) let the march
    read one f per row and no topography (the same bits on such metrics).
    """
    region = tuple(int(x) for x in args[-4:])
    out_h = args[0]
    bounds = tuple(np.int32(x) for x in region)
    chosen = ROW_METRICS_KERNEL["name"] if kernel is None else kernel
    if chosen == "march":
        j0, j1, i0, i1 = region
        shape = fitted_march_shape(DEFAULT_MARCH_ROWS[np.dtype(out_h.dtype)], -(-(i1 - i0) // 30), j1 - j0,
                                   MARCH_ROWS_SHAPES)
        grid, block = march_rows_launch(region, shape)
        function = march_rows_kernel(out_h.dtype, *shape, coriolis_by_row, flat)
        function(grid, block, (*args[:-4], *bounds, np.int32(out_h.shape[1]), np.int32(out_h.shape[0])))
        return
    if chosen != "simple":
        raise ValueError(f"kernel must be 'march' or 'simple'; found {chosen!r}")
    function = device_module().get_function(row_metrics_name(out_h.dtype))
    function(_simple_grid(region), SIMPLE_BLOCK, (*args[:-4], *bounds, np.int32(out_h.shape[1])))


__all__ = ["DEFAULT_TILE", "MARCH_WARPS", "ROW_METRICS_KERNEL", "SIMPLE_BLOCK", "WARPS_PER_SM", "fitted_march_shape", "kernel_choices", "row_metrics_stage_gpu", "uniform_stage_gpu"]

"""CUDA source of the per-row-metrics warp-marching kernel (the lat-lon grid's default GPU kernel).

The channel's warp-marching kernel (:mod:`apps.stencil.swe_scheme.cuda_march`) for the metrics of
the lat-lon grid: the factors of :class:`~apps.stencil.swe_scheme.metrics.GridMetrics` per row
(read once per row by the whole warp), f at every vorticity corner and the bottom topography at
every centre (two more arrays streamed with the fields), and the filtered (polar) rows, whose raw
increments ``dt*L`` go to ``increment`` instead of ``out``. No (hyper)viscosity: that grid has none,
so the stencil reaches one cell and a warp writes 30 of its 32 columns (lanes 1-30).

Each quantity is the expression of the device functions of
:mod:`apps.stencil.swe_scheme.cuda_device` (``tendencies`` with the ``RowMetrics`` policy), in the
same order and with the same parentheses, computed once per point and reused: bitwise the one
thread per cell kernel ``row_metrics_stage`` and the CPU's Numba kernel (``--fmad=false``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

MARCH_ROWS_SOURCE = r"""
template <typename real>
__device__ __forceinline__ real west_of(real x) { return __shfl_up_sync(0xffffffffu, x, 1); }

template <typename real>
__device__ __forceinline__ real east_of(real x) { return __shfl_down_sync(0xffffffffu, x, 1); }

template <typename real>
__device__ __forceinline__ real cell_or_zero(const real* __restrict__ a, int j, int n_rows, bool column_in,
                                             long long column, long long nx)
{
    return (column_in && j >= 0 && j < n_rows) ? a[(long long)j * nx + column] : (real)0;
}

// f of the corner row j: one value per row (ROW_F: the tile's f is constant along every padded row,
// so column 0 holds the row's value) or per corner; 0 outside the array, as cell_or_zero.
template <typename real, bool ROW_F>
__device__ __forceinline__ real coriolis_at(const real* __restrict__ a, int j, int n_rows, bool column_in,
                                            long long column, long long nx)
{
    return cell_or_zero(a, j, n_rows, column_in, ROW_F ? 0 : column, nx);
}

// The topography of row j: exactly 0 on a flat bottom (FLAT: every value is 0, so nothing is read).
template <typename real, bool FLAT>
__device__ __forceinline__ real topography_at(const real* __restrict__ a, int j, int n_rows, bool column_in,
                                              long long column, long long nx)
{
    return FLAT ? (real)0 : cell_or_zero(a, j, n_rows, column_in, column, nx);
}

// A warp owns 32 adjacent columns and writes the middle 30 (lanes 1..30), marching down ROWS rows.
// At the top of the step for row j the registers hold rows j and j + 1 of u, v, h, f at the corners
// of row j + 1, the topography and base of row j, and the quantities of rows j - 1 / j carried over:
// U(j - 1), V(j), q(j), B(j - 1). Slot s of the *_ahead arrays holds u, v, h, f of row j + 2 + s and
// topography, base of row j + 1 + s; each step loads the last slot first.
template <typename real, int ROWS, int AHEAD, bool ROW_F, bool FLAT>
__global__ void __launch_bounds__(128) swe_stage_march_rows(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* __restrict__ h, const real* __restrict__ u, const real* __restrict__ v,
    real* inc_h, real* inc_u, real* inc_v,
    const real* __restrict__ cos_center, const real* __restrict__ rcos_center,
    const real* __restrict__ rdx_center, const real* __restrict__ rdy_center,
    const real* __restrict__ cos_face, const real* __restrict__ rdx_face, const real* __restrict__ rdy_face,
    const real* __restrict__ v_face_mask, const signed char* __restrict__ filtered_rows,
    const real* __restrict__ coriolis, const real* __restrict__ topography,
    const real a, const real b, const real dt, const real gravity, const real rdy,
    const real half, const real quarter,
    const int j0, const int j1, const int i0, const int i1, const int n_columns, const int n_rows)
{
    const int lane = (int)(threadIdx.x & 31);
    const int group = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
    const int i = i0 + group * 30 + lane - 1;
    const int jb = j0 + (int)blockIdx.y * ROWS;
    const int je = min(jb + ROWS, j1);
    if (i0 + group * 30 >= i1) {
        return;  // the whole warp leaves together
    }
    const bool column_in = i >= 0 && i < n_columns;
    const bool writes = lane >= 1 && lane < 31 && i < i1;
    const long long nx = n_columns;
    const long long column = column_in ? i : 0;

    // Prologue: rows jb - 1, jb, jb + 1.
    const real u_m1 = cell_or_zero(u, jb - 1, n_rows, column_in, column, nx);
    const real v_m1 = cell_or_zero(v, jb - 1, n_rows, column_in, column, nx);
    const real h_m1 = cell_or_zero(h, jb - 1, n_rows, column_in, column, nx);
    const real topography_m1 = topography_at<real, FLAT>(topography, jb - 1, n_rows, column_in, column, nx);
    real u_0 = cell_or_zero(u, jb, n_rows, column_in, column, nx);
    real v_0 = cell_or_zero(v, jb, n_rows, column_in, column, nx);
    real h_0 = cell_or_zero(h, jb, n_rows, column_in, column, nx);
    const real coriolis_0 = coriolis_at<real, ROW_F>(coriolis, jb, n_rows, column_in, column, nx);
    real u_p1 = cell_or_zero(u, jb + 1, n_rows, column_in, column, nx);
    real v_p1 = cell_or_zero(v, jb + 1, n_rows, column_in, column, nx);
    real h_p1 = cell_or_zero(h, jb + 1, n_rows, column_in, column, nx);
    real coriolis_p1 = coriolis_at<real, ROW_F>(coriolis, jb + 1, n_rows, column_in, column, nx);
    real topography_0 = topography_at<real, FLAT>(topography, jb, n_rows, column_in, column, nx);
    real base_h_0 = cell_or_zero(base_h, jb, n_rows, column_in, column, nx);
    real base_u_0 = cell_or_zero(base_u, jb, n_rows, column_in, column, nx);
    real base_v_0 = cell_or_zero(base_v, jb, n_rows, column_in, column, nx);
    // The last rows the march uses, plus one: u, v, h, f to row je, topography and base to je - 1.
    // Rows loaded ahead past them (the next warp's rows) are not loaded: zero, never used.
    const int cell_rows = min(n_rows, je + 1), row_rows = min(n_rows, je);
    real u_ahead[AHEAD], v_ahead[AHEAD], h_ahead[AHEAD], coriolis_ahead[AHEAD], topography_ahead[AHEAD];
    real base_h_ahead[AHEAD], base_u_ahead[AHEAD], base_v_ahead[AHEAD];
#pragma unroll
    for (int slot = 0; slot < AHEAD - 1; ++slot) {
        u_ahead[slot] = cell_or_zero(u, jb + 2 + slot, cell_rows, column_in, column, nx);
        v_ahead[slot] = cell_or_zero(v, jb + 2 + slot, cell_rows, column_in, column, nx);
        h_ahead[slot] = cell_or_zero(h, jb + 2 + slot, cell_rows, column_in, column, nx);
        coriolis_ahead[slot] = coriolis_at<real, ROW_F>(coriolis, jb + 2 + slot, cell_rows, column_in, column, nx);
        topography_ahead[slot] = topography_at<real, FLAT>(topography, jb + 1 + slot, row_rows, column_in, column, nx);
        base_h_ahead[slot] = cell_or_zero(base_h, jb + 1 + slot, row_rows, column_in, column, nx);
        base_u_ahead[slot] = cell_or_zero(base_u, jb + 1 + slot, row_rows, column_in, column, nx);
        base_v_ahead[slot] = cell_or_zero(base_v, jb + 1 + slot, row_rows, column_in, column, nx);
    }

    // Carried quantities at the first row: U(jb - 1), V(jb), q(jb), B(jb - 1).
    const real h_m1_west = west_of(h_m1);
    real h_0_west = west_of(h_0);
    real flux_u_m1 = (half * (h_m1_west + h_m1)) * u_m1;
    real flux_u_m1_east = east_of(flux_u_m1);
    real flux_v_0 = ((half * (h_m1 + h_0)) * v_0) * cos_face[jb];
    real flux_v_0_west = west_of(flux_v_0);
    real q_0;
    {
        const real zeta = (v_0 - west_of(v_0)) * rdx_face[jb] - (u_0 * cos_center[jb] - u_m1 * cos_center[jb - 1]) * rdy_face[jb];
        const real h_corner = quarter * ((h_m1_west + h_m1) + (h_0_west + h_0));
        q_0 = (coriolis_0 + zeta) / h_corner;
    }
    real q_0_east = east_of(q_0);
    real bernoulli_m1;
    {
        const real u_m1_east = east_of(u_m1);
        const real kinetic = quarter * ((u_m1 * u_m1 + u_m1_east * u_m1_east)
                                        + ((v_m1 * v_m1) * cos_face[jb - 1] + (v_0 * v_0) * cos_face[jb]) * rcos_center[jb - 1]);
        bernoulli_m1 = gravity * (h_m1 + topography_m1) + kinetic;
    }

    for (int j = jb; j < je; ++j) {
        u_ahead[AHEAD - 1] = cell_or_zero(u, j + 1 + AHEAD, cell_rows, column_in, column, nx);
        v_ahead[AHEAD - 1] = cell_or_zero(v, j + 1 + AHEAD, cell_rows, column_in, column, nx);
        h_ahead[AHEAD - 1] = cell_or_zero(h, j + 1 + AHEAD, cell_rows, column_in, column, nx);
        coriolis_ahead[AHEAD - 1] = coriolis_at<real, ROW_F>(coriolis, j + 1 + AHEAD, cell_rows, column_in, column, nx);
        topography_ahead[AHEAD - 1] = topography_at<real, FLAT>(topography, j + AHEAD, row_rows, column_in, column, nx);
        base_h_ahead[AHEAD - 1] = cell_or_zero(base_h, j + AHEAD, row_rows, column_in, column, nx);
        base_u_ahead[AHEAD - 1] = cell_or_zero(base_u, j + AHEAD, row_rows, column_in, column, nx);
        base_v_ahead[AHEAD - 1] = cell_or_zero(base_v, j + AHEAD, row_rows, column_in, column, nx);

        // Row j + 1: V, q. Row j: U, B.
        const real h_p1_west = west_of(h_p1);
        const real flux_v_p1 = ((half * (h_0 + h_p1)) * v_p1) * cos_face[j + 1];
        const real flux_v_p1_west = west_of(flux_v_p1);
        real q_p1;
        {
            const real zeta = (v_p1 - west_of(v_p1)) * rdx_face[j + 1] - (u_p1 * cos_center[j + 1] - u_0 * cos_center[j]) * rdy_face[j + 1];
            const real h_corner = quarter * ((h_0_west + h_0) + (h_p1_west + h_p1));
            q_p1 = (coriolis_p1 + zeta) / h_corner;
        }
        const real q_p1_east = east_of(q_p1);
        const real flux_u_0 = (half * (h_0_west + h_0)) * u_0;
        const real flux_u_0_east = east_of(flux_u_0);
        const real u_0_east = east_of(u_0);
        const real kinetic = quarter * ((u_0 * u_0 + u_0_east * u_0_east)
                                        + ((v_0 * v_0) * cos_face[j] + (v_p1 * v_p1) * cos_face[j + 1]) * rcos_center[j]);
        const real bernoulli_0 = gravity * (h_0 + topography_0) + kinetic;
        const real bernoulli_0_west = west_of(bernoulli_0);

        // The update of row j (tendencies() of cuda_device, RowMetrics).
        const real dh = -((flux_u_0_east - flux_u_0) * rdx_center[j] + (flux_v_p1 - flux_v_0) * rdy_center[j]);
        const real v_flux_south = half * (flux_v_0_west + flux_v_0);
        const real v_flux_north = half * (flux_v_p1_west + flux_v_p1);
        const real u_flux_west = half * (flux_u_m1 + flux_u_0);
        const real u_flux_east = half * (flux_u_m1_east + flux_u_0_east);
        const real du = (half * (q_0 * v_flux_south + q_p1 * v_flux_north)) * rcos_center[j]
                        - (bernoulli_0 - bernoulli_0_west) * rdx_center[j];
        real dv = -(half * (q_0 * u_flux_west + q_0_east * u_flux_east)) - (bernoulli_0 - bernoulli_m1) * rdy;
        dv = dv * v_face_mask[j];
        if (writes) {
            const long long k = (long long)j * nx + i;
            if (filtered_rows[j] != 0) {
                inc_h[k] = dt * dh;
                inc_u[k] = dt * du;
                inc_v[k] = dt * dv;
            } else {
                out_h[k] = a * base_h_0 + b * (h_0 + dt * dh);
                out_u[k] = a * base_u_0 + b * (u_0 + dt * du);
                out_v[k] = a * base_v_0 + b * (v_0 + dt * dv);
            }
        }

        // Move the window down one row.
        u_0 = u_p1; u_p1 = u_ahead[0];
        v_0 = v_p1; v_p1 = v_ahead[0];
        h_0 = h_p1; h_0_west = h_p1_west; h_p1 = h_ahead[0];
        coriolis_p1 = coriolis_ahead[0];
        topography_0 = topography_ahead[0];
        flux_u_m1 = flux_u_0; flux_u_m1_east = flux_u_0_east;
        flux_v_0 = flux_v_p1; flux_v_0_west = flux_v_p1_west;
        q_0 = q_p1; q_0_east = q_p1_east;
        bernoulli_m1 = bernoulli_0;
        base_h_0 = base_h_ahead[0]; base_u_0 = base_u_ahead[0]; base_v_0 = base_v_ahead[0];
#pragma unroll
        for (int slot = 0; slot < AHEAD - 1; ++slot) {
            u_ahead[slot] = u_ahead[slot + 1];
            v_ahead[slot] = v_ahead[slot + 1];
            h_ahead[slot] = h_ahead[slot + 1];
            coriolis_ahead[slot] = coriolis_ahead[slot + 1];
            topography_ahead[slot] = topography_ahead[slot + 1];
            base_h_ahead[slot] = base_h_ahead[slot + 1];
            base_u_ahead[slot] = base_u_ahead[slot + 1];
            base_v_ahead[slot] = base_v_ahead[slot + 1];
        }
    }
}
"""

MARCH_ROWS_SHAPES = ((16, 1), (16, 2), (32, 1), (32, 2), (8, 2), (8, 1), (4, 2), (4, 1))
"""The compiled (rows marched, rows loaded ahead) of the per-row-metrics warp-marching kernel."""

DEFAULT_MARCH_ROWS = {np.dtype(np.float64): (16, 1), np.dtype(np.float32): (8, 1)}
"""The shape each dtype uses on large regions; small regions march fewer rows
(:func:`apps.stencil.swe_scheme.stage_gpu.fitted_march_shape`). Measured on one H200 at
1440 x 720 (one stage over the owned cells, in a CUDA graph): fp64 (16, 1) 28 us, (16, 2) 41 us;
fp32 (8, 1) 17 us, (32, 1) 27 us -- loading rows ahead costs registers, hence resident warps."""

MARCH_ROWS_WARPS = 4
"""Warps per block (each writes 30 columns)."""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def march_rows_name(dtype: Any, rows: int, ahead: int, coriolis_by_row: bool = False, flat: bool = False) -> str:
    """The name expression of the kernel for ``dtype``, ``rows`` and ``ahead``; ``coriolis_by_row``:
    f is constant along each padded row (one load per row); ``flat``: the topography is all zeros
    (not read). Both give the bits of the general kernel on such metrics."""
    return "swe_stage_march_rows<%s, %d, %d, %s, %s>" % (
        _REAL[np.dtype(dtype)], rows, ahead, "true" if coriolis_by_row else "false", "true" if flat else "false")


@functools.lru_cache(maxsize=None)
def march_rows_kernel(dtype: Any, rows: int, ahead: int, coriolis_by_row: bool = False, flat: bool = False) -> Any:
    """The compiled kernel of :func:`march_rows_name`, built on first use (one instantiation per NVRTC
    compilation, ``--fmad=false``)."""
    import cupy

    if (rows, ahead) not in MARCH_ROWS_SHAPES:
        raise ValueError(f"(rows, ahead) must be one of {MARCH_ROWS_SHAPES}; found {(rows, ahead)}")
    name = march_rows_name(dtype, rows, ahead, coriolis_by_row, flat)
    return cupy.RawModule(code=MARCH_ROWS_SOURCE, options=("--fmad=false",), name_expressions=(name,)).get_function(name)


def march_rows_launch(region, shape: tuple[int, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of the kernel over ``region`` = (j0, j1, i0, i1) with ``shape`` = (rows, ahead)."""
    j0, j1, i0, i1 = region
    groups = -(-(i1 - i0) // 30)
    return (-(-groups // MARCH_ROWS_WARPS), -(-(j1 - j0) // shape[0]), 1), (32 * MARCH_ROWS_WARPS, 1, 1)


__all__ = ["DEFAULT_MARCH_ROWS", "MARCH_ROWS_SHAPES", "MARCH_ROWS_SOURCE", "march_rows_launch",
           "march_rows_kernel", "march_rows_name"]

"""CUDA source of the uniform-grid warp-marching kernel (the channel's default GPU kernel).

Moved unchanged from the channel's former ``stage_cuda`` module; compiled together with the tiled
kernel by :func:`apps.stencil.shallow_water.cuda_uniform.uniform_module` (``--fmad=false``) and
launched by :mod:`apps.stencil.shallow_water.stage_gpu`, which describes it.
"""

from __future__ import annotations

import numpy as np

MARCH_SOURCE = r"""
// Warp-marching variant: each warp owns 32 adjacent columns, of which the middle 28 (lanes 2..29)
// are written, and marches down ROWS rows of them. Every quantity of a row is computed once per
// column in registers; the x neighbours come from the adjacent lanes (warp shuffles), the y
// neighbours from the registers of the previous rows. Lanes 0, 1, 30, 31 only supply neighbours.
// No shared memory, no block barrier. Same expressions, order and parentheses as swe_stage_simple.
template <typename real>
__device__ __forceinline__ real from_west(real x)
{
    return __shfl_up_sync(0xffffffffu, x, 1);
}

template <typename real>
__device__ __forceinline__ real from_east(real x)
{
    return __shfl_down_sync(0xffffffffu, x, 1);
}

template <typename real>
__device__ __forceinline__ real load_or_zero(const real* __restrict__ a, int j, int n_rows, bool column_in, long long column_offset, long long nx)
{
    return (column_in && j >= 0 && j < n_rows) ? a[(long long)j * nx + column_offset] : (real)0;
}

template <typename real, int ROWS, int AHEAD>
__global__ void __launch_bounds__(128) swe_stage_march(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* __restrict__ h, const real* __restrict__ u, const real* __restrict__ v,
    const real* __restrict__ coriolis_rows, const real* __restrict__ v_face_mask,
    const real a, const real b, const real dt, const real gravity,
    const real rdx, const real rdy, const real rdx2, const real rdy2,
    const real viscosity, const real hyperviscosity,
    const real half, const real quarter, const real two,
    const int j0, const int j1, const int i0, const int i1, const int n_columns, const int n_rows)
{
    const int lane = (int)(threadIdx.x & 31);
    const int group = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
    const int i = i0 + group * 28 + lane - 2;
    const int jb = j0 + (int)blockIdx.y * ROWS;
    const int je = min(jb + ROWS, j1);
    if (i0 + group * 28 >= i1) {
        return;  // the whole warp leaves together
    }
    const bool column_in = i >= 0 && i < n_columns;
    const bool writes = lane >= 2 && lane < 30 && i < i1;
    const long long nx = n_columns;
    const long long column = column_in ? i : 0;
    const bool laplacian_needed = viscosity != (real)0 || hyperviscosity != (real)0;

    // Prologue: the rows above jb.
    real u_m2 = load_or_zero(u, jb - 2, n_rows, column_in, column, nx);
    real u_m1 = load_or_zero(u, jb - 1, n_rows, column_in, column, nx);
    real u_0 = load_or_zero(u, jb, n_rows, column_in, column, nx);
    real u_p1 = load_or_zero(u, jb + 1, n_rows, column_in, column, nx);
    real v_m2 = load_or_zero(v, jb - 2, n_rows, column_in, column, nx);
    real v_m1 = load_or_zero(v, jb - 1, n_rows, column_in, column, nx);
    real v_0 = load_or_zero(v, jb, n_rows, column_in, column, nx);
    real v_p1 = load_or_zero(v, jb + 1, n_rows, column_in, column, nx);
    const real h_m1 = load_or_zero(h, jb - 1, n_rows, column_in, column, nx);
    real h_0 = load_or_zero(h, jb, n_rows, column_in, column, nx);
    // Row j + 2 of u, v and row j + 1 of h for the first step, and base at jb.
    real u_p2 = load_or_zero(u, jb + 2, n_rows, column_in, column, nx);
    real v_p2 = load_or_zero(v, jb + 2, n_rows, column_in, column, nx);
    real h_p1 = load_or_zero(h, jb + 1, n_rows, column_in, column, nx);
    real base_h_0 = load_or_zero(base_h, jb, n_rows, column_in, column, nx);
    real base_u_0 = load_or_zero(base_u, jb, n_rows, column_in, column, nx);
    real base_v_0 = load_or_zero(base_v, jb, n_rows, column_in, column, nx);
    // The rows loaded ahead (AHEAD steps in flight): at the top of step j, slot s < AHEAD - 1 holds
    // u, v at row j + 3 + s, h at row j + 2 + s and base at row j + 1 + s; each step loads the last slot.
    real u_ahead[AHEAD], v_ahead[AHEAD], h_ahead[AHEAD], base_h_ahead[AHEAD], base_u_ahead[AHEAD], base_v_ahead[AHEAD];
#pragma unroll
    for (int slot = 0; slot < AHEAD - 1; ++slot) {
        u_ahead[slot] = load_or_zero(u, jb + 3 + slot, n_rows, column_in, column, nx);
        v_ahead[slot] = load_or_zero(v, jb + 3 + slot, n_rows, column_in, column, nx);
        h_ahead[slot] = load_or_zero(h, jb + 2 + slot, n_rows, column_in, column, nx);
        base_h_ahead[slot] = load_or_zero(base_h, jb + 1 + slot, n_rows, column_in, column, nx);
        base_u_ahead[slot] = load_or_zero(base_u, jb + 1 + slot, n_rows, column_in, column, nx);
        base_v_ahead[slot] = load_or_zero(base_v, jb + 1 + slot, n_rows, column_in, column, nx);
    }

    const real u_m1_west = from_west(u_m1), u_m1_east = from_east(u_m1);
    const real v_m1_west = from_west(v_m1), v_m1_east = from_east(v_m1);
    real u_0_west = from_west(u_0), u_0_east = from_east(u_0);
    real v_0_west = from_west(v_0), v_0_east = from_east(v_0);
    real lap_u_m1 = (real)0, lap_u_0 = (real)0, lap_v_m1 = (real)0, lap_v_0 = (real)0;
    if (laplacian_needed) {
        lap_u_m1 = ((u_m1_west + u_m1_east) - two * u_m1) * rdx2 + ((u_m2 + u_0) - two * u_m1) * rdy2;
        lap_u_0 = ((u_0_west + u_0_east) - two * u_0) * rdx2 + ((u_m1 + u_p1) - two * u_0) * rdy2;
        lap_v_m1 = ((v_m1_west + v_m1_east) - two * v_m1) * rdx2 + ((v_m2 + v_0) - two * v_m1) * rdy2;
        lap_v_0 = ((v_0_west + v_0_east) - two * v_0) * rdx2 + ((v_m1 + v_p1) - two * v_0) * rdy2;
    }
    const real h_m1_west = from_west(h_m1);
    real h_0_west = from_west(h_0);
    // U at row jb - 1 (own column and the east neighbour's).
    real flux_u_m1 = (half * (h_m1_west + h_m1)) * u_m1;
    real flux_u_m1_east = from_east(flux_u_m1);
    // V at row jb (own and west).
    real flux_v_0 = (half * (h_m1 + h_0)) * v_0;
    real flux_v_0_west = from_west(flux_v_0);
    // q at row jb (own and east).
    real q_0;
    {
        const real zeta = (v_0 - v_0_west) * rdx - (u_0 - u_m1) * rdy;
        const real h_corner = quarter * ((h_m1_west + h_m1) + (h_0_west + h_0));
        q_0 = (coriolis_rows[jb] + zeta) / h_corner;
    }
    real q_0_east = from_east(q_0);
    // B at row jb - 1.
    real bernoulli_m1 = gravity * h_m1 + quarter * ((u_m1 * u_m1 + u_m1_east * u_m1_east) + (v_m1 * v_m1 + v_0 * v_0));

    for (int j = jb; j < je; ++j) {
        // Loads for AHEAD steps later first: their latency hides behind the arithmetic of the steps between.
        u_ahead[AHEAD - 1] = load_or_zero(u, j + 2 + AHEAD, n_rows, column_in, column, nx);
        v_ahead[AHEAD - 1] = load_or_zero(v, j + 2 + AHEAD, n_rows, column_in, column, nx);
        h_ahead[AHEAD - 1] = load_or_zero(h, j + 1 + AHEAD, n_rows, column_in, column, nx);
        base_h_ahead[AHEAD - 1] = load_or_zero(base_h, j + AHEAD, n_rows, column_in, column, nx);
        base_u_ahead[AHEAD - 1] = load_or_zero(base_u, j + AHEAD, n_rows, column_in, column, nx);
        base_v_ahead[AHEAD - 1] = load_or_zero(base_v, j + AHEAD, n_rows, column_in, column, nx);

        // Row j + 1: Laplacians, V, q; row j: U, B.
        const real u_p1_west = from_west(u_p1), u_p1_east = from_east(u_p1);
        const real v_p1_west = from_west(v_p1), v_p1_east = from_east(v_p1);
        const real h_p1_west = from_west(h_p1);
        real lap_u_p1 = (real)0, lap_v_p1 = (real)0;
        if (laplacian_needed) {
            lap_u_p1 = ((u_p1_west + u_p1_east) - two * u_p1) * rdx2 + ((u_0 + u_p2) - two * u_p1) * rdy2;
            lap_v_p1 = ((v_p1_west + v_p1_east) - two * v_p1) * rdx2 + ((v_0 + v_p2) - two * v_p1) * rdy2;
        }
        const real flux_u_0 = (half * (h_0_west + h_0)) * u_0;
        const real flux_u_0_east = from_east(flux_u_0);
        const real flux_v_p1 = (half * (h_0 + h_p1)) * v_p1;
        const real flux_v_p1_west = from_west(flux_v_p1);
        real q_p1;
        {
            const real zeta = (v_p1 - v_p1_west) * rdx - (u_p1 - u_0) * rdy;
            const real h_corner = quarter * ((h_0_west + h_0) + (h_p1_west + h_p1));
            q_p1 = (coriolis_rows[j + 1] + zeta) / h_corner;
        }
        const real q_p1_east = from_east(q_p1);
        const real bernoulli_0 = gravity * h_0 + quarter * ((u_0 * u_0 + u_0_east * u_0_east) + (v_0 * v_0 + v_p1 * v_p1));
        const real bernoulli_0_west = from_west(bernoulli_0);
        const real lap_u_0_west = from_west(lap_u_0), lap_u_0_east = from_east(lap_u_0);
        const real lap_v_0_west = from_west(lap_v_0), lap_v_0_east = from_east(lap_v_0);

        // The update of row j.
        const real dh = -((flux_u_0_east - flux_u_0) * rdx + (flux_v_p1 - flux_v_0) * rdy);
        const real v_flux_south = half * (flux_v_0_west + flux_v_0);
        const real v_flux_north = half * (flux_v_p1_west + flux_v_p1);
        const real u_flux_west = half * (flux_u_m1 + flux_u_0);
        const real u_flux_east = half * (flux_u_m1_east + flux_u_0_east);
        real du = half * (q_0 * v_flux_south + q_p1 * v_flux_north) - (bernoulli_0 - bernoulli_0_west) * rdx;
        real dv = -(half * (q_0 * u_flux_west + q_0_east * u_flux_east)) - (bernoulli_0 - bernoulli_m1) * rdy;
        if (viscosity != (real)0) {
            du = du + viscosity * lap_u_0;
            dv = dv + viscosity * lap_v_0;
        }
        if (hyperviscosity != (real)0) {
            du = du - hyperviscosity * (((lap_u_0_west + lap_u_0_east) - two * lap_u_0) * rdx2
                                        + ((lap_u_m1 + lap_u_p1) - two * lap_u_0) * rdy2);
            dv = dv - hyperviscosity * (((lap_v_0_west + lap_v_0_east) - two * lap_v_0) * rdx2
                                        + ((lap_v_m1 + lap_v_p1) - two * lap_v_0) * rdy2);
        }
        dv = dv * v_face_mask[j];
        if (writes) {
            const long long k = (long long)j * nx + i;
            out_h[k] = a * base_h_0 + b * (h_0 + dt * dh);
            out_u[k] = a * base_u_0 + b * (u_0 + dt * du);
            out_v[k] = a * base_v_0 + b * (v_0 + dt * dv);
        }

        // Move the window down one row.
        u_0 = u_p1; u_0_east = u_p1_east; u_p1 = u_p2; u_p2 = u_ahead[0];
        v_0 = v_p1; v_p1 = v_p2; v_p2 = v_ahead[0];
        h_0 = h_p1; h_0_west = h_p1_west; h_p1 = h_ahead[0];
        lap_u_m1 = lap_u_0; lap_u_0 = lap_u_p1; lap_v_m1 = lap_v_0; lap_v_0 = lap_v_p1;
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
            base_h_ahead[slot] = base_h_ahead[slot + 1];
            base_u_ahead[slot] = base_u_ahead[slot + 1];
            base_v_ahead[slot] = base_v_ahead[slot + 1];
        }
    }
}
"""

MARCH_SHAPES = ((16, 1), (32, 1), (16, 2), (32, 2), (8, 2), (8, 1), (4, 2), (4, 1))
"""The compiled (rows marched, rows loaded ahead) of the warp-marching kernel (``("march", rows, ahead)``)."""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def march_name(dtype: np.dtype, rows: int, ahead: int) -> str:
    """The name expression of the warp-marching kernel for ``dtype``, ``rows`` and ``ahead``."""
    return "swe_stage_march<%s, %d, %d>" % (_REAL[np.dtype(dtype)], rows, ahead)

"""CUDA source of the fused SSP-RK3 stage (:mod:`apps.stencil.swe.stage_gpu`), compiled once per process.

One RawModule holds every instantiation (dtype x kernel x tile or march shape); the launcher in
:mod:`apps.stencil.swe.stage_gpu` picks one by the names :func:`simple_name`, :func:`tiled_name` and
:func:`march_name` give. The kernels are described there.

The module is compiled with ``--fmad=false`` so NVRTC does not contract ``a*b + c`` into a fused
multiply-add, which would round differently from the CPU; division is IEEE-rounded (NVRTC's default
``-prec-div=true``). Hence fp64 and fp32 results equal the CPU's bitwise.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

STAGE_SOURCE = r"""
template <typename real>
__device__ __forceinline__ real u_flux(const real* h, const real* u, long long nx, int j, int i, real half)
{
    const long long k = (long long)j * nx + i;
    return (half * (h[k - 1] + h[k])) * u[k];
}

template <typename real>
__device__ __forceinline__ real v_flux(const real* h, const real* v, long long nx, int j, int i, real half)
{
    const long long k = (long long)j * nx + i;
    return (half * (h[k - nx] + h[k])) * v[k];
}

template <typename real>
__device__ __forceinline__ real potential_vorticity(const real* h, const real* u, const real* v,
    const real* coriolis_rows, long long nx, int j, int i, real rdx, real rdy, real quarter)
{
    const long long k = (long long)j * nx + i;
    const real zeta = (v[k] - v[k - 1]) * rdx - (u[k] - u[k - nx]) * rdy;
    const real h_corner = quarter * ((h[k - nx - 1] + h[k - nx]) + (h[k - 1] + h[k]));
    return (coriolis_rows[j] + zeta) / h_corner;
}

template <typename real>
__device__ __forceinline__ real bernoulli(const real* h, const real* u, const real* v, long long nx,
    int j, int i, real gravity, real quarter)
{
    const long long k = (long long)j * nx + i;
    const real kinetic = quarter * ((u[k] * u[k] + u[k + 1] * u[k + 1]) + (v[k] * v[k] + v[k + nx] * v[k + nx]));
    return gravity * h[k] + kinetic;
}

// The same helpers on a row-major tile in shared memory (row width W), at flat index k.
template <typename real, int W>
__device__ __forceinline__ real tile_laplacian(const real* a, int k, real rdx2, real rdy2, real two)
{
    return ((a[k - 1] + a[k + 1]) - two * a[k]) * rdx2 + ((a[k - W] + a[k + W]) - two * a[k]) * rdy2;
}

template <typename real>
__device__ __forceinline__ real laplacian(const real* a, long long nx, int j, int i, real rdx2, real rdy2, real two)
{
    const long long k = (long long)j * nx + i;
    return ((a[k - 1] + a[k + 1]) - two * a[k]) * rdx2 + ((a[k - nx] + a[k + nx]) - two * a[k]) * rdy2;
}

template <typename real>
__device__ __forceinline__ real bilaplacian(const real* a, long long nx, int j, int i, real rdx2, real rdy2, real two)
{
    const real centre = laplacian(a, nx, j, i, rdx2, rdy2, two);
    const real west = laplacian(a, nx, j, i - 1, rdx2, rdy2, two);
    const real east = laplacian(a, nx, j, i + 1, rdx2, rdy2, two);
    const real south = laplacian(a, nx, j - 1, i, rdx2, rdy2, two);
    const real north = laplacian(a, nx, j + 1, i, rdx2, rdy2, two);
    return ((west + east) - two * centre) * rdx2 + ((south + north) - two * centre) * rdy2;
}

template <typename real>
__global__ void swe_stage_simple(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* h, const real* u, const real* v,
    const real* coriolis_rows, const real* v_face_mask,
    const real a, const real b, const real dt, const real gravity,
    const real rdx, const real rdy, const real rdx2, const real rdy2,
    const real viscosity, const real hyperviscosity,
    const real half, const real quarter, const real two,
    const int j0, const int j1, const int i0, const int i1, const int n_columns, const int n_rows)
{
    const int i = i0 + (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int j = j0 + (int)(blockIdx.y * blockDim.y + threadIdx.y);
    if (i >= i1 || j >= j1) {
        return;
    }
    const long long nx = n_columns;
    const long long k = (long long)j * nx + i;

    const real dh = -((u_flux(h, u, nx, j, i + 1, half) - u_flux(h, u, nx, j, i, half)) * rdx
                      + (v_flux(h, v, nx, j + 1, i, half) - v_flux(h, v, nx, j, i, half)) * rdy);

    const real q_here = potential_vorticity(h, u, v, coriolis_rows, nx, j, i, rdx, rdy, quarter);
    const real q_north = potential_vorticity(h, u, v, coriolis_rows, nx, j + 1, i, rdx, rdy, quarter);
    const real q_east = potential_vorticity(h, u, v, coriolis_rows, nx, j, i + 1, rdx, rdy, quarter);
    const real v_flux_south = half * (v_flux(h, v, nx, j, i - 1, half) + v_flux(h, v, nx, j, i, half));
    const real v_flux_north = half * (v_flux(h, v, nx, j + 1, i - 1, half) + v_flux(h, v, nx, j + 1, i, half));
    const real u_flux_west = half * (u_flux(h, u, nx, j - 1, i, half) + u_flux(h, u, nx, j, i, half));
    const real u_flux_east = half * (u_flux(h, u, nx, j - 1, i + 1, half) + u_flux(h, u, nx, j, i + 1, half));

    const real bernoulli_here = bernoulli(h, u, v, nx, j, i, gravity, quarter);
    real du = half * (q_here * v_flux_south + q_north * v_flux_north)
              - (bernoulli_here - bernoulli(h, u, v, nx, j, i - 1, gravity, quarter)) * rdx;
    real dv = -(half * (q_here * u_flux_west + q_east * u_flux_east))
              - (bernoulli_here - bernoulli(h, u, v, nx, j - 1, i, gravity, quarter)) * rdy;

    if (viscosity != (real)0) {
        du = du + viscosity * laplacian(u, nx, j, i, rdx2, rdy2, two);
        dv = dv + viscosity * laplacian(v, nx, j, i, rdx2, rdy2, two);
    }
    if (hyperviscosity != (real)0) {
        du = du - hyperviscosity * bilaplacian(u, nx, j, i, rdx2, rdy2, two);
        dv = dv - hyperviscosity * bilaplacian(v, nx, j, i, rdx2, rdy2, two);
    }
    dv = dv * v_face_mask[j];

    out_h[k] = a * base_h[k] + b * (h[k] + dt * dh);
    out_u[k] = a * base_u[k] + b * (u[k] + dt * du);
    out_v[k] = a * base_v[k] + b * (v[k] + dt * dv);
}

// One block of NT threads updates the TX x TY cells [jb, jb + TY) x [ib, ib + TX) (clipped to the
// region). Shared-memory tiles, in tile coordinates r = j - jb, c = i - ib:
//   su, sv  : r in [-2, TY + 1], c in [-2, TX + 1]   (stage u, v; row width WF = TX + 4)
//   sh      : r in [-1, TY],     c in [-1, TX]       (stage h;    row width WQ = TX + 2)
//   derived : same footprint as sh, each filled where the updates read it:
//     s_uflux U = h_u u   r in [-1, TY - 1], c in [0, TX]
//     s_vflux V = h_v v   r in [0, TY],      c in [-1, TX - 1]
//     s_q     q           r in [0, TY],      c in [0, TX]
//     s_b     B           r in [-1, TY - 1], c in [-1, TX - 1]
//     s_lu/lv lap u, v    r in [-1, TY],     c in [-1, TX]
// Inputs outside the padded arrays (only past the region's far edges, in a partial tile) read as
// 0 / 1 and feed only cells that are not written.
template <typename real, int TX, int TY, int NT>
__global__ void __launch_bounds__(NT) swe_stage_tiled(
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
    constexpr int WF = TX + 4;
    constexpr int HF = TY + 4;
    constexpr int WQ = TX + 2;
    constexpr int HQ = TY + 2;
    constexpr int CELLS_PER_THREAD = (TX * TY) / NT;
    static_assert((TX * TY) % NT == 0, "the tile must split evenly over the threads");
    __shared__ real su[HF * WF];
    __shared__ real sv[HF * WF];
    __shared__ real sh[HQ * WQ];
    __shared__ real s_uflux[HQ * WQ];
    __shared__ real s_vflux[HQ * WQ];
    __shared__ real s_q[HQ * WQ];
    __shared__ real s_b[HQ * WQ];
    __shared__ real s_lu[HQ * WQ];
    __shared__ real s_lv[HQ * WQ];

    const int jb = j0 + (int)blockIdx.y * TY;
    const int ib = i0 + (int)blockIdx.x * TX;
    const int tid = (int)(threadIdx.y * blockDim.x + threadIdx.x);
    const long long nx = n_columns;

    // 1. Stage the inputs; start the loads of base (read once, at the cell) early.
    real base_h_cell[CELLS_PER_THREAD], base_u_cell[CELLS_PER_THREAD], base_v_cell[CELLS_PER_THREAD];
    for (int m = 0; m < CELLS_PER_THREAD; ++m) {
        const int t = tid + m * NT;
        const int j = jb + t / TX, i = ib + t % TX;
        if (j < j1 && i < i1) {
            const long long k = (long long)j * nx + i;
            base_h_cell[m] = base_h[k];
            base_u_cell[m] = base_u[k];
            base_v_cell[m] = base_v[k];
        }
    }
    for (int t = tid; t < HF * WF; t += NT) {
        const int j = jb + t / WF - 2, i = ib + t % WF - 2;
        real u_value = (real)0, v_value = (real)0;
        if (j >= 0 && j < n_rows && i >= 0 && i < n_columns) {
            const long long k = (long long)j * nx + i;
            u_value = u[k];
            v_value = v[k];
        }
        su[t] = u_value;
        sv[t] = v_value;
    }
    for (int t = tid; t < HQ * WQ; t += NT) {
        const int j = jb + t / WQ - 1, i = ib + t % WQ - 1;
        real h_value = (real)1;
        if (j < n_rows && i < n_columns) {
            h_value = h[(long long)j * nx + i];
        }
        sh[t] = h_value;
    }
    __syncthreads();

    // 2. Every derived quantity once per point (the helpers of the simple kernel, on the tiles).
    const bool need_laplacian = viscosity != (real)0 || hyperviscosity != (real)0;
    for (int t = tid; t < HQ * WQ; t += NT) {
        const int r = t / WQ - 1, c = t % WQ - 1;
        const int q = t;                              // index in the WQ tiles
        const int f = (r + 2) * WF + (c + 2);         // index in the WF tiles
        if (r <= TY - 1 && c >= 0) {
            s_uflux[q] = (half * (sh[q - 1] + sh[q])) * su[f];
        }
        if (r >= 0 && c <= TX - 1) {
            s_vflux[q] = (half * (sh[q - WQ] + sh[q])) * sv[f];
        }
        if (r >= 0 && c >= 0) {
            const real zeta = (sv[f] - sv[f - 1]) * rdx - (su[f] - su[f - WF]) * rdy;
            const real h_corner = quarter * ((sh[q - WQ - 1] + sh[q - WQ]) + (sh[q - 1] + sh[q]));
            const int j = jb + r;
            const real coriolis = j < n_rows ? coriolis_rows[j] : (real)0;
            s_q[q] = (coriolis + zeta) / h_corner;
        }
        if (r <= TY - 1 && c <= TX - 1) {
            const real kinetic = quarter * ((su[f] * su[f] + su[f + 1] * su[f + 1])
                                            + (sv[f] * sv[f] + sv[f + WF] * sv[f + WF]));
            s_b[q] = gravity * sh[q] + kinetic;
        }
        if (need_laplacian) {
            s_lu[q] = tile_laplacian<real, WF>(su, f, rdx2, rdy2, two);
            s_lv[q] = tile_laplacian<real, WF>(sv, f, rdx2, rdy2, two);
        }
    }
    __syncthreads();

    // 3. The updates, in the order and with the parentheses of swe_stage_simple.
    for (int m = 0; m < CELLS_PER_THREAD; ++m) {
        const int t = tid + m * NT;
        const int r = t / TX, c = t % TX;
        const int j = jb + r, i = ib + c;
        if (j >= j1 || i >= i1) {
            continue;
        }
        const int q = (r + 1) * WQ + (c + 1);
        const real dh = -((s_uflux[q + 1] - s_uflux[q]) * rdx + (s_vflux[q + WQ] - s_vflux[q]) * rdy);
        const real v_flux_south = half * (s_vflux[q - 1] + s_vflux[q]);
        const real v_flux_north = half * (s_vflux[q + WQ - 1] + s_vflux[q + WQ]);
        const real u_flux_west = half * (s_uflux[q - WQ] + s_uflux[q]);
        const real u_flux_east = half * (s_uflux[q - WQ + 1] + s_uflux[q + 1]);
        const real q_here = s_q[q];
        const real bernoulli_here = s_b[q];
        real du = half * (q_here * v_flux_south + s_q[q + WQ] * v_flux_north) - (bernoulli_here - s_b[q - 1]) * rdx;
        real dv = -(half * (q_here * u_flux_west + s_q[q + 1] * u_flux_east)) - (bernoulli_here - s_b[q - WQ]) * rdy;
        if (viscosity != (real)0) {
            du = du + viscosity * s_lu[q];
            dv = dv + viscosity * s_lv[q];
        }
        if (hyperviscosity != (real)0) {
            du = du - hyperviscosity * tile_laplacian<real, WQ>(s_lu, q, rdx2, rdy2, two);
            dv = dv - hyperviscosity * tile_laplacian<real, WQ>(s_lv, q, rdx2, rdy2, two);
        }
        dv = dv * v_face_mask[j];

        const int f = (r + 2) * WF + (c + 2);
        const long long k = (long long)j * nx + i;
        out_h[k] = a * base_h_cell[m] + b * (sh[q] + dt * dh);
        out_u[k] = a * base_u_cell[m] + b * (su[f] + dt * du);
        out_v[k] = a * base_v_cell[m] + b * (sv[f] + dt * dv);
    }
}

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

TILES = ((32, 16, 256), (32, 8, 256), (64, 8, 256), (32, 32, 256))
"""The compiled tile shapes (TX, TY, threads per block) of the tiled kernel, for both dtypes.

(64, 8) and (32, 32) need more than the 48 KiB of static shared memory in fp64 and exist in fp32 only.
"""

MARCH_SHAPES = ((16, 1), (32, 1), (16, 2), (32, 2), (8, 2))
"""The compiled (rows marched, rows loaded ahead) of the warp-marching kernel (``("march", rows, ahead)``)."""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def _fits_static_shared_memory(dtype: np.dtype, tile: tuple[int, int, int]) -> bool:
    tx, ty, _ = tile
    return (2 * (tx + 4) * (ty + 4) + 7 * (tx + 2) * (ty + 2)) * dtype.itemsize <= 48 * 1024


def simple_name(dtype: np.dtype) -> str:
    return f"swe_stage_simple<{_REAL[dtype]}>"


def tiled_name(dtype: np.dtype, tile: tuple[int, int, int]) -> str:
    return "swe_stage_tiled<%s, %d, %d, %d>" % ((_REAL[dtype],) + tuple(tile))


def march_name(dtype: np.dtype, rows: int, ahead: int) -> str:
    return "swe_stage_march<%s, %d, %d>" % (_REAL[dtype], rows, ahead)


@functools.lru_cache(maxsize=None)
def kernel_choices(dtype) -> tuple:
    """Every kernel choice ``stage_gpu(..., tile=...)`` accepts for ``dtype``."""
    dtype = np.dtype(dtype)
    return (("simple",) + tuple(tile for tile in TILES if _fits_static_shared_memory(dtype, tile))
            + tuple(("march",) + shape for shape in MARCH_SHAPES))


def _all_names() -> tuple[str, ...]:
    names = []
    for dtype in _REAL:
        names.append(simple_name(dtype))
        names.extend(tiled_name(dtype, tile) for tile in TILES if _fits_static_shared_memory(dtype, tile))
        names.extend(march_name(dtype, *shape) for shape in MARCH_SHAPES)
    return tuple(names)


def cuda_source() -> str:
    """The CUDA C++ source of both kernels (for inspection and offline compilation)."""
    return STAGE_SOURCE


@functools.lru_cache(maxsize=None)
def stage_module() -> Any:
    """The compiled CuPy RawModule holding every kernel instantiation (built once per process)."""
    import cupy

    return cupy.RawModule(code=STAGE_SOURCE, options=("--fmad=false",), name_expressions=_all_names())


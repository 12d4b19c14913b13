"""CUDA source of the uniform-grid warp-marching kernels (the channel's default GPU kernels).

One body, templated on what a lane holds: one column (``swe_stage_march``, moved from the channel's
former ``stage_cuda`` module) or two adjacent ones (``swe_stage_march_pairs``: half the shuffles,
index arithmetic and load instructions per column, 60 of 64 columns written per warp instead of 28
of 32, and one 8-/16-byte load and store per lane and field where the pair is aligned: the fp32
default, where L2 traffic limits the kernel). The arithmetic is per column and in the same order,
so both give the same bits. Compiled together with the tiled
kernel by :func:`apps.stencil.swe_scheme.cuda_uniform.uniform_kernel` (``--fmad=false``) and
launched by :mod:`apps.stencil.swe_scheme.stage_gpu`, which describes it.
"""

from __future__ import annotations

import numpy as np

MARCH_SOURCE = r"""
// Warp-marching variant: each warp owns 32 adjacent lanes of W columns each (W = 1: one value per lane;
// W = 2, "pairs": two adjacent columns per lane, moved as one 8-byte value where aligned), of which
// all but the outer 2 columns on each side are written, and marches down ROWS rows of them. Every
// quantity of a row is computed once per column in registers; the x neighbours come from the same
// lane (pairs) or the adjacent lane (warp shuffles), the y neighbours from the registers of the
// previous rows. The outer columns only supply neighbours. No shared memory, no block barrier. Same
// expressions, order and parentheses as swe_stage_simple, per column.

// A lane's two adjacent columns (x: the western one). Arithmetic is per column, in the order written.
template <typename real>
struct Pair {
    real x, y;
    __device__ __forceinline__ Pair() {}
    __device__ __forceinline__ explicit Pair(real v) : x(v), y(v) {}
    __device__ __forceinline__ Pair(real a, real b) : x(a), y(b) {}
};
template <typename real> __device__ __forceinline__ Pair<real> operator+(Pair<real> a, Pair<real> b) { return Pair<real>(a.x + b.x, a.y + b.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator-(Pair<real> a, Pair<real> b) { return Pair<real>(a.x - b.x, a.y - b.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator*(Pair<real> a, Pair<real> b) { return Pair<real>(a.x * b.x, a.y * b.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator/(Pair<real> a, Pair<real> b) { return Pair<real>(a.x / b.x, a.y / b.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator-(Pair<real> a) { return Pair<real>(-a.x, -a.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator+(real a, Pair<real> b) { return Pair<real>(a + b.x, a + b.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator*(real a, Pair<real> b) { return Pair<real>(a * b.x, a * b.y); }
template <typename real> __device__ __forceinline__ Pair<real> operator*(Pair<real> a, real b) { return Pair<real>(a.x * b, a.y * b); }

// The value one column west / east of each column of the lane.
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
__device__ __forceinline__ Pair<real> from_west(Pair<real> p)
{
    return Pair<real>(__shfl_up_sync(0xffffffffu, p.y, 1), p.x);
}

template <typename real>
__device__ __forceinline__ Pair<real> from_east(Pair<real> p)
{
    return Pair<real>(p.y, __shfl_down_sync(0xffffffffu, p.x, 1));
}

template <typename real> struct Vector2;
template <> struct Vector2<float> { typedef float2 type; };
template <> struct Vector2<double> { typedef double2 type; };

// Where a lane reads: its first column clamped into the array (``column``), and which of its
// columns lie inside it. Computed once per thread; every load of the march reuses it.
struct LaneColumns {
    long long column;
    bool first_in, second_in;
};

// Row j of a at the lane's column(s), 0 outside the array.
template <typename real, bool ALIGNED>
__device__ __forceinline__ real load_or_zero(const real* __restrict__ a, int j, int n_rows, const LaneColumns& c, long long nx, real)
{
    return (c.first_in && j >= 0 && j < n_rows) ? a[(long long)j * nx + c.column] : (real)0;
}

template <typename real, bool ALIGNED>
__device__ __forceinline__ Pair<real> load_or_zero(const real* __restrict__ a, int j, int n_rows, const LaneColumns& c, long long nx, Pair<real>)
{
    if (j < 0 || j >= n_rows) {
        return Pair<real>((real)0);
    }
    const real* row = a + (long long)j * nx + c.column;
    if (ALIGNED && c.first_in && c.second_in) {
        const typename Vector2<real>::type value = *reinterpret_cast<const typename Vector2<real>::type*>(row);
        return Pair<real>(value.x, value.y);
    }
    return Pair<real>(c.first_in ? row[0] : (real)0, c.second_in ? row[1] : (real)0);
}

// Store the columns of the lane whose flag (first, second) is set; both columns of an aligned pair in
// one 8- or 16-byte store (one write request per warp and field instead of two half-filled ones).
template <typename real, bool ALIGNED>
__device__ __forceinline__ void store(real* out, long long k, real value, bool first, bool)
{
    if (first) {
        out[k] = value;
    }
}

template <typename real, bool ALIGNED>
__device__ __forceinline__ void store(real* out, long long k, Pair<real> value, bool first, bool second)
{
    if (ALIGNED && first && second) {
        typename Vector2<real>::type pair;
        pair.x = value.x;
        pair.y = value.y;
        *reinterpret_cast<typename Vector2<real>::type*>(out + k) = pair;
        return;
    }
    if (first) {
        out[k] = value.x;
    }
    if (second) {
        out[k + 1] = value.y;
    }
}

// SHARED_BASE: ``base`` is ``stage`` (the first SSP-RK3 stage, s1 = u0 + dt L(u0)): a cell's base value is
// the stage value the lane already holds for the row it updates, so base is not loaded at all (the
// same bits as loading it: the same memory). Half the loads (3 fields instead of 6) and fewer registers.
template <typename real, typename lane, int W, int ROWS, int AHEAD, bool ALIGNED, bool SHARED_BASE>
__device__ __forceinline__ void march_rows(
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
    constexpr int COLUMNS = 32 * W - 4;   // written per warp
    const int lane_index = (int)(threadIdx.x & 31);
    const int group = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
    const int i = i0 + group * COLUMNS + W * lane_index - 2;   // the lane's first column
    const int jb = j0 + (int)blockIdx.y * ROWS;
    const int je = min(jb + ROWS, j1);
    if (i0 + group * COLUMNS >= i1) {
        return;  // the whole warp leaves together
    }
    // Column c of the lane (position W * lane_index + c in the warp's window) is written if it is not
    // one of the two outer columns on either side and lies in the region.
    const bool writes = W * lane_index >= 2 && W * lane_index < 32 * W - 2 && i < i1;
    const bool writes_second = W == 2 && W * lane_index + 1 < 32 * W - 2 && W * lane_index + 1 >= 2 && i + 1 < i1;
    const long long nx = n_columns;
    // The first column clamped to 0 when it lies outside (lane 0 of the first warp with a region at
    // column 1); a lane's second column is then column + 1 = i + 1 (i = -1) or outside too.
    const LaneColumns columns{(i >= 0 && i < n_columns) ? (long long)i : (i + 1 == 0 ? -1LL : 0LL),
                              i >= 0 && i < n_columns, W == 2 && i + 1 >= 0 && i + 1 < n_columns};
    const bool laplacian_needed = viscosity != (real)0 || hyperviscosity != (real)0;
    const lane zero((real)0);

    // Prologue: the rows above jb.
    lane u_m2 = load_or_zero<real, ALIGNED>(u, jb - 2, n_rows, columns, nx, zero);
    lane u_m1 = load_or_zero<real, ALIGNED>(u, jb - 1, n_rows, columns, nx, zero);
    lane u_0 = load_or_zero<real, ALIGNED>(u, jb, n_rows, columns, nx, zero);
    lane u_p1 = load_or_zero<real, ALIGNED>(u, jb + 1, n_rows, columns, nx, zero);
    lane v_m2 = load_or_zero<real, ALIGNED>(v, jb - 2, n_rows, columns, nx, zero);
    lane v_m1 = load_or_zero<real, ALIGNED>(v, jb - 1, n_rows, columns, nx, zero);
    lane v_0 = load_or_zero<real, ALIGNED>(v, jb, n_rows, columns, nx, zero);
    lane v_p1 = load_or_zero<real, ALIGNED>(v, jb + 1, n_rows, columns, nx, zero);
    const lane h_m1 = load_or_zero<real, ALIGNED>(h, jb - 1, n_rows, columns, nx, zero);
    lane h_0 = load_or_zero<real, ALIGNED>(h, jb, n_rows, columns, nx, zero);
    // Row j + 2 of u, v and row j + 1 of h for the first step, and base at jb.
    lane u_p2 = load_or_zero<real, ALIGNED>(u, jb + 2, n_rows, columns, nx, zero);
    lane v_p2 = load_or_zero<real, ALIGNED>(v, jb + 2, n_rows, columns, nx, zero);
    lane h_p1 = load_or_zero<real, ALIGNED>(h, jb + 1, n_rows, columns, nx, zero);
    lane base_h_0 = SHARED_BASE ? zero : load_or_zero<real, ALIGNED>(base_h, jb, n_rows, columns, nx, zero);
    lane base_u_0 = SHARED_BASE ? zero : load_or_zero<real, ALIGNED>(base_u, jb, n_rows, columns, nx, zero);
    lane base_v_0 = SHARED_BASE ? zero : load_or_zero<real, ALIGNED>(base_v, jb, n_rows, columns, nx, zero);
    // The last rows the march uses, plus one: u and v to row je + 1, h to je, base to je - 1. Rows
    // loaded ahead past them (the next warp's rows, read by it out of phase with this one) are not
    // loaded: zero, never used.
    const int uv_rows = min(n_rows, je + 2), h_rows = min(n_rows, je + 1), base_rows = min(n_rows, je);
    // The rows loaded ahead (AHEAD steps in flight): at the top of step j, slot s < AHEAD - 1 holds
    // u, v at row j + 3 + s, h at row j + 2 + s and base at row j + 1 + s; each step loads the last slot.
    lane u_ahead[AHEAD], v_ahead[AHEAD], h_ahead[AHEAD], base_h_ahead[AHEAD], base_u_ahead[AHEAD], base_v_ahead[AHEAD];
#pragma unroll
    for (int slot = 0; slot < AHEAD - 1; ++slot) {
        u_ahead[slot] = load_or_zero<real, ALIGNED>(u, jb + 3 + slot, uv_rows, columns, nx, zero);
        v_ahead[slot] = load_or_zero<real, ALIGNED>(v, jb + 3 + slot, uv_rows, columns, nx, zero);
        h_ahead[slot] = load_or_zero<real, ALIGNED>(h, jb + 2 + slot, h_rows, columns, nx, zero);
        base_h_ahead[slot] = SHARED_BASE ? zero : load_or_zero<real, ALIGNED>(base_h, jb + 1 + slot, base_rows, columns, nx, zero);
        base_u_ahead[slot] = SHARED_BASE ? zero : load_or_zero<real, ALIGNED>(base_u, jb + 1 + slot, base_rows, columns, nx, zero);
        base_v_ahead[slot] = SHARED_BASE ? zero : load_or_zero<real, ALIGNED>(base_v, jb + 1 + slot, base_rows, columns, nx, zero);
    }

    const lane u_m1_west = from_west(u_m1), u_m1_east = from_east(u_m1);
    const lane v_m1_west = from_west(v_m1), v_m1_east = from_east(v_m1);
    lane u_0_west = from_west(u_0), u_0_east = from_east(u_0);
    lane v_0_west = from_west(v_0), v_0_east = from_east(v_0);
    lane lap_u_m1 = zero, lap_u_0 = zero, lap_v_m1 = zero, lap_v_0 = zero;
    if (laplacian_needed) {
        lap_u_m1 = ((u_m1_west + u_m1_east) - two * u_m1) * rdx2 + ((u_m2 + u_0) - two * u_m1) * rdy2;
        lap_u_0 = ((u_0_west + u_0_east) - two * u_0) * rdx2 + ((u_m1 + u_p1) - two * u_0) * rdy2;
        lap_v_m1 = ((v_m1_west + v_m1_east) - two * v_m1) * rdx2 + ((v_m2 + v_0) - two * v_m1) * rdy2;
        lap_v_0 = ((v_0_west + v_0_east) - two * v_0) * rdx2 + ((v_m1 + v_p1) - two * v_0) * rdy2;
    }
    const lane h_m1_west = from_west(h_m1);
    lane h_0_west = from_west(h_0);
    // U at row jb - 1 (own column and the east neighbour's).
    lane flux_u_m1 = (half * (h_m1_west + h_m1)) * u_m1;
    lane flux_u_m1_east = from_east(flux_u_m1);
    // V at row jb (own and west).
    lane flux_v_0 = (half * (h_m1 + h_0)) * v_0;
    lane flux_v_0_west = from_west(flux_v_0);
    // q at row jb (own and east).
    lane q_0;
    {
        const lane zeta = (v_0 - v_0_west) * rdx - (u_0 - u_m1) * rdy;
        const lane h_corner = quarter * ((h_m1_west + h_m1) + (h_0_west + h_0));
        q_0 = (coriolis_rows[jb] + zeta) / h_corner;
    }
    lane q_0_east = from_east(q_0);
    // B at row jb - 1.
    lane bernoulli_m1 = gravity * h_m1 + quarter * ((u_m1 * u_m1 + u_m1_east * u_m1_east) + (v_m1 * v_m1 + v_0 * v_0));

    for (int j = jb; j < je; ++j) {
        // Loads for AHEAD steps later first: their latency hides behind the arithmetic of the steps between.
        u_ahead[AHEAD - 1] = load_or_zero<real, ALIGNED>(u, j + 2 + AHEAD, uv_rows, columns, nx, zero);
        v_ahead[AHEAD - 1] = load_or_zero<real, ALIGNED>(v, j + 2 + AHEAD, uv_rows, columns, nx, zero);
        h_ahead[AHEAD - 1] = load_or_zero<real, ALIGNED>(h, j + 1 + AHEAD, h_rows, columns, nx, zero);
        if (!SHARED_BASE) {
            base_h_ahead[AHEAD - 1] = load_or_zero<real, ALIGNED>(base_h, j + AHEAD, base_rows, columns, nx, zero);
            base_u_ahead[AHEAD - 1] = load_or_zero<real, ALIGNED>(base_u, j + AHEAD, base_rows, columns, nx, zero);
            base_v_ahead[AHEAD - 1] = load_or_zero<real, ALIGNED>(base_v, j + AHEAD, base_rows, columns, nx, zero);
        }

        // Row j + 1: Laplacians, V, q; row j: U, B.
        const lane u_p1_west = from_west(u_p1), u_p1_east = from_east(u_p1);
        const lane v_p1_west = from_west(v_p1), v_p1_east = from_east(v_p1);
        const lane h_p1_west = from_west(h_p1);
        lane lap_u_p1 = zero, lap_v_p1 = zero;
        if (laplacian_needed) {
            lap_u_p1 = ((u_p1_west + u_p1_east) - two * u_p1) * rdx2 + ((u_0 + u_p2) - two * u_p1) * rdy2;
            lap_v_p1 = ((v_p1_west + v_p1_east) - two * v_p1) * rdx2 + ((v_0 + v_p2) - two * v_p1) * rdy2;
        }
        const lane flux_u_0 = (half * (h_0_west + h_0)) * u_0;
        const lane flux_u_0_east = from_east(flux_u_0);
        const lane flux_v_p1 = (half * (h_0 + h_p1)) * v_p1;
        const lane flux_v_p1_west = from_west(flux_v_p1);
        lane q_p1;
        {
            const lane zeta = (v_p1 - v_p1_west) * rdx - (u_p1 - u_0) * rdy;
            const lane h_corner = quarter * ((h_0_west + h_0) + (h_p1_west + h_p1));
            q_p1 = (coriolis_rows[j + 1] + zeta) / h_corner;
        }
        const lane q_p1_east = from_east(q_p1);
        const lane bernoulli_0 = gravity * h_0 + quarter * ((u_0 * u_0 + u_0_east * u_0_east) + (v_0 * v_0 + v_p1 * v_p1));
        const lane bernoulli_0_west = from_west(bernoulli_0);
        const lane lap_u_0_west = from_west(lap_u_0), lap_u_0_east = from_east(lap_u_0);
        const lane lap_v_0_west = from_west(lap_v_0), lap_v_0_east = from_east(lap_v_0);

        // The update of row j.
        const lane dh = -((flux_u_0_east - flux_u_0) * rdx + (flux_v_p1 - flux_v_0) * rdy);
        const lane v_flux_south = half * (flux_v_0_west + flux_v_0);
        const lane v_flux_north = half * (flux_v_p1_west + flux_v_p1);
        const lane u_flux_west = half * (flux_u_m1 + flux_u_0);
        const lane u_flux_east = half * (flux_u_m1_east + flux_u_0_east);
        lane du = half * (q_0 * v_flux_south + q_p1 * v_flux_north) - (bernoulli_0 - bernoulli_0_west) * rdx;
        lane dv = -(half * (q_0 * u_flux_west + q_0_east * u_flux_east)) - (bernoulli_0 - bernoulli_m1) * rdy;
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
        if (writes || writes_second) {
            const long long k = (long long)j * nx + i;
            store<real, ALIGNED>(out_h, k, a * (SHARED_BASE ? h_0 : base_h_0) + b * (h_0 + dt * dh), writes, writes_second);
            store<real, ALIGNED>(out_u, k, a * (SHARED_BASE ? u_0 : base_u_0) + b * (u_0 + dt * du), writes, writes_second);
            store<real, ALIGNED>(out_v, k, a * (SHARED_BASE ? v_0 : base_v_0) + b * (v_0 + dt * dv), writes, writes_second);
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

#define MARCH_ARGUMENTS \
    real* out_h, real* out_u, real* out_v, \
    const real* base_h, const real* base_u, const real* base_v, \
    const real* __restrict__ h, const real* __restrict__ u, const real* __restrict__ v, \
    const real* __restrict__ coriolis_rows, const real* __restrict__ v_face_mask, \
    const real a, const real b, const real dt, const real gravity, \
    const real rdx, const real rdy, const real rdx2, const real rdy2, \
    const real viscosity, const real hyperviscosity, \
    const real half, const real quarter, const real two, \
    const int j0, const int j1, const int i0, const int i1, const int n_columns, const int n_rows
#define MARCH_CALL out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask, a, b, dt, \
    gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two, j0, j1, i0, i1, n_columns, n_rows

// One column per lane (28 written per warp).
template <typename real, int ROWS, int AHEAD, bool SHARED_BASE>
__global__ void __launch_bounds__(128) swe_stage_march(MARCH_ARGUMENTS)
{
    march_rows<real, real, 1, ROWS, AHEAD, false, SHARED_BASE>(MARCH_CALL);
}

// Two columns per lane (60 written per warp); ALIGNED: 8- (fp32) or 16-byte (fp64) loads of a lane's pair,
// for an even row length and an even first column (the launcher checks).
// (No shared-base variant: for fp32 at 3600 x 1800 it was 1.8% slower per step, at 8192 x 4096 0.8% faster.)
template <typename real, int ROWS, int AHEAD, bool ALIGNED>
__global__ void __launch_bounds__(128) swe_stage_march_pairs(MARCH_ARGUMENTS)
{
    march_rows<real, Pair<real>, 2, ROWS, AHEAD, ALIGNED, false>(MARCH_CALL);
}

"""

MARCH_SHAPES = ((16, 1), (32, 1), (16, 2), (32, 2), (8, 2), (8, 1), (4, 2), (4, 1))
"""The compiled (rows marched, rows loaded ahead) of the warp-marching kernel (``("march", rows, ahead)``)."""

PAIR_SHAPES = ((16, 1), (32, 1), (16, 2), (8, 1), (4, 1))
"""The compiled (rows, ahead) of the two-columns-per-lane variant (``("pairs", rows, ahead)``)."""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def march_name(dtype: np.dtype, rows: int, ahead: int, shared_base: bool = False) -> str:
    """The name expression of the warp-marching kernel for ``dtype``, ``rows`` and ``ahead``
    (``shared_base``: the variant for a stage whose ``base`` is its ``stage``, which loads it once)."""
    return "swe_stage_march<%s, %d, %d, %s>" % (_REAL[np.dtype(dtype)], rows, ahead, _bool(shared_base))


def pairs_name(dtype: np.dtype, rows: int, ahead: int, aligned: bool) -> str:
    """The name expression of the two-columns-per-lane kernel (``aligned``: vector loads)."""
    return "swe_stage_march_pairs<%s, %d, %d, %s>" % (_REAL[np.dtype(dtype)], rows, ahead, _bool(aligned))

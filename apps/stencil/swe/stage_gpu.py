"""GPU (CuPy raw kernels) implementation of the fused SSP-RK3 stage; see :mod:`apps.stencil.swe.stage`.

Two kernels compute the same cells bit for bit:

``swe_stage_tiled`` (regions at least one tile wide and tall)
    One block owns a tile of ``TX x TY`` cells. It stages the tile's ``stage`` fields in shared
    memory (u and v with a two-cell rim for the biharmonic term, h with one), then computes every
    intermediate quantity *once* per point -- the mass fluxes U and V, the potential vorticity q,
    the Bernoulli function B and the Laplacians of u and v -- and finally the three updates of
    each cell from those. The one-thread-per-cell kernel below evaluates each of them 2-5 times per
    cell (q three times, with a division each; the Laplacian five times per field), so this one
    does about a third of the arithmetic and loads each input once from global memory.
``swe_stage_simple`` (thin regions: the rim strips of the overlapped schedule)
    One thread per cell, every quantity evaluated where it is needed.

Bytes: a stage must read ``stage`` and ``base`` (3 fields each) and write ``out`` (3 fields), 9
values per cell (6 in the first stage, where ``base`` is ``stage``); the tiled kernel's rim re-reads
(u, v: (TX + 4)(TY + 4) per TX TY cells) hit the L2 cache. See docs/performance.md.

Every quantity is the same expression, in the same order and with the same parentheses, as the
Numba helper of :mod:`apps.stencil.swe.stage_cpu`; computing one once and reusing it gives the same
bits as computing it again. The module is compiled with ``--fmad=false`` so NVRTC does not contract
``a*b + c`` into a fused multiply-add, which would round differently from the CPU; division is
IEEE-rounded (NVRTC's default ``-prec-div=true``). Hence fp64 and fp32 results equal the CPU's
bitwise.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

_STAGE_SOURCE = r"""
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
"""

SIMPLE_BLOCK = (32, 8, 1)
"""Block of the simple kernel: 32 threads along x (contiguous in memory, coalesced loads), 8 rows."""

TILES = ((32, 16, 256), (32, 8, 256), (64, 8, 256), (32, 32, 256))
"""The compiled tile shapes (TX, TY, threads per block) of the tiled kernel, for both dtypes.

(64, 8) and (32, 32) need more than the 48 KiB of static shared memory in fp64 and exist in fp32 only.
"""

DEFAULT_TILE = {np.dtype(np.float64): (32, 16, 256), np.dtype(np.float32): (32, 16, 256)}
"""The tile each dtype uses unless ``stage_gpu(..., tile=...)`` says otherwise (fastest measured)."""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def _fits_static_shared_memory(dtype: np.dtype, tile: tuple[int, int, int]) -> bool:
    tx, ty, _ = tile
    return (2 * (tx + 4) * (ty + 4) + 7 * (tx + 2) * (ty + 2)) * dtype.itemsize <= 48 * 1024


def _simple_name(dtype: np.dtype) -> str:
    return f"swe_stage_simple<{_REAL[dtype]}>"


def _tiled_name(dtype: np.dtype, tile: tuple[int, int, int]) -> str:
    return "swe_stage_tiled<%s, %d, %d, %d>" % ((_REAL[dtype],) + tuple(tile))


def _all_names() -> tuple[str, ...]:
    names = []
    for dtype in _REAL:
        names.append(_simple_name(dtype))
        names.extend(_tiled_name(dtype, tile) for tile in TILES if _fits_static_shared_memory(dtype, tile))
    return tuple(names)


def cuda_source() -> str:
    """The CUDA C++ source of both kernels (for inspection and offline compilation)."""
    return _STAGE_SOURCE


@functools.lru_cache(maxsize=None)
def _stage_module() -> Any:
    """The compiled CuPy RawModule holding every kernel instantiation (built once per process)."""
    import cupy

    return cupy.RawModule(code=_STAGE_SOURCE, options=("--fmad=false",), name_expressions=_all_names())


def stage_gpu(out, base, stage, coriolis_rows, v_face_mask, scalars, region, tile=None) -> None:
    """Launch the stage on the current CuPy stream; arguments as validated by ``swe_stage``.

    ``scalars`` is the tuple (a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity,
    half, quarter, two), already converted to the field dtype. ``tile`` is ``None`` (the dtype's
    :data:`DEFAULT_TILE`), one of :data:`TILES`, or ``"simple"`` (the one-thread-per-cell kernel).
    Regions narrower or shorter than the tile run the simple kernel. Returns None.
    """
    j0, j1, i0, i1 = region
    dtype = np.dtype(out[0].dtype)
    n_rows, n_columns = out[0].shape
    chosen = DEFAULT_TILE[dtype] if tile is None else tile
    if chosen != "simple" and (chosen not in TILES or not _fits_static_shared_memory(dtype, chosen)):
        raise ValueError(f"tile must be None, 'simple' or one of {TILES} that fits {dtype}; found {tile!r}")
    args = (
        *out, *base, *stage, coriolis_rows, v_face_mask, *scalars,
        np.int32(j0), np.int32(j1), np.int32(i0), np.int32(i1), np.int32(n_columns), np.int32(n_rows),
    )  # fmt: skip
    module = _stage_module()
    if chosen == "simple" or i1 - i0 < chosen[0] or j1 - j0 < chosen[1]:
        grid = (-(-(i1 - i0) // SIMPLE_BLOCK[0]), -(-(j1 - j0) // SIMPLE_BLOCK[1]), 1)
        module.get_function(_simple_name(dtype))(grid, SIMPLE_BLOCK, args)
        return
    tx, ty, threads = chosen
    grid = (-(-(i1 - i0) // tx), -(-(j1 - j0) // ty), 1)
    module.get_function(_tiled_name(dtype, chosen))(grid, (tx, threads // tx, 1), args)

"""CUDA source of the uniform-grid fast kernels (the channel's): the tiled one here, the warp-marching one
in :mod:`apps.stencil.swe_scheme.cuda_march`, compiled together into one module.

Moved unchanged from the channel's former ``stage_cuda`` module: the kernels compute the discrete
equations of :mod:`apps.stencil.swe_scheme.stage` for uniform metrics (unit factors, ``1/dx``,
``1/dy``, f per row, flat bottom), every intermediate quantity once per point, with the expressions,
order and parentheses of the one-thread-per-cell kernel of :mod:`apps.stencil.swe_scheme.cuda_device`
and of the Numba kernel, so all give the same bits. :mod:`apps.stencil.swe_scheme.stage_gpu`
launches them; the kernels are described there.

The module is compiled with ``--fmad=false`` so NVRTC does not contract ``a*b + c`` into a fused
multiply-add, which would round differently from the CPU; division is IEEE-rounded (NVRTC's default
``-prec-div=true``). Hence fp64 and fp32 results equal the CPU's bitwise.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from apps.stencil.swe_scheme.cuda_march import MARCH_SHAPES, MARCH_SOURCE, PAIR_SHAPES, march_name, pairs_name

TILED_SOURCE = r"""
// The Laplacian of cuda_device.py on a row-major tile in shared memory (row width W), at flat index k.
template <typename real, int W>
__device__ __forceinline__ real tile_laplacian(const real* a, int k, real rdx2, real rdy2, real two)
{
    return ((a[k - 1] + a[k + 1]) - two * a[k]) * rdx2 + ((a[k - W] + a[k + W]) - two * a[k]) * rdy2;
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

TILES = ((32, 16, 256), (32, 8, 256), (64, 8, 256), (32, 32, 256))
"""The compiled tile shapes (TX, TY, threads per block) of the tiled kernel, for both dtypes.

(64, 8) and (32, 32) need more than the 48 KiB of static shared memory in fp64 and exist in fp32 only.
"""

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def _fits_static_shared_memory(dtype: np.dtype, tile: tuple[int, int, int]) -> bool:
    tx, ty, _ = tile
    return (2 * (tx + 4) * (ty + 4) + 7 * (tx + 2) * (ty + 2)) * dtype.itemsize <= 48 * 1024


def tiled_name(dtype: np.dtype, tile: tuple[int, int, int]) -> str:
    """The name expression of the tiled kernel for ``dtype`` and ``tile`` (TX, TY, threads)."""
    return "swe_stage_tiled<%s, %d, %d, %d>" % ((_REAL[dtype],) + tuple(tile))


@functools.lru_cache(maxsize=None)
def kernel_choices(dtype) -> tuple:
    """Every kernel choice ``uniform_stage_gpu(..., tile=...)`` accepts for ``dtype``."""
    dtype = np.dtype(dtype)
    return (("simple",) + tuple(tile for tile in TILES if _fits_static_shared_memory(dtype, tile))
            + tuple(("march",) + shape for shape in MARCH_SHAPES) + tuple(("pairs",) + shape for shape in PAIR_SHAPES))


@functools.lru_cache(maxsize=None)
def _all_names() -> tuple[str, ...]:
    names = []
    for dtype in _REAL:
        names.extend(tiled_name(dtype, tile) for tile in TILES if _fits_static_shared_memory(dtype, tile))
        names.extend(march_name(dtype, *shape, shared_base) for shape in MARCH_SHAPES for shared_base in (False, True))
        names.extend(pairs_name(dtype, *shape, aligned) for shape in PAIR_SHAPES for aligned in (True, False))
    return tuple(names)


def cuda_source() -> str:
    """The CUDA C++ source of the tiled and marching kernels (for inspection and offline compilation)."""
    return TILED_SOURCE + MARCH_SOURCE


@functools.lru_cache(maxsize=None)
def uniform_kernel(name: str) -> Any:
    """The compiled kernel ``name`` (a name expression of :func:`_all_names`), built on first use.

    One instantiation per NVRTC compilation: a run compiles the one or two kernels it launches, not
    the ~45 instantiations of every shape and dtype (tens of seconds on a machine whose CuPy kernel
    cache is empty). Compiled with ``--fmad=false``."""
    import cupy

    if name not in _all_names():
        raise ValueError(f"unknown uniform-grid kernel {name!r}")
    module = cupy.RawModule(code=cuda_source(), options=("--fmad=false",), name_expressions=(name,))
    return module.get_function(name)

"""GPU (CuPy raw kernel) implementation of the fused SSP-RK3 stage; see :mod:`apps.stencil.swe.stage`.

One thread updates one cell (h, u and v of padded index (j, i)). The device functions are the same
expressions, in the same order and with the same parentheses, as the Numba helpers of
:mod:`apps.stencil.swe.stage_cpu`; the module is compiled with ``--fmad=false`` so NVRTC does not
contract ``a*b + c`` into a fused multiply-add, which would round differently from the CPU. Double
division is IEEE-rounded by default in CUDA, so fp64 results match the CPU to the last bit or close.

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
__global__ void swe_stage(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* h, const real* u, const real* v,
    const real* coriolis_rows, const real* v_face_mask,
    const real a, const real b, const real dt, const real gravity,
    const real rdx, const real rdy, const real rdx2, const real rdy2,
    const real viscosity, const real hyperviscosity,
    const real half, const real quarter, const real two,
    const int j0, const int j1, const int i0, const int i1, const int n_columns)
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
"""

_KERNEL_NAMES = {np.dtype(np.float64): "swe_stage<double>", np.dtype(np.float32): "swe_stage<float>"}

# 32 threads along x (contiguous in memory, coalesced loads), 8 rows per block.
_BLOCK = (32, 8, 1)


@functools.lru_cache(maxsize=None)
def _stage_module() -> Any:
    """The compiled CuPy RawModule holding swe_stage<double> and swe_stage<float> (built once)."""
    import cupy

    return cupy.RawModule(
        code=_STAGE_SOURCE,
        options=("--fmad=false",),
        name_expressions=tuple(_KERNEL_NAMES.values()),
    )


def stage_gpu(out, base, stage, coriolis_rows, v_face_mask, scalars, region) -> None:
    """Launch the stage kernel on the current CuPy stream; arguments as validated by ``swe_stage``.

    ``scalars`` is the tuple (a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity,
    half, quarter, two), already converted to the field dtype.
    """
    j0, j1, i0, i1 = region
    dtype = out[0].dtype
    kernel = _stage_module().get_function(_KERNEL_NAMES[np.dtype(dtype)])
    n_columns = out[0].shape[1]
    grid = ((i1 - i0 + _BLOCK[0] - 1) // _BLOCK[0], (j1 - j0 + _BLOCK[1] - 1) // _BLOCK[1], 1)
    args = (
        *out, *base, *stage, coriolis_rows, v_face_mask, *scalars,
        np.int32(j0), np.int32(j1), np.int32(i0), np.int32(i1), np.int32(n_columns),
    )  # fmt: skip
    kernel(grid, _BLOCK, args)

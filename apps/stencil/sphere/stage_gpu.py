"""GPU (CuPy raw kernel) implementation of the fused SSP-RK3 stage on the sphere.

See :mod:`apps.stencil.sphere.stage` for the scheme. One thread updates one cell (h, u and v of the
padded index (j, i)). The device functions are the Numba helpers of
:mod:`apps.stencil.sphere.stage_cpu` written in CUDA with the same parentheses and the same order;
the module is compiled with ``--fmad=false`` so NVRTC does not contract ``a*b + c`` into fused
multiply-adds (which round differently from the CPU), and fp64 division is IEEE-rounded, so fp64
results agree with the CPU to the last bit or close to it.

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
__device__ __forceinline__ real v_flux(const real* h, const real* v, const real* cos_face, long long nx,
    int j, int i, real half)
{
    const long long k = (long long)j * nx + i;
    return ((half * (h[k - nx] + h[k])) * v[k]) * cos_face[j];
}

template <typename real>
__device__ __forceinline__ real potential_vorticity(const real* h, const real* u, const real* v,
    const real* cos_center, const real* rdx_face, const real* rdy_face, const real* coriolis,
    long long nx, int j, int i, real quarter)
{
    const long long k = (long long)j * nx + i;
    const real zeta = (v[k] - v[k - 1]) * rdx_face[j] - (u[k] * cos_center[j] - u[k - nx] * cos_center[j - 1]) * rdy_face[j];
    const real h_corner = quarter * ((h[k - nx - 1] + h[k - nx]) + (h[k - 1] + h[k]));
    return (coriolis[k] + zeta) / h_corner;
}

template <typename real>
__device__ __forceinline__ real bernoulli(const real* h, const real* u, const real* v, const real* topography,
    const real* cos_face, const real* rcos_center, long long nx, int j, int i, real gravity, real quarter)
{
    const long long k = (long long)j * nx + i;
    const real kinetic = quarter * (
        (u[k] * u[k] + u[k + 1] * u[k + 1])
        + ((v[k] * v[k]) * cos_face[j] + (v[k + nx] * v[k + nx]) * cos_face[j + 1]) * rcos_center[j]);
    return gravity * (h[k] + topography[k]) + kinetic;
}

template <typename real>
__global__ void sphere_stage(
    real* out_h, real* out_u, real* out_v,
    const real* base_h, const real* base_u, const real* base_v,
    const real* h, const real* u, const real* v,
    real* inc_h, real* inc_u, real* inc_v,
    const real* cos_center, const real* rcos_center, const real* rdx_center, const real* rdy_center,
    const real* cos_face, const real* rdx_face, const real* rdy_face, const real* v_face_mask,
    const signed char* filtered_rows, const real* coriolis, const real* topography,
    const real a, const real b, const real dt, const real gravity, const real rdy,
    const real half, const real quarter,
    const int j0, const int j1, const int i0, const int i1, const int n_columns)
{
    const int i = i0 + (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int j = j0 + (int)(blockIdx.y * blockDim.y + threadIdx.y);
    if (i >= i1 || j >= j1) {
        return;
    }
    const long long nx = n_columns;
    const long long k = (long long)j * nx + i;

    const real dh = -((u_flux(h, u, nx, j, i + 1, half) - u_flux(h, u, nx, j, i, half)) * rdx_center[j]
                      + (v_flux(h, v, cos_face, nx, j + 1, i, half) - v_flux(h, v, cos_face, nx, j, i, half)) * rdy_center[j]);

    const real q_here = potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, nx, j, i, quarter);
    const real q_north = potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, nx, j + 1, i, quarter);
    const real q_east = potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, nx, j, i + 1, quarter);
    const real v_flux_south = half * (v_flux(h, v, cos_face, nx, j, i - 1, half) + v_flux(h, v, cos_face, nx, j, i, half));
    const real v_flux_north = half * (v_flux(h, v, cos_face, nx, j + 1, i - 1, half) + v_flux(h, v, cos_face, nx, j + 1, i, half));
    const real u_flux_west = half * (u_flux(h, u, nx, j - 1, i, half) + u_flux(h, u, nx, j, i, half));
    const real u_flux_east = half * (u_flux(h, u, nx, j - 1, i + 1, half) + u_flux(h, u, nx, j, i + 1, half));

    const real bernoulli_here = bernoulli(h, u, v, topography, cos_face, rcos_center, nx, j, i, gravity, quarter);
    const real bernoulli_west = bernoulli(h, u, v, topography, cos_face, rcos_center, nx, j, i - 1, gravity, quarter);
    const real bernoulli_south = bernoulli(h, u, v, topography, cos_face, rcos_center, nx, j - 1, i, gravity, quarter);
    const real du = (half * (q_here * v_flux_south + q_north * v_flux_north)) * rcos_center[j]
                    - (bernoulli_here - bernoulli_west) * rdx_center[j];
    real dv = -(half * (q_here * u_flux_west + q_east * u_flux_east)) - (bernoulli_here - bernoulli_south) * rdy;
    // Pole faces never move: v = 0 stays exactly 0.
    dv = dv * v_face_mask[j];

    if (filtered_rows[j] != 0) {
        // Polar row: the polar filter combines the filtered increment later.
        inc_h[k] = dt * dh;
        inc_u[k] = dt * du;
        inc_v[k] = dt * dv;
    } else {
        out_h[k] = a * base_h[k] + b * (h[k] + dt * dh);
        out_u[k] = a * base_u[k] + b * (u[k] + dt * du);
        out_v[k] = a * base_v[k] + b * (v[k] + dt * dv);
    }
}

"""

_STAGE_NAMES = {np.dtype(np.float64): "sphere_stage<double>", np.dtype(np.float32): "sphere_stage<float>"}

# 32 threads along longitude (contiguous in memory, coalesced loads), 8 rows per block.
_BLOCK = (32, 8, 1)


@functools.lru_cache(maxsize=None)
def _module() -> Any:
    """The compiled CuPy RawModule holding the stage kernel for float64 and float32 (built once)."""
    import cupy

    return cupy.RawModule(
        code=_STAGE_SOURCE,
        options=("--fmad=false",),
        name_expressions=tuple(_STAGE_NAMES.values()),
    )


def _grid(n_columns: int, n_rows: int) -> tuple[int, int, int]:
    return ((n_columns + _BLOCK[0] - 1) // _BLOCK[0], (n_rows + _BLOCK[1] - 1) // _BLOCK[1], 1)


def stage_gpu(*args) -> None:
    """Launch the stage kernel on the current CuPy stream; ``args`` as for ``stage_cpu``.

    The order is (out x3, base x3, stage x3, increment x3, the 8 row arrays, filtered_rows,
    coriolis, topography, a, b, dt, gravity, rdy, half, quarter, j0, j1, i0, i1), scalars already in
    the field dtype and arrays validated by :func:`apps.stencil.sphere.stage.sphere_stage`.
    """
    j0, j1, i0, i1 = (int(x) for x in args[-4:])
    arrays_and_scalars = args[:-4]
    out_h = args[0]
    kernel = _module().get_function(_STAGE_NAMES[np.dtype(out_h.dtype)])
    n_columns = out_h.shape[1]
    kernel(_grid(i1 - i0, j1 - j0), _BLOCK,
           (*arrays_and_scalars, np.int32(j0), np.int32(j1), np.int32(i0), np.int32(i1), np.int32(n_columns)))


__all__ = ["stage_gpu"]

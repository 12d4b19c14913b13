"""CUDA source of the discrete equations, written once for both grids, and the one-thread-per-cell kernels.

The device functions are templated on a *metric policy*, a small struct that answers the metric
factors of :mod:`apps.stencil.swe_scheme.metrics` at a row or point:

``UniformGrid`` (the channel)
    Unit factors, ``rdx``/``rdy`` as scalars, f per row, a flat bottom: it reads no metric array,
    only ``coriolis_rows``. ``x * 1`` folds away; ``h + 0`` stays an exact add.
``RowMetrics`` (the lat-lon grid)
    The per-row arrays, f per corner and the topography per cell.

Each device function is the Numba helper of :mod:`apps.stencil.swe_scheme.stage_cpu` with the
same parentheses and order; :func:`tendencies` is the loop body of its ``_update_row``. Two kernels
instantiate them: ``uniform_grid_stage`` (the channel's argument list: the fast kernels' fallback
for thin regions) and ``row_metrics_stage`` (the lat-lon grid's, with the filtered rows). The
module is compiled with ``--fmad=false`` so NVRTC does not contract ``a*b + c`` into fused
multiply-adds; division is IEEE-rounded; so fp64 and fp32 results equal the CPU's bitwise.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

DEVICE_SOURCE = r"""
// ---------------------------------------------------------------- metric policies
template <typename real>
struct UniformGrid {
    const real* coriolis_rows;
    real rdx, rdy;
    __device__ __forceinline__ real cos_center(int) const { return (real)1; }
    __device__ __forceinline__ real rcos_center(int) const { return (real)1; }
    __device__ __forceinline__ real rdx_center(int) const { return rdx; }
    __device__ __forceinline__ real rdy_center(int) const { return rdy; }
    __device__ __forceinline__ real cos_face(int) const { return (real)1; }
    __device__ __forceinline__ real rdx_face(int) const { return rdx; }
    __device__ __forceinline__ real rdy_face(int) const { return rdy; }
    __device__ __forceinline__ real coriolis(int j, long long) const { return coriolis_rows[j]; }
    __device__ __forceinline__ real topography(long long) const { return (real)0; }
};

template <typename real>
struct RowMetrics {
    const real* cos_center_;
    const real* rcos_center_;
    const real* rdx_center_;
    const real* rdy_center_;
    const real* cos_face_;
    const real* rdx_face_;
    const real* rdy_face_;
    const real* coriolis_;
    const real* topography_;
    __device__ __forceinline__ real cos_center(int j) const { return cos_center_[j]; }
    __device__ __forceinline__ real rcos_center(int j) const { return rcos_center_[j]; }
    __device__ __forceinline__ real rdx_center(int j) const { return rdx_center_[j]; }
    __device__ __forceinline__ real rdy_center(int j) const { return rdy_center_[j]; }
    __device__ __forceinline__ real cos_face(int j) const { return cos_face_[j]; }
    __device__ __forceinline__ real rdx_face(int j) const { return rdx_face_[j]; }
    __device__ __forceinline__ real rdy_face(int j) const { return rdy_face_[j]; }
    __device__ __forceinline__ real coriolis(int, long long k) const { return coriolis_[k]; }
    __device__ __forceinline__ real topography(long long k) const { return topography_[k]; }
};

// ---------------------------------------------------------------- discrete quantities
template <typename real>
__device__ __forceinline__ real u_flux(const real* h, const real* u, long long nx, int j, int i, real half)
{
    const long long k = (long long)j * nx + i;
    return (half * (h[k - 1] + h[k])) * u[k];
}

template <typename real, typename Grid>
__device__ __forceinline__ real v_flux(const Grid& grid, const real* h, const real* v, long long nx, int j, int i,
    real half)
{
    const long long k = (long long)j * nx + i;
    return ((half * (h[k - nx] + h[k])) * v[k]) * grid.cos_face(j);
}

template <typename real, typename Grid>
__device__ __forceinline__ real potential_vorticity(const Grid& grid, const real* h, const real* u, const real* v,
    long long nx, int j, int i, real quarter)
{
    const long long k = (long long)j * nx + i;
    const real zeta = (v[k] - v[k - 1]) * grid.rdx_face(j)
                      - (u[k] * grid.cos_center(j) - u[k - nx] * grid.cos_center(j - 1)) * grid.rdy_face(j);
    const real h_corner = quarter * ((h[k - nx - 1] + h[k - nx]) + (h[k - 1] + h[k]));
    return (grid.coriolis(j, k) + zeta) / h_corner;
}

template <typename real, typename Grid>
__device__ __forceinline__ real bernoulli(const Grid& grid, const real* h, const real* u, const real* v,
    long long nx, int j, int i, real gravity, real quarter)
{
    const long long k = (long long)j * nx + i;
    const real kinetic = quarter * (
        (u[k] * u[k] + u[k + 1] * u[k + 1])
        + ((v[k] * v[k]) * grid.cos_face(j) + (v[k + nx] * v[k + nx]) * grid.cos_face(j + 1)) * grid.rcos_center(j));
    return gravity * (h[k] + grid.topography(k)) + kinetic;
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

// dh/dt, du/dt, dv/dt at cell (j, i): the loop body of stage_cpu._update_row.
template <typename real, typename Grid>
__device__ __forceinline__ void tendencies(const Grid& grid, const real* h, const real* u, const real* v,
    const real* v_face_mask, long long nx, int j, int i, real gravity, real rdy, real rdx2, real rdy2,
    real viscosity, real hyperviscosity, real half, real quarter, real two, real& dh, real& du, real& dv)
{
    dh = -((u_flux(h, u, nx, j, i + 1, half) - u_flux(h, u, nx, j, i, half)) * grid.rdx_center(j)
           + (v_flux(grid, h, v, nx, j + 1, i, half) - v_flux(grid, h, v, nx, j, i, half)) * grid.rdy_center(j));

    const real q_here = potential_vorticity(grid, h, u, v, nx, j, i, quarter);
    const real q_north = potential_vorticity(grid, h, u, v, nx, j + 1, i, quarter);
    const real q_east = potential_vorticity(grid, h, u, v, nx, j, i + 1, quarter);
    const real v_flux_south = half * (v_flux(grid, h, v, nx, j, i - 1, half) + v_flux(grid, h, v, nx, j, i, half));
    const real v_flux_north = half * (v_flux(grid, h, v, nx, j + 1, i - 1, half) + v_flux(grid, h, v, nx, j + 1, i, half));
    const real u_flux_west = half * (u_flux(h, u, nx, j - 1, i, half) + u_flux(h, u, nx, j, i, half));
    const real u_flux_east = half * (u_flux(h, u, nx, j - 1, i + 1, half) + u_flux(h, u, nx, j, i + 1, half));

    const real bernoulli_here = bernoulli(grid, h, u, v, nx, j, i, gravity, quarter);
    const real bernoulli_west = bernoulli(grid, h, u, v, nx, j, i - 1, gravity, quarter);
    const real bernoulli_south = bernoulli(grid, h, u, v, nx, j - 1, i, gravity, quarter);
    du = (half * (q_here * v_flux_south + q_north * v_flux_north)) * grid.rcos_center(j)
         - (bernoulli_here - bernoulli_west) * grid.rdx_center(j);
    dv = -(half * (q_here * u_flux_west + q_east * u_flux_east)) - (bernoulli_here - bernoulli_south) * rdy;

    if (viscosity != (real)0) {
        du = du + viscosity * laplacian(u, nx, j, i, rdx2, rdy2, two);
        dv = dv + viscosity * laplacian(v, nx, j, i, rdx2, rdy2, two);
    }
    if (hyperviscosity != (real)0) {
        du = du - hyperviscosity * bilaplacian(u, nx, j, i, rdx2, rdy2, two);
        dv = dv - hyperviscosity * bilaplacian(v, nx, j, i, rdx2, rdy2, two);
    }
    // Wall / pole faces (and anything beyond) never move: v = 0 stays exactly 0.
    dv = dv * v_face_mask[j];
}

// ---------------------------------------------------------------- kernels (one thread per cell)
template <typename real>
__global__ void uniform_grid_stage(
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
    const UniformGrid<real> grid{coriolis_rows, rdx, rdy};
    real dh, du, dv;
    tendencies(grid, h, u, v, v_face_mask, nx, j, i, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity,
               half, quarter, two, dh, du, dv);
    out_h[k] = a * base_h[k] + b * (h[k] + dt * dh);
    out_u[k] = a * base_u[k] + b * (u[k] + dt * du);
    out_v[k] = a * base_v[k] + b * (v[k] + dt * dv);
}

template <typename real>
__global__ void row_metrics_stage(
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
    const RowMetrics<real> grid{cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face,
                                coriolis, topography};
    real dh, du, dv;
    // No (hyper)viscosity on this grid: its coefficients are exact zeros.
    tendencies(grid, h, u, v, v_face_mask, nx, j, i, gravity, rdy, (real)0, (real)0, (real)0, (real)0,
               half, quarter, (real)2, dh, du, dv);
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

_REAL = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}


def uniform_name(dtype: Any) -> str:
    """The name expression of the uniform-grid one-thread-per-cell kernel for ``dtype``."""
    return f"uniform_grid_stage<{_REAL[np.dtype(dtype)]}>"


def row_metrics_name(dtype: Any) -> str:
    """The name expression of the per-row-metrics (lat-lon) kernel for ``dtype``."""
    return f"row_metrics_stage<{_REAL[np.dtype(dtype)]}>"


def cuda_source() -> str:
    """The CUDA C++ source of the device functions and both kernels (for inspection and offline compilation)."""
    return DEVICE_SOURCE


@functools.lru_cache(maxsize=None)
def device_module() -> Any:
    """The compiled CuPy RawModule holding both kernels for float64 and float32 (built once per process)."""
    import cupy

    names = tuple(name_fn(dtype) for dtype in _REAL for name_fn in (uniform_name, row_metrics_name))
    return cupy.RawModule(code=DEVICE_SOURCE, options=("--fmad=false",), name_expressions=names)

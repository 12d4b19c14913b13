"""The lat-lon diagnostics on a GPU: one fused kernel, three CuPy sums, one host synchronisation.

:func:`local_diagnostics_gpu` gives the values of
:func:`apps.stencil.sphere.diagnostics.local_diagnostics` for CuPy arrays, bit for bit those of the
generic expressions (``_local_diagnostics_arrays``) evaluated with CuPy:

1. the kernel ``diagnostic_terms`` (one thread per owned cell) writes the three per-cell terms into
   one float64 buffer, with the generic code's operations in its order and association (inputs
   cast to double first, as ``xp.asarray(a, dtype=float64)`` does; compiled with ``--fmad=false``,
   so no multiply-add is contracted, as in CuPy's one-operation-per-kernel evaluation);
2. ``cupy.sum`` of each term's C-contiguous ``(n_rows, n_columns)`` block: the reduction CuPy
   applies to the generic code's temporaries (CUB's device reduce by default). Each block starts on
   a 512-byte boundary, like a fresh CuPy allocation, so that CUB takes the same (alignment-dependent)
   load path and gives the same bits;
3. one ``.get()`` of the three sums.

``x ** 2`` with a Python int 2: CuPy >= 14.2 evaluates it as ``cupy.square`` (``in0 * in0``; the
fast path of ``ndarray.__pow__``, cupy/cupy#10111, backported to 14.2), earlier CuPy as the
``power`` ufunc (``pow(in0, 2.0)``). The kernel does the same for the CuPy it runs under
(:func:`_square_by_pow`). (With ``pow``, the bits are those of CuPy's kernel only if libdevice's
``pow`` rounds alike under ``--fmad=false`` and CuPy's default ``--fmad=true``; the tests run
CuPy 14.2, which multiplies.)

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from apps.stencil.sphere.parameters import SphereTile

_SOURCE = r"""
// The per-cell terms of mass, energy and potential enstrophy of the owned cell (r, c) of one tile,
// in float64, with the operations of apps/stencil/sphere/diagnostics.py in their order:
//   terms[0][r][c] = area_j * depth
//   terms[1][r][c] = area_j * (depth * kinetic + half_g * ((depth + hs) ** 2 - hs * hs))
//   terms[2][r][c] = corner_area_j * 0.5 * h_corner * q * q
// with (j, i) = (w + r, w + c) the padded cell, area_j = area_scale * cos_center[j] and
// corner_area_j = area_scale * cos_face[j]. terms has shape (3, block_stride); term k of cell (r, c)
// is terms[k * block_stride + r * n_columns + c]. Fields have row pitch field_pitch, the tile's
// coriolis and topography tile_pitch (elements).
template <typename field_t, typename metric_t>
__global__ void diagnostic_terms(
    double* terms, const field_t* h, const field_t* u, const field_t* v,
    const metric_t* cos_center, const metric_t* rcos_center, const metric_t* cos_face,
    const metric_t* rdx_face, const metric_t* rdy_face, const metric_t* coriolis, const metric_t* topography,
    const double area_scale, const double half_g, const int square_by_pow,
    const int n_rows, const int n_columns, const int w, const int field_pitch, const int tile_pitch,
    const long long block_stride)
{
    const long long cell = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (cell >= (long long)n_rows * n_columns) {
        return;
    }
    const int r = (int)(cell / n_columns);
    const int c = (int)(cell - (long long)r * n_columns);
    const long long j = w + r;
    const long long i = w + c;
    const long long k = j * field_pitch + i;          // (j, i)
    const long long k_east = k + 1;                    // (j, i + 1)
    const long long k_west = k - 1;                    // (j, i - 1)
    const long long k_north = k + field_pitch;         // (j + 1, i)
    const long long k_south = k - field_pitch;         // (j - 1, i)
    const long long k_south_west = k_south - 1;        // (j - 1, i - 1)

    const double cos_j = (double)cos_center[j];
    const double cos_south = (double)cos_center[j - 1];
    const double cos_face_j = (double)cos_face[j];
    const double cos_face_north = (double)cos_face[j + 1];
    const double rcos_j = (double)rcos_center[j];

    // mass: area * depth, area = (a^2 dlon dlat) * cos
    const double area = area_scale * cos_j;
    const double depth = (double)h[k];
    terms[cell] = area * depth;

    // energy: u2, v2 = u64 * u64, v64 * v64
    const double u_here = (double)u[k];
    const double u_east = (double)u[k_east];
    const double v_here = (double)v[k];
    const double v_north = (double)v[k_north];
    const double kinetic = 0.25 * ((u_here * u_here + u_east * u_east)
                                   + (v_here * v_here * cos_face_j + v_north * v_north * cos_face_north) * rcos_j);
    const double hs = (double)topography[j * tile_pitch + i];
    const double total = depth + hs;
    const double total_squared = square_by_pow ? pow(total, 2.0) : total * total;
    terms[block_stride + cell] = area * (depth * kinetic + half_g * (total_squared - hs * hs));

    // potential enstrophy at the south-west corner (j, i)
    const double zeta = (v_here - (double)v[k_west]) * (double)rdx_face[j]
                        - (u_here * cos_j - (double)u[k_south] * cos_south) * (double)rdy_face[j];
    const double h_corner = 0.25 * (((double)h[k_south_west] + (double)h[k_south]) + ((double)h[k_west] + depth));
    const double q = ((double)coriolis[j * tile_pitch + i] + zeta) / h_corner;
    const double corner_area = area_scale * cos_face_j;
    terms[2 * block_stride + cell] = corner_area * 0.5 * h_corner * q * q;
}
"""

_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float"}
_THREADS = 256
_ALIGNMENT = 64
"""Each term's block starts a multiple of this many float64 (512 bytes) into the buffer: the
alignment of a CuPy memory-pool allocation."""


def _kernel_name(field_dtype: np.dtype, metric_dtype: np.dtype) -> str:
    return f"diagnostic_terms<{_TYPES[field_dtype]}, {_TYPES[metric_dtype]}>"


@functools.lru_cache(maxsize=None)
def _module() -> Any:
    """The compiled CuPy RawModule of ``diagnostic_terms`` for float32/float64 fields and metrics (built once)."""
    import cupy

    names = tuple(_kernel_name(field, metric) for field in _TYPES for metric in _TYPES)
    return cupy.RawModule(code=_SOURCE, options=("--fmad=false",), name_expressions=names)


@functools.lru_cache(maxsize=None)
def _square_by_pow() -> bool:
    """True where CuPy evaluates ``array ** 2`` with ``pow(x, 2.0)`` (CuPy < 14.2), False where it
    calls ``cupy.square`` (``x * x``, CuPy >= 14.2)."""
    import cupy

    major, minor = (int("".join(ch for ch in part if ch.isdigit()) or 0) for part in cupy.__version__.split(".")[:2])
    return (major, minor) < (14, 2)


def local_diagnostics_gpu(h: Any, u: Any, v: Any, params: SphereTile) -> dict:
    """Local sums of mass (m^3), energy (m^5/s^2) and potential enstrophy (1/(m s^2)) of one tile on the GPU.

    The values of ``apps.stencil.sphere.diagnostics.local_diagnostics`` (see that module for the
    formulas), bitwise those of its generic expressions on CuPy arrays (module docstring).

    Parameters
    ----------
    h, u, v : cupy arrays, float32 or float64, shape (n_rows + 2w, n_columns + 2w) (or larger)
        Depth in m and velocities in m/s on the padded tile, ghosts filled; one shape for all three.
    params : SphereTile
        The tile, its arrays CuPy arrays on the fields' device (float32 or float64).

    Returns
    -------
    dict
        ``{"mass", "energy", "potential_enstrophy"}``, Python floats. Synchronises the current stream
        with the host once (the copy of the three sums).
    """
    import cupy

    w, n_rows, n_columns = params.halo_width, params.n_rows, params.n_columns
    if not (h.shape == u.shape == v.shape and h.ndim == 2):
        raise ValueError(f"h, u and v must be 2-D arrays of one shape; found {h.shape}, {u.shape}, {v.shape}.")
    coriolis, topography = params.coriolis, params.topography
    padded = (n_rows + 2 * w, n_columns + 2 * w)
    for name, shape in (("the fields", h.shape), ("coriolis", coriolis.shape), ("topography", topography.shape)):
        if len(shape) != 2 or shape[0] < padded[0] or shape[1] < padded[1]:
            raise ValueError(f"{name} have shape {shape}; the tile needs at least its padded shape {padded} "
                             f"(n_rows + 2w, n_columns + 2w): build the fields with the tile's halo_width={w}.")
    if coriolis.shape != topography.shape:
        raise ValueError(f"coriolis {coriolis.shape} and topography {topography.shape} must have one shape.")
    fields = (h, u, v)
    metrics = (params.cos_center, params.rcos_center, params.cos_face, params.rdx_face, params.rdy_face,
               coriolis, topography)  # fmt: skip
    field_dtype, metric_dtype = np.dtype(h.dtype), np.dtype(params.cos_center.dtype)
    if (field_dtype not in _TYPES or metric_dtype not in _TYPES or any(a.dtype != field_dtype for a in fields)
            or any(a.dtype != metric_dtype for a in metrics)):
        raise TypeError(f"the device diagnostics take h, u, v of one dtype and tile arrays of one dtype, float32 or "
                        f"float64; found {[str(a.dtype) for a in fields]} and {[str(a.dtype) for a in metrics]}.")
    fields = [cupy.ascontiguousarray(a) for a in fields]
    metrics = [cupy.ascontiguousarray(a) for a in metrics]
    n_cells = n_rows * n_columns
    block_stride = -(-n_cells // _ALIGNMENT) * _ALIGNMENT
    terms = cupy.empty((3, block_stride), dtype=np.float64)
    if n_cells > 0:
        _module().get_function(_kernel_name(field_dtype, metric_dtype))(
            (-(-n_cells // _THREADS),), (_THREADS,),
            (terms, *fields, *metrics,
             # The generic code's Python scalars: (a**2 * dlon) * dlat times cos, and 0.5 * g.
             np.float64(params.radius**2 * params.dlon * params.dlat), np.float64(0.5 * params.gravity),
             np.int32(_square_by_pow()), np.int32(n_rows), np.int32(n_columns), np.int32(w),
             np.int32(h.shape[1]), np.int32(coriolis.shape[1]), np.int64(block_stride)),
        )  # fmt: skip
    totals = cupy.empty(3, dtype=np.float64)
    for index in range(3):
        # A C-contiguous (n_rows, n_columns) block, 512-byte aligned: reduced as the generic code's temporary.
        cupy.sum(terms[index, :n_cells].reshape(n_rows, n_columns), out=totals[index])
    mass, energy, enstrophy = (float(x) for x in totals.get())
    return {"mass": mass, "energy": energy, "potential_enstrophy": enstrophy}


__all__ = ["local_diagnostics_gpu"]

"""GPU (CuPy RawKernel) implementation of the heat3d step; called by :func:`apps.stencil.heat3d.step.heat3d_step`.

Each thread owns one (j, i) column of a tile of ``planes_per_thread`` planes and marches along z,
keeping the value below, at and above the current plane in registers (each value loaded once per
column; x and y neighbours come through L1). Compiled with ``--fmad=false`` so the arithmetic rounds
exactly like the Numba kernel. With ``periodic_ghosts`` a thread that computes a boundary value also
stores it into the opposite face ghost (a periodic exchange without corners, done by the sweep).
"""

from __future__ import annotations

import functools

import numpy as np

from hpcgpu.errors import ConfigurationError

DEFAULT_LAUNCH = (64, 8, 8)
"""threads_x, threads_y, planes_per_thread of a block. On one H200, at five sizes (160 x 1000 x 1000 to
256^3): best or within 1% of the best of 16 shapes for the one-rank step (``periodic_ghosts``), 79-88%
of the copy bandwidth where the former (32, 8, 16) gave 65-78%; without ghosts (a rank's interior)
within 1% of the best of the four shapes timed, 77-83%."""
THIN_X_LAUNCH = (1, 64, 2)
"""Default for regions narrower than 8 cells in x (the x faces of the overlapped rim): one column per
block row, so no thread of a warp idles, and short marches, so the few columns still fill the GPU."""
THIN_Y_LAUNCH = (32, 1, 2)
"""Default for regions shorter than 8 rows (the y faces of the rim): one row per block."""
_COMPILE_OPTIONS = ("--fmad=false",)

_SOURCE = r"""
// u_new = u + r * ((((x+) + (x-)) + ((y+) + (y-))) + ((z+) + (z-)) - 6 u) on a padded 3D array.
// Compiled with --fmad=false: the same rounding as the CPU kernel, bit for bit.
template <typename T>
__global__ void heat3d_march(T* __restrict__ out, const T* __restrict__ inp,
                             long long plane_stride, long long row_stride,
                             int k0, int k1, int j0, int j1, int i0, int i1,
                             int planes_per_thread, T r, int periodic_ghosts) {
    const int i = i0 + blockIdx.x * blockDim.x + threadIdx.x;
    const int j = j0 + blockIdx.y * blockDim.y + threadIdx.y;
    const int k_start = k0 + blockIdx.z * planes_per_thread;
    const int k_stop = min(k_start + planes_per_thread, k1);
    if (i >= i1 || j >= j1 || k_start >= k_stop) return;
    long long c = (long long)k_start * plane_stride + (long long)j * row_stride + i;
    T below = inp[c - plane_stride];
    T center = inp[c];
    for (int k = k_start; k < k_stop; ++k, c += plane_stride) {
        const T above = inp[c + plane_stride];
        const T neighbours = ((inp[c + 1] + inp[c - 1]) + (inp[c + row_stride] + inp[c - row_stride]))
                             + (above + below);
        const T value = center + r * (neighbours - T(6) * center);
        out[c] = value;
        if (periodic_ghosts) {   // the region is the whole owned block: [k0, k1) = [1, nz + 1), ...
            if (i == i0) out[c + (i1 - i0)] = value;
            if (i == i1 - 1) out[c - (i1 - i0)] = value;
            if (j == j0) out[c + (j1 - j0) * row_stride] = value;
            if (j == j1 - 1) out[c - (j1 - j0) * row_stride] = value;
            if (k == k0) out[c + (k1 - k0) * plane_stride] = value;
            if (k == k1 - 1) out[c - (k1 - k0) * plane_stride] = value;
        }
        below = center;
        center = above;
    }
}
"""


def _kernel_name(dtype) -> str:
    return "heat3d_march<%s>" % {"float32": "float", "float64": "double"}[np.dtype(dtype).name]


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    """Compile one instantiation (once per process; CuPy caches the binary per device and on disk)."""
    import cupy

    module = cupy.RawModule(code=_SOURCE, options=_COMPILE_OPTIONS, name_expressions=(name,))
    return module.get_function(name)


def cuda_source() -> str:
    """The CUDA C++ source (for inspection and offline compilation with nvcc)."""
    return _SOURCE


def heat3d_step_gpu(out, inp, region, r, threads_x=None, threads_y=None, planes_per_thread=None,
                    periodic_ghosts=False) -> None:
    """Launch one step on CuPy arrays (arguments validated) on the current stream; no synchronisation."""
    k0, k1, j0, j1, i0, i1 = region
    if i1 - i0 < 8:
        default_x, default_y, default_planes = THIN_X_LAUNCH
    elif j1 - j0 < 8:
        default_x, default_y, default_planes = THIN_Y_LAUNCH
    else:
        default_x, default_y, default_planes = DEFAULT_LAUNCH
    threads_x = default_x if threads_x is None else int(threads_x)
    threads_y = default_y if threads_y is None else int(threads_y)
    planes = default_planes if planes_per_thread is None else int(planes_per_thread)
    if threads_x < 1 or threads_y < 1 or threads_x * threads_y > 1024 or planes < 1:
        raise ConfigurationError(
            f"heat3d_step: expected 1 <= threads_x * threads_y <= 1024 and planes_per_thread >= 1, found "
            f"threads_x={threads_x}, threads_y={threads_y}, planes_per_thread={planes}"
        )
    if k1 == k0 or j1 == j0 or i1 == i0:
        return
    grid = (-(-(i1 - i0) // threads_x), -(-(j1 - j0) // threads_y), -(-(k1 - k0) // planes))
    if grid[1] > 65535 or grid[2] > 65535:
        raise ConfigurationError(
            f"heat3d_step: launch grid {grid} exceeds CUDA's 65535 blocks along y or z; raise threads_y "
            "or planes_per_thread"
        )
    itemsize = inp.itemsize
    arguments = (
        out,
        inp,
        np.int64(inp.strides[0] // itemsize),
        np.int64(inp.strides[1] // itemsize),
        *(np.int32(v) for v in (k0, k1, j0, j1, i0, i1, planes)),
        inp.dtype.type(r),
        np.int32(1 if periodic_ghosts else 0),
    )
    _kernel(_kernel_name(inp.dtype))(grid, (threads_x, threads_y, 1), arguments)

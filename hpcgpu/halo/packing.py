"""Gather owned cells into message buffers and scatter received buffers into ghost cells.

Both take flat index arrays prepared once per exchange plan: ``dst[pos[k]] = src[idx[k]]``. On the GPU
this is one CuPy ElementwiseKernel launch per field for *all* neighbours together; on the CPU a NumPy
``take``/``put`` (pure data movement, no arithmetic, so there is nothing for Numba to add).
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _indexed_copy_kernel():
    import cupy

    return cupy.ElementwiseKernel(
        "raw T src, int64 idx, int64 pos",
        "raw T dst",
        "dst[pos] = src[idx]",
        "hpcgpu_halo_indexed_copy",
    )


def indexed_copy(dst_flat, pos, src_flat, idx) -> None:
    """Set ``dst_flat[pos] = src_flat[idx]`` in place (NumPy or CuPy arrays, 1-D). Returns None."""
    if isinstance(dst_flat, np.ndarray):
        dst_flat[pos] = src_flat[idx]
    else:
        _indexed_copy_kernel()(src_flat, idx, pos, dst_flat)

"""Argument checks shared by the stencil kernels (Jacobi, heat3d): padded arrays, regions, dispatch.

A stencil kernel of radius 1 works on *padded local arrays*: the cells a rank owns plus one ghost layer
on every side, so a local array of ``n`` owned cells per axis has ``n + 2`` entries per axis, owned
cells at padded indices ``1 .. n``. A *region* names the cells to update as half-open bounds in padded
indices, one ``(start, stop)`` pair per axis flattened into a tuple (``(j0, j1, i0, i1)`` in 2D,
``(k0, k1, j0, j1, i0, i1)`` in 3D). Every cell of a region needs its neighbours, so a region must
stay inside ``[1, shape - 1)`` on each axis; an empty region (``start == stop``) is allowed and does
nothing.

Every check raises :class:`hpcgpu.errors.ConfigurationError` with a message that says what was
expected, what was found and how to fix it. The heat3d kernels import these helpers too.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.arch import is_device_array as is_cupy  # the one "is this a CuPy array?" test (re-exported)
from hpcgpu.errors import ConfigurationError

SUPPORTED_DTYPES = (np.dtype("float32"), np.dtype("float64"))


def check_padded_pair(out, inp, ndim: int, kernel: str) -> None:
    """Check that ``out`` and ``inp`` are two distinct padded arrays a radius-1 kernel can use.

    Parameters
    ----------
    out, inp : numpy.ndarray or cupy.ndarray, shape (n_0 + 2, ..., n_{ndim-1} + 2)
        Output and input of one sweep, same array type, shape, dtype (float32 or float64) and
        strides, unit stride along the last axis, and no shared memory.
    ndim : int
        Number of axes the kernel expects.
    kernel : str
        Kernel name used in error messages.
    """
    for name, array in (("out", out), ("inp", inp)):
        if not (isinstance(array, np.ndarray) or is_cupy(array)):
            raise ConfigurationError(
                f"{kernel}: expected `{name}` to be a numpy or cupy array, found {type(array).__name__}; "
                "pass the padded local array (Field.data)"
            )
        if array.ndim != ndim:
            raise ConfigurationError(
                f"{kernel}: expected a {ndim}-d padded array for `{name}`, found shape {array.shape}"
            )
        if array.dtype not in SUPPORTED_DTYPES:
            raise ConfigurationError(
                f"{kernel}: expected float32 or float64 data in `{name}`, found {array.dtype}; "
                "convert with .astype('float32') or .astype('float64')"
            )
        if min(array.shape) < 3:
            raise ConfigurationError(
                f"{kernel}: expected at least one owned cell plus one ghost layer per side (every axis "
                f">= 3 entries) in `{name}`, found shape {array.shape}"
            )
        if array.strides[-1] != array.itemsize or any(s % array.itemsize for s in array.strides):
            raise ConfigurationError(
                f"{kernel}: expected `{name}` to have unit stride along its last axis, found strides "
                f"{array.strides} for itemsize {array.itemsize}; pass a C-contiguous array or a row slice"
            )
    if is_cupy(out) != is_cupy(inp):
        raise ConfigurationError(
            f"{kernel}: `out` is a {type(out).__module__} array but `inp` is a {type(inp).__module__} array; "
            "both must live on the same backend"
        )
    if out.shape != inp.shape or out.dtype != inp.dtype or out.strides != inp.strides:
        raise ConfigurationError(
            f"{kernel}: `out` and `inp` must match in shape, dtype and strides, found "
            f"out {out.shape} {out.dtype} {out.strides} and inp {inp.shape} {inp.dtype} {inp.strides}"
        )
    if _may_overlap(out, inp):
        raise ConfigurationError(
            f"{kernel}: `out` and `inp` share memory; a sweep reads neighbours of cells it writes, so it "
            "needs two separate buffers (swap them after each sweep)"
        )


def _may_overlap(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return bool(np.may_share_memory(a, b))
    # CuPy: compare the byte ranges the two arrays span (both have non-negative strides here).
    a_low, b_low = a.data.ptr, b.data.ptr
    a_high = a_low + sum((n - 1) * s for n, s in zip(a.shape, a.strides)) + a.itemsize
    b_high = b_low + sum((n - 1) * s for n, s in zip(b.shape, b.strides)) + b.itemsize
    return a_low < b_high and b_low < a_high


def check_region(region, padded_shape, kernel: str) -> tuple[int, ...]:
    """Validate a region against a padded shape and return it as a tuple of Python ints.

    Parameters
    ----------
    region : sequence of int, length 2 * len(padded_shape)
        Half-open bounds ``(start_0, stop_0, start_1, stop_1, ...)`` in padded indices.
    padded_shape : tuple of int
        Shape of the padded array (ghost layer of width 1 included).
    kernel : str
        Kernel name used in error messages.

    Returns
    -------
    tuple of int
        The region, with each bound satisfying ``1 <= start <= stop <= padded_shape[axis] - 1``.
    """
    ndim = len(padded_shape)
    try:
        bounds = tuple(int(b) for b in region)
        integral = all(int(b) == b for b in region)
    except (TypeError, ValueError):
        bounds, integral = (), False
    if len(bounds) != 2 * ndim or not integral:
        raise ConfigurationError(
            f"{kernel}: expected `region` as {2 * ndim} integers (start, stop per axis, padded indices), "
            f"found {region!r}"
        )
    for axis in range(ndim):
        start, stop = bounds[2 * axis], bounds[2 * axis + 1]
        if not 1 <= start <= stop <= padded_shape[axis] - 1:
            raise ConfigurationError(
                f"{kernel}: region bounds ({start}, {stop}) on axis {axis} must satisfy "
                f"1 <= start <= stop <= {padded_shape[axis] - 1} for a padded extent of "
                f"{padded_shape[axis]} (ghost cells cannot be updated: their neighbours are not stored)"
            )
    return bounds


def check_residual(residual, data_is_cupy: bool, kernel: str) -> None:
    """Check the optional residual accumulator: a 1-element float64 array on the data's backend."""
    if residual is None:
        return
    if is_cupy(residual) != data_is_cupy or not (isinstance(residual, np.ndarray) or is_cupy(residual)):
        where = "a cupy (device)" if data_is_cupy else "a numpy (host)"
        raise ConfigurationError(
            f"{kernel}: expected `residual` to be {where} array like the data, found "
            f"{type(residual).__module__}.{type(residual).__name__}"
        )
    if residual.dtype != np.float64 or residual.size != 1:
        raise ConfigurationError(
            f"{kernel}: expected `residual` to be a 1-element float64 array (the sum of squares is always "
            f"accumulated in float64), found dtype {residual.dtype} and size {residual.size}; "
            "allocate it with xp.zeros(1, dtype='float64')"
        )
    if residual.ndim != 1 or not residual.flags.c_contiguous:
        raise ConfigurationError(
            f"{kernel}: expected `residual` to be a contiguous 1-d array, found shape {residual.shape}"
        )


def row_pitch(array) -> int:
    """Row stride of a unit-stride padded array, in elements."""
    return array.strides[-2] // array.itemsize

"""The Jacobi benchmark problem: 2D Laplace on a y-periodic strip with two Dirichlet columns.

This is the problem of NVIDIA's *multi-GPU programming models* Jacobi solver. The global grid has
``ny x nx`` cells (axis order y, x), is periodic in y, and its first and last columns (global x index
``0`` and ``nx - 1``) hold the fixed values ``sin(2 pi iy / (ny - 1))`` with ``iy`` the global row
index. Every other cell starts at 0 and relaxes towards the discrete harmonic function with those
boundary values.

Values are computed on the host with NumPy in float64 and then rounded once to the working dtype, so
every backend and every decomposition starts from bitwise the same state (CuPy's ``sin`` may differ
from NumPy's in the last bit).
"""

from __future__ import annotations

import numpy as np

from apps.stencil.jacobi.arrays import is_cupy
from hpcgpu.errors import ConfigurationError


def check_global_shape(global_shape) -> tuple[int, int]:
    """Validate the global grid ``(ny, nx)``: y needs >= 2 rows (the boundary formula divides by
    ``ny - 1``) and x >= 3 columns (two Dirichlet columns plus at least one computed one)."""
    try:
        ny, nx = (int(n) for n in global_shape)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"Jacobi: expected global_shape as two integers (ny, nx), found {global_shape!r}"
        ) from None
    if ny < 2 or nx < 3:
        raise ConfigurationError(
            f"Jacobi: expected global_shape (ny, nx) with ny >= 2 and nx >= 3, found ({ny}, {nx})"
        )
    return ny, nx


def boundary_values(global_rows, global_shape) -> np.ndarray:
    """Dirichlet values ``sin(2 pi iy / (ny - 1))`` of the fixed columns, float64.

    Parameters
    ----------
    global_rows : array_like of int
        Global row indices ``iy`` (any shape; values outside ``[0, ny)`` are wrapped periodically).
    global_shape : (int, int)
        Global grid ``(ny, nx)``.
    """
    ny, _ = check_global_shape(global_shape)
    rows = np.mod(np.asarray(global_rows, dtype=np.int64), ny)
    return np.sin(2.0 * np.pi * rows / (ny - 1))


def initial_condition(global_y, global_x, global_shape, dtype="float32"):
    """Initial value at global indices: the Dirichlet value in columns 0 and nx-1, zero elsewhere.

    Usable as ``field.set_from_global(lambda iy, ix: initial_condition(iy, ix, global_shape, dtype))``.

    Parameters
    ----------
    global_y, global_x : array_like of int, broadcastable
        Global row and column indices (NumPy or CuPy arrays). Rows wrap periodically; columns
        outside ``[0, nx)`` (ghosts beyond the Dirichlet columns) get 0.
    global_shape : (int, int)
        Global grid ``(ny, nx)``.
    dtype : str or numpy.dtype
        Working precision, float32 (default, as NVIDIA) or float64.

    Returns
    -------
    array of dtype ``dtype``, the broadcast shape of the indices
        A CuPy array when either index array is a CuPy array, else a NumPy array.
    """
    on_gpu = is_cupy(global_y) or is_cupy(global_x)
    if on_gpu:
        import cupy

        global_y, global_x = cupy.asnumpy(global_y), cupy.asnumpy(global_x)
    _, nx = check_global_shape(global_shape)
    rows, columns = np.broadcast_arrays(np.asarray(global_y), np.asarray(global_x))
    fixed = (columns == 0) | (columns == nx - 1)
    values = np.where(fixed, boundary_values(rows, global_shape), 0.0).astype(np.dtype(dtype))
    if on_gpu:
        return cupy.asarray(values)
    return values


def fill_initial_state(padded, local_start, global_shape) -> None:
    """Fill a padded local array, ghost cells included, with the initial state. Mutates ``padded``.

    Ghost rows take the periodic neighbour's values; ghost columns beyond the global x range get 0
    (no computed cell reads them: their only neighbours are the fixed columns). Fill *both* sweep
    buffers: :func:`~apps.stencil.jacobi.sweep.jacobi_sweep` never writes the fixed columns.

    Parameters
    ----------
    padded : numpy.ndarray or cupy.ndarray, shape (ny_local + 2, nx_local + 2)
        Local array with a ghost layer of width 1.
    local_start : (int, int)
        Global ``(iy, ix)`` of the first owned cell (``Decomposition.local_start``).
    global_shape : (int, int)
        Global grid ``(ny, nx)``.
    """
    rows = np.arange(padded.shape[0])[:, None] + int(local_start[0]) - 1
    columns = np.arange(padded.shape[1])[None, :] + int(local_start[1]) - 1
    values = initial_condition(rows, columns, global_shape, padded.dtype)
    if is_cupy(padded):
        padded.set(values)
    else:
        padded[...] = values


def fixed_local_columns(local_start_x: int, nx_local: int, nx_global: int) -> tuple[int, ...]:
    """Padded local column indices of this rank's Dirichlet columns (global x 0 and nx-1).

    Parameters
    ----------
    local_start_x : int
        Global x index of the first owned column.
    nx_local : int
        Number of owned columns.
    nx_global : int
        Global number of columns ``nx``.

    Returns
    -------
    tuple of int
        Zero, one or two padded indices (owned column ``c`` sits at padded index ``c + 1``), the
        ``fixed_columns`` argument of :func:`~apps.stencil.jacobi.sweep.jacobi_sweep`.
    """
    owned = range(int(local_start_x), int(local_start_x) + int(nx_local))
    return tuple(
        column - int(local_start_x) + 1 for column in sorted({0, int(nx_global) - 1}) if column in owned
    )

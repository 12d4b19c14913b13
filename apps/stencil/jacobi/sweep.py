"""One Jacobi sweep of the 2D 5-point Laplace stencil over a region of a padded local array.

The update of a computed cell, in padded local indices ``(j, i)`` (axis order y, x), is ::

    out[j, i] = 0.25 * ((inp[j, i+1] + inp[j, i-1]) + (inp[j+1, i] + inp[j-1, i]))

evaluated in the data dtype in exactly this association order: (east + west) + (south + north), then
the product with 0.25 (exact: a power of two). CPU and GPU, every GPU variant and every split of a
region into sub-regions therefore give bitwise the same ``out``. Cells of the fixed (Dirichlet)
columns are never written, so both sweep buffers must hold the boundary values
(:func:`~apps.stencil.jacobi.problem.fill_initial_state` fills them).

With ``residual`` the kernel also adds ``sum((out - inp)**2)`` over the computed cells to
``residual[0]``, accumulating in float64 whatever the data dtype (differences of float32 values
squared in float64, unlike NVIDIA's float32 accumulator). Residuals from different backends or splits
agree to float64 rounding, not bitwise: the summation order differs (GPU blocks add atomically).

Throughput is counted as one lattice update (LUP) per computed cell per sweep, see
:func:`n_lattice_updates`. No MPI happens here: the caller exchanges halos between sweeps.
"""

from __future__ import annotations

from apps.stencil.jacobi.arrays import check_padded_pair, check_region, check_residual, is_cupy
from hpcgpu.errors import ConfigurationError

CPU_VARIANTS = ("auto", "cpu")


def jacobi_sweep(
    out,
    inp,
    region,
    fixed_columns=(),
    residual=None,
    *,
    variant: str = "auto",
    threads_x: int | None = None,
    threads_y: int | None = None,
    rows_per_thread: int | None = None,
) -> None:
    """Update ``out[j0:j1, i0:i1]`` from ``inp`` with one Jacobi sweep. Mutates ``out`` (and ``residual``).

    Parameters
    ----------
    out, inp : numpy.ndarray or cupy.ndarray, shape (ny_local + 2, nx_local + 2)
        Padded local arrays (halo width 1), float32 or float64, same shape, dtype and strides, unit
        stride along x, not overlapping. ``inp``'s ghost cells must be filled (halo exchange) first.
    region : (int, int, int, int)
        ``(j0, j1, i0, i1)``: half-open row and column bounds in padded indices, with
        ``1 <= j0 <= j1 <= ny_local + 1`` and ``1 <= i0 <= i1 <= nx_local + 1``.
    fixed_columns : sequence of int, at most 2 distinct values
        Padded column indices holding Dirichlet values (skipped, never written); see
        :func:`~apps.stencil.jacobi.problem.fixed_local_columns`. Columns outside the region are
        ignored.
    residual : numpy.ndarray or cupy.ndarray, shape (1,), float64, optional
        Accumulator on the same backend as the data; the sum of ``(out - inp)**2`` over the computed
        cells of the region is *added* to it (zero it before the first sub-region of a sweep).
    variant : str
        GPU only: ``"auto"``, ``"simple"``, ``"march"``, ``"march_vec2"`` or ``"march_vec4"`` (see
        :mod:`apps.stencil.jacobi.gpu`). NumPy data accepts ``"auto"`` or ``"cpu"``.
    threads_x, threads_y, rows_per_thread : int, optional
        GPU launch shape: block of ``threads_x x threads_y`` threads (whole warps; ``threads_x`` a
        multiple of 32 for the marching variants), ``rows_per_thread`` rows per thread for the
        marching variants. Defaults per variant in :data:`apps.stencil.jacobi.gpu.DEFAULT_LAUNCH`.

    Notes
    -----
    On the GPU the kernel is launched on CuPy's current stream and the call returns without
    synchronising.
    """
    check_padded_pair(out, inp, ndim=2, kernel="jacobi_sweep")
    bounds = check_region(region, inp.shape, kernel="jacobi_sweep")
    columns = _check_fixed_columns(fixed_columns, inp.shape[1])
    on_gpu = is_cupy(inp)
    check_residual(residual, on_gpu, kernel="jacobi_sweep")
    if on_gpu:
        from apps.stencil.jacobi.gpu import jacobi_sweep_gpu

        jacobi_sweep_gpu(out, inp, bounds, columns, residual, variant, threads_x, threads_y, rows_per_thread)
        return
    if variant not in CPU_VARIANTS:
        raise ConfigurationError(
            f"jacobi_sweep: variant {variant!r} is a GPU variant but the data are NumPy arrays; "
            f"use one of {CPU_VARIANTS} (or pass CuPy arrays)"
        )
    from apps.stencil.jacobi.stencil import jacobi_sweep_cpu

    jacobi_sweep_cpu(out, inp, bounds, columns, residual)


def n_lattice_updates(region, fixed_columns=()) -> int:
    """Number of cells a sweep over ``region`` computes (one LUP each): the region minus fixed columns."""
    row_start, row_stop, column_start, column_stop = (int(b) for b in region)
    n_fixed = sum(1 for c in set(int(c) for c in fixed_columns) if column_start <= c < column_stop)
    return max(row_stop - row_start, 0) * max(column_stop - column_start - n_fixed, 0)


def _check_fixed_columns(fixed_columns, padded_width: int) -> tuple[int, ...]:
    try:
        columns = tuple(sorted({int(c) for c in fixed_columns}))
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"jacobi_sweep: expected `fixed_columns` as a sequence of padded column indices, found "
            f"{fixed_columns!r}"
        ) from None
    if len(columns) > 2 or any(not 0 <= c < padded_width for c in columns):
        raise ConfigurationError(
            f"jacobi_sweep: expected at most 2 distinct fixed columns in [0, {padded_width}) (the "
            f"Dirichlet columns global x = 0 and nx - 1), found {fixed_columns!r}; use "
            "fixed_local_columns(local_start_x, nx_local, nx) to compute them"
        )
    return columns

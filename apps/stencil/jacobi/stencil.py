"""The Jacobi update of one cell, written once for the kernel layer (``@hpcgpu.stencil``).

The CPU sweep (:func:`~apps.stencil.jacobi.sweep.jacobi_sweep` on NumPy arrays) runs the Numba
kernel the layer generates from :func:`jacobi` over the runs of columns between the fixed
(Dirichlet) columns (:mod:`apps.stencil.region_kernels`), then, when asked, sums the squared change
of those cells in float64 (:func:`residual_sum`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

import hpcgpu
from apps.stencil.region_kernels import apply_to_regions


@hpcgpu.stencil
def jacobi(a):
    # Association order fixed for every backend: (east + west) + (south + north).
    return 0.25 * ((a[0, 1] + a[0, -1]) + (a[1, 0] + a[-1, 0]))


def jacobi_sweep_cpu(out, inp, region, fixed_columns, residual) -> None:
    """Run one sweep on NumPy arrays (arguments already validated). Mutates ``out`` and ``residual``."""
    row_start, row_stop, column_start, column_stop = region
    run_starts, run_stops = _column_runs(column_start, column_stop, fixed_columns)
    apply_to_regions(jacobi, (out,), (inp,), (), [(row_start, row_stop, start, stop)
                                                   for start, stop in zip(run_starts, run_stops)])
    if residual is not None:
        residual[0] += residual_sum(out, inp, row_start, row_stop, run_starts, run_stops)


def residual_sum(out, inp, row_start, row_stop, run_starts, run_stops) -> float:
    """``sum((out - inp)**2)`` over rows ``[row_start, row_stop)`` and the column runs, in float64.

    Each row is summed on its own (threads share the rows), then the row sums are added in row
    order, so the value does not depend on the number of threads.
    """
    if row_stop <= row_start or not run_starts.size:
        return 0.0
    row_sums = np.zeros(row_stop - row_start, dtype=np.float64)
    _row_sums(out, inp, row_start, row_stop, run_starts, run_stops, row_sums)
    total = 0.0
    for value in row_sums:  # row order: deterministic whatever the thread count
        total += float(value)
    return total


@njit(fastmath={"reassoc"}, cache=True)
def _sum_of_squared_differences(new, old):
    """Sum of (new - old)**2 in float64. ``reassoc`` (this function only) lets LLVM vectorise the sum;
    the order is still fixed by the compiled code, so the result does not depend on the thread count."""
    total = 0.0
    for i in range(new.size):
        difference = np.float64(new[i]) - np.float64(old[i])
        total += difference * difference
    return total


@njit(parallel=True, cache=True)
def _row_sums(out, inp, row_start, row_stop, run_starts, run_stops, row_sums):
    for row_offset in prange(row_stop - row_start):
        j = row_start + row_offset
        row_sum = 0.0
        for run in range(run_starts.size):
            start, stop = run_starts[run], run_stops[run]
            row_sum += _sum_of_squared_differences(out[j, start:stop], inp[j, start:stop])
        row_sums[row_offset] = row_sum


def _column_runs(column_start, column_stop, fixed_columns):
    """Split ``[column_start, column_stop)`` into runs that skip the fixed columns."""
    starts, stops = [], []
    position = column_start
    for fixed in sorted(c for c in set(fixed_columns) if column_start <= c < column_stop):
        if fixed > position:
            starts.append(position)
            stops.append(fixed)
        position = fixed + 1
    if column_stop > position:
        starts.append(position)
        stops.append(column_stop)
    return np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)

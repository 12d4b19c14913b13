"""CPU (Numba) implementation of the Jacobi sweep; called by :func:`apps.stencil.jacobi.sweep.jacobi_sweep`.

Rows are spread over threads with ``prange``; the inner loop walks one contiguous run of columns with
no branch (the fixed Dirichlet columns split a row into at most three such runs beforehand), so LLVM
can vectorise it. Arithmetic is exactly that of the GPU kernels: with ``fastmath`` off Numba never
contracts ``a * b + c`` into an FMA, and the constant ``quarter`` arrives in the data dtype so float32
data never gets promoted to float64.

The residual is summed per row in float64 (a separate pass over the row, vectorised with reassociation
allowed in that function only) and the row sums are added in row order, so the CPU residual does not
depend on the number of threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(fastmath={"reassoc"}, cache=True)
def _sum_of_squared_differences(new, old):
    """Sum of (new - old)**2 in float64. ``reassoc`` (this function only) lets LLVM vectorise the sum;
    the order is still fixed by the code, so the result does not depend on the thread count."""
    total = 0.0
    for i in range(new.size):
        difference = np.float64(new[i]) - np.float64(old[i])
        total += difference * difference
    return total


@njit(parallel=True, cache=True)
def _sweep_rows(out, inp, row_start, row_stop, run_starts, run_stops, quarter, with_residual, row_sums):
    for row_offset in prange(row_stop - row_start):
        j = row_start + row_offset
        row_sum = 0.0
        for run in range(run_starts.size):
            start = run_starts[run]
            length = run_stops[run] - start
            # Slices with a loop index counting from 0: Numba then knows no index is negative and drops
            # its wrap-around check, which is what lets LLVM vectorise the loop (5x faster).
            east = inp[j, start + 1 : start + 1 + length]
            west = inp[j, start - 1 : start - 1 + length]
            south = inp[j + 1, start : start + length]
            north = inp[j - 1, start : start + length]
            result = out[j, start : start + length]
            for i in range(length):
                # Association order fixed for every backend: (east + west) + (south + north).
                result[i] = quarter * ((east[i] + west[i]) + (south[i] + north[i]))
            if with_residual:
                # A second pass over the row (still in cache) keeps the update loop free of the reduction.
                row_sum += _sum_of_squared_differences(result, inp[j, start : start + length])
        if with_residual:
            row_sums[row_offset] = row_sum


def jacobi_sweep_cpu(out, inp, region, fixed_columns, residual) -> None:
    """Run one sweep on NumPy arrays (arguments already validated). Mutates ``out`` and ``residual``."""
    row_start, row_stop, column_start, column_stop = region
    run_starts, run_stops = _column_runs(column_start, column_stop, fixed_columns)
    with_residual = residual is not None and row_stop > row_start
    row_sums = np.zeros(row_stop - row_start if with_residual else 0, dtype=np.float64)
    if row_stop > row_start and run_starts.size:
        _sweep_rows(
            out, inp, row_start, row_stop, run_starts, run_stops, out.dtype.type(0.25), with_residual, row_sums
        )
    if residual is not None:
        total = 0.0
        for value in row_sums:  # row order: deterministic whatever the thread count
            total += float(value)
        residual[0] += total


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

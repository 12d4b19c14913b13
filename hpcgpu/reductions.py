"""Sums of distributed fields with the same bits on any number of ranks (for diagnostics).

A plain ``allreduce`` of per-rank sums rounds in an order that depends on the decomposition, so the
mean of a field can change in the last digit between 1 and 2 ranks. :func:`global_sum` instead
returns the *correctly rounded* sum of all owned cells, which is unique and hence independent of the
rank count, the split and the order of the cells:

1. each rank reduces its owned cells (as float64, exactly) to a short list of non-overlapping
   floating-point *partials* whose exact sum is the exact sum of its cells (Shewchuk's algorithm, the
   one behind :func:`math.fsum`; a few partials per rank, at most about 40);
2. the partials of all ranks are gathered to every rank and :func:`math.fsum` rounds their exact
   total once.

:func:`global_max` and :func:`global_min` are exact by nature (one number per rank, gathered).

Cost of a sum: one pass over the owned cells on the host (a GPU field is copied to the host first) and one
small allgather: for diagnostics and checks, not for the inside of a time step. A non-finite cell
makes the result NaN or infinite (as a plain sum would).
"""

from __future__ import annotations

import math

import numpy as np

_partials_function = None


def _compiled_partials():
    """The Numba kernel of step 1, compiled on first use (nothing happens at import)."""
    global _partials_function
    if _partials_function is None:
        from numba import njit

        @njit(cache=True)
        def exact_partials(values):
            partials = np.empty(128, dtype=np.float64)   # non-overlapping doubles: at most ~40 needed
            count = 0
            for k in range(values.size):
                x = values[k]
                kept = 0
                for j in range(count):
                    y = partials[j]
                    if abs(x) < abs(y):
                        x, y = y, x
                    high = x + y
                    low = y - (high - x)     # the rounding error of x + y, exactly
                    if low != 0.0:
                        partials[kept] = low
                        kept += 1
                    x = high
                partials[kept] = x
                count = kept + 1
            return partials[:count].copy()

        _partials_function = exact_partials
    return _partials_function


def exact_partials(values) -> np.ndarray:
    """Non-overlapping float64 partials whose exact sum is the exact sum of ``values`` (finite values)."""
    flat = np.ascontiguousarray(values, dtype=np.float64).ravel()
    if not np.isfinite(flat).all():
        return np.array([flat.sum()])   # NaN or an infinity: the plain sum says so
    return _compiled_partials()(flat)


def global_sum(field) -> float:
    """Collective: the correctly rounded sum of the owned cells of ``field``, on every rank.

    Parameters
    ----------
    field : hpcgpu.Field
        Any dtype that converts exactly to float64 (float32, float64, integers below 2**53).

    Returns
    -------
    float
        The same bits for any number of ranks and any decomposition.
    """
    comm = field.decomposition.comm
    local = exact_partials(field.arch.to_host(field.interior))
    every = comm.mpi.allgather(local)
    return math.fsum(np.concatenate(every).tolist())


def global_mean(field) -> float:
    """Collective: :func:`global_sum` divided by the number of cells (same bits on any rank count)."""
    return global_sum(field) / math.prod(field.decomposition.global_shape)


def _global_extreme(field, name: str) -> float:
    interior = field.interior
    local = float(getattr(field.arch.xp, name)(interior))   # one number per rank (NaN propagates)
    every = field.decomposition.comm.mpi.allgather(local)
    return math.nan if any(math.isnan(value) for value in every) else float(getattr(np, name)(every))


def global_max(field) -> float:
    """Collective: the largest owned value of ``field``, on every rank (NaN if any cell is NaN).

    Exact, so the same bits on any number of ranks and any split: fit for a decision inside a time
    step (a CFL number, an adaptive time step) that every rank must take alike.
    """
    return _global_extreme(field, "max")


def global_min(field) -> float:
    """Collective: the smallest owned value of ``field``, on every rank (NaN if any cell is NaN)."""
    return _global_extreme(field, "min")

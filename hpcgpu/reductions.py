"""Sums of distributed fields with the same bits on any number of ranks (for diagnostics).

A plain ``allreduce`` of per-rank sums rounds in an order that depends on the decomposition, so the
mean of a field can change in the last digit between 1 and 2 ranks. :func:`global_sum` instead
returns the *correctly rounded* sum of all owned cells, which is unique and hence independent of the
rank count, the split and the order of the cells:

1. each rank reduces its owned cells (as float64) to their **exact** sum, held as an integer number of
   ``2**-1074`` (the smallest subnormal double; every double is an integer multiple of it):
   :func:`exact_sum`. A Numba kernel first folds the cells into Shewchuk's non-overlapping
   floating-point *partials* (the algorithm behind :func:`math.fsum`), whose exact sum is the exact
   sum of the cells; the few partials then become one Python integer;
2. the integers of all ranks are gathered to every rank, added exactly, and rounded once to the
   nearest double (ties to even): :func:`rounded_total`.

Where :func:`math.fsum` of all cells returns a value, :func:`global_sum` returns the same bits.
Non-finite values and overflow, where they differ:

* a NaN cell, or ``+inf`` and ``-inf`` cells together, give NaN (``math.fsum`` raises ``ValueError``
  for the latter); infinite cells of one sign give that infinity;
* finite cells whose exact sum is beyond the largest double give ``±inf`` with the sign of the exact
  sum; an exact sum inside the double range is returned correctly rounded even where a running sum
  passes the largest double on the way (``math.fsum`` raises ``OverflowError`` in both cases).

Cost: one pass over the owned cells on the host (a GPU field is copied to the host first), a few
microseconds per partial, and one small allgather: for diagnostics and checks, not for the inside of a
time step. The pass costs O(cells x partials); fields whose values span hundreds of binary orders of
magnitude (a decaying concentration next to an O(1) one) hold up to a few hundred partials.

:func:`global_max` and :func:`global_min` are exact by nature (one number per rank, gathered).
"""

from __future__ import annotations

import math

import numpy as np

#: Every double is an integer multiple of 2**-SCALE_BITS (the smallest subnormal).
SCALE_BITS = 1074
#: Bit positions a finite double can set: 2**-1074 (smallest subnormal) ... 2**1023 (largest finite's top bit).
DOUBLE_BIT_POSITIONS = 1074 + 1023 + 1
#: Size of the kernel's buffer of partials: at most DOUBLE_BIT_POSITIONS partials are held between two
#: cells, and a cell's pass writes at most one beyond them (see :func:`_compiled_partials`).
PARTIALS_CAPACITY = DOUBLE_BIT_POSITIONS + 1

#: The kernel's status codes (a count >= 0 is success).
_OVERFLOW, _FULL = -1, -2

_partials_function = None


def _compiled_partials():
    """The Numba kernel of step 1, compiled on first use (nothing happens at import).

    ``count = kernel(values, partials)`` folds the finite float64 ``values`` (1-D) into
    ``partials[:count]``: nonzero, non-overlapping, increasing in magnitude, and with the exact sum of
    ``values``. It returns ``-1`` if a rounded running sum overflowed (the partials are then no longer
    exact) and ``-2`` if ``partials`` is too small; :func:`exact_sum` then sums exactly in Python.

    Why ``PARTIALS_CAPACITY`` is enough (so ``-2`` cannot happen with that buffer): Shewchuk (1997,
    Theorem 10, round-to-nearest binary arithmetic without overflow) shows that adding a double to a
    non-overlapping expansion with error-free two-sums, as below, leaves a non-overlapping expansion.
    Two doubles are non-overlapping when the lowest set bit of the larger lies above the highest set
    bit of the smaller, so nonzero non-overlapping partials occupy *disjoint, non-empty* sets of bit
    positions. A finite double sets bits only at positions -1074 ... 1023: 2098 positions, hence at
    most 2098 partials between two cells. It is *not* 2098/53 ~ 40: a partial may hold a single bit,
    and partials need not be adjacent (values spanning 667 binary orders, 1 down to 1e-201, held 169).
    While a cell is added the kernel writes at index ``kept <= j < count`` and finally at
    ``kept <= count <= 2098``, so 2099 slots are never overrun. Overflow would break the theorem's
    premise: the kernel checks every rounded sum for it and stops. The index check is kept as well, so
    a buffer that is too small (tests pass one) ends in the exact fallback, never in a write past it.
    """
    global _partials_function
    if _partials_function is None:
        from numba import njit

        @njit(cache=True)
        def exact_partials_kernel(values, partials):
            capacity = partials.size
            count = 0
            for k in range(values.size):
                x = values[k]
                kept = 0
                for j in range(count):
                    y = partials[j]
                    if abs(x) < abs(y):
                        x, y = y, x
                    high = x + y
                    if high - high != 0.0:   # inf or nan: the running sum left the double range
                        return -1
                    low = y - (high - x)     # the rounding error of x + y, exactly
                    if low != 0.0:
                        partials[kept] = low   # kept <= j < count <= capacity - 1
                        kept += 1
                    x = high
                if kept >= capacity:
                    return -2
                partials[kept] = x
                count = kept + 1
            return count

        _partials_function = exact_partials_kernel
    return _partials_function


def _as_scaled_integer(value: float) -> int:
    """``value`` (finite) as the exact integer ``value * 2**SCALE_BITS``."""
    numerator, denominator = value.as_integer_ratio()   # denominator: a power of two <= 2**1074
    return numerator << (SCALE_BITS + 1 - denominator.bit_length())


def exact_sum(values, capacity: int = PARTIALS_CAPACITY) -> int | float:
    """The exact sum of ``values`` as an integer number of ``2**-1074``; NaN or ``±inf`` if one is not finite.

    Parameters
    ----------
    values : array_like
        Any shape; converted to float64 (exact for float16/32/64 and integers below 2**53).
    capacity : int
        Partials the kernel may hold; tests pass a small one to exercise the exact fallback.

    Returns
    -------
    int or float
        ``int``: the exact sum times ``2**1074``. ``float``: NaN (a NaN, or infinities of both signs)
        or the infinity of the infinite values' sign. Combine the results of several parts (ranks)
        with :func:`rounded_total`.
    """
    flat = np.ascontiguousarray(values, dtype=np.float64).ravel()
    if not np.isfinite(flat).all():
        return float(flat[~np.isfinite(flat)].sum())   # nan, or inf + -inf = nan, or one signed inf
    partials = np.empty(capacity, dtype=np.float64)
    count = _compiled_partials()(flat, partials)
    if count < 0:
        # A running sum beyond the largest double (or a test's tiny buffer): add exactly, in Python.
        return sum(_as_scaled_integer(value) for value in flat.tolist())
    return sum(_as_scaled_integer(value) for value in partials[:count].tolist())


def rounded_total(parts) -> float:
    """The correctly rounded (to nearest, ties to even) sum of :func:`exact_sum` results.

    Non-finite parts combine as a plain sum would (NaN, or the infinity of one sign); an exact total
    beyond the largest double gives the infinity of its sign.
    """
    special = [part for part in parts if isinstance(part, float)]
    if special:
        return float(sum(special))
    total = sum(parts)
    try:
        return total / (1 << SCALE_BITS)   # int / int: correctly rounded by Python, subnormals included
    except OverflowError:   # it rounds beyond the largest double
        return math.inf if total > 0 else -math.inf


def global_sum(field) -> float:
    """Collective: the correctly rounded sum of the owned cells of ``field``, on every rank.

    Parameters
    ----------
    field : hpcgpu.Field
        Any dtype that converts exactly to float64 (float32, float64, integers below 2**53).

    Returns
    -------
    float
        The same bits for any number of ranks and any decomposition; equal to :func:`math.fsum` of all
        cells wherever that returns (non-finite cells and overflow: see the module's docstring).
    """
    comm = field.decomposition.comm
    local = exact_sum(field.arch.to_host(field.interior))
    return rounded_total(comm.mpi.allgather(local))


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

"""Shape arithmetic of a Cartesian decomposition: block extents and the choice of process grid.

Pure functions of integers (no MPI), shared by :mod:`hpcgpu.decomposition` (the distributed grid),
:mod:`hpcgpu.decomposition.nodes` (which rank of which node owns which block) and the scaling model
(:mod:`hpcgpu.bench.model`). Along an axis of ``n`` cells cut into ``p`` blocks, every block gets
``n // p`` cells and the first ``n % p`` blocks one more.
"""

from __future__ import annotations

import math
from typing import Sequence

from hpcgpu.errors import DecompositionError

WILDCARDS = (0, None, "*")


def split_extents(n_cells: int, n_blocks: int) -> list[int]:
    """Cells per block when ``n_cells`` are cut into ``n_blocks`` (remainder to the first blocks)."""
    base, remainder = divmod(n_cells, n_blocks)
    return [base + 1 if i < remainder else base for i in range(n_blocks)]


def factorizations(n: int, n_axes: int):
    """All ordered tuples of ``n_axes`` positive integers whose product is ``n``."""
    if n_axes == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in factorizations(n // first, n_axes - 1):
                yield (first,) + rest


def choose_dims(n_ranks: int, global_shape: Sequence[int], dims: Sequence | None = None) -> tuple[int, ...]:
    """Choose blocks per axis for ``n_ranks`` ranks, honouring fixed entries of ``dims``.

    Entries of ``dims`` that are 0, None or "*" are free. Among all factorizations of ``n_ranks`` that
    match the fixed entries and give every block at least one cell, the one that moves the fewest
    halo cells (the total area of cuts) wins; ties go to more blocks on the slower (earlier) axes.

    Raises
    ------
    DecompositionError
        If no such factorization exists; the message lists what would work.
    """
    ndim = len(global_shape)
    requested = tuple(WILDCARDS[0] if d in WILDCARDS else d for d in (dims or (0,) * ndim))
    if len(requested) != ndim:
        raise DecompositionError(
            f"dims has {len(requested)} entries but the grid has {ndim} axes (global_shape={tuple(global_shape)}); "
            "give one entry per axis, with 0 or '*' for 'choose for me'"
        )
    for d in requested:
        if not isinstance(d, int) or d < 0:
            raise DecompositionError(f"dims entries must be positive integers or 0/'*', got {dims!r}")
    best, best_cost = None, None
    for candidate in factorizations(n_ranks, ndim):
        if any(r and r != c for r, c in zip(requested, candidate)):
            continue
        if any(c > n for c, n in zip(candidate, global_shape)):
            continue
        cut_area = sum(
            (c - 1) * math.prod(n for b, n in enumerate(global_shape) if b != a) for a, c in enumerate(candidate)
        )
        cost = (cut_area, tuple(-c for c in candidate))
        if best_cost is None or cost < best_cost:
            best, best_cost = candidate, cost
    if best is None:
        raise DecompositionError(
            f"cannot split a grid of shape {tuple(global_shape)} over {n_ranks} ranks with dims={tuple(dims or ())}: "
            f"expected the fixed dims to divide {n_ranks} and every axis to have at least as many cells as "
            "blocks. Use fewer ranks, a larger grid, or leave dims free (0 or '*')."
        )
    return best

"""Which cells a block sends to and receives from each neighbour.

For a 2D block with ghost width 1 (``o`` owned, ``.`` ghost), the message sent *towards* offset
``d = (+1, -1)`` (one block up in y, one left in x) is the owned corner cell ``A``; the message
received *from* the neighbour at offset ``(+1, -1)`` fills the ghost corner ``a``::

        a . . . .        row 4 = ghost (y upper side)
        . A o o .
        . o o o .
        . o o o .
        . . . . .        row 0 = ghost (y lower side)

Per axis, with owned extent ``n`` and ghost width ``w`` (padded indices, owned cells are ``[w, w+n)``):

=========  ======================  ===============================
offset     send (owned cells)      receive (ghost cells)
=========  ======================  ===============================
-1         ``[w, 2w)``             ``[0, w)``
 0         ``[w, w+n)``            ``[w, w+n)``
+1         ``[n, n+w)``            ``[w+n, n+2w)``
=========  ======================  ===============================

Messages are matched by *direction*: what a block sends towards ``d`` is what the block at ``d``
receives into its ghost side ``-d``. Every direction has a fixed index (its position in
:func:`directions`), used as the MPI tag and, for NCCL, as the order of operations inside one group.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np


def directions(ndim: int, corners: bool = True) -> list[tuple[int, ...]]:
    """Neighbour offsets in a fixed order: faces only, or faces, edges and corners."""
    all_offsets = [d for d in itertools.product((-1, 0, 1), repeat=ndim) if any(d)]
    if corners:
        return all_offsets
    return [d for d in all_offsets if sum(map(abs, d)) == 1]


def _axis_range(kind: str, d: int, n: int, w: int) -> range:
    if d == 0:
        return range(w, w + n)
    if kind == "send":
        return range(w, 2 * w) if d < 0 else range(n, n + w)
    return range(0, w) if d < 0 else range(w + n, n + 2 * w)


def region_slices(kind: str, direction: Sequence[int], owned_shape, halo_width) -> tuple[slice, ...] | None:
    """Slices of the padded array for the ``send`` or ``recv`` region of ``direction``.

    Returns None when the direction moves along an axis without ghost cells (width 0), where no
    message exists.
    """
    slices = []
    for d, n, w in zip(direction, owned_shape, halo_width):
        if d != 0 and w == 0:
            return None
        r = _axis_range(kind, d, n, w)
        slices.append(slice(r.start, r.stop))
    return tuple(slices)


def flat_indices(slices: tuple[slice, ...], padded_shape: Sequence[int]) -> np.ndarray:
    """Flat (C-order) indices of the cells selected by ``slices`` in an array of ``padded_shape``."""
    grids = np.ix_(*[np.arange(s.start, s.stop, dtype=np.int64) for s in slices])
    return np.ravel_multi_index(grids, tuple(padded_shape)).ravel().astype(np.int64)


def is_contiguous(indices: np.ndarray) -> bool:
    """True if ``indices`` is one run of consecutive integers."""
    return indices.size > 0 and int(indices[-1]) - int(indices[0]) + 1 == indices.size and bool(
        np.all(np.diff(indices) == 1)
    )


def split_owned(local_shape: Sequence[int], halo_width: Sequence[int], rim_width: Sequence[int] | None = None):
    """Cut the owned cells into an interior that needs no ghost cells and rim slabs that do.

    Bounds are in padded indices, flattened per axis as ``(lo0, hi0, lo1, hi1, ...)`` (the region
    format of the stencil kernels). The rim is ``rim_width`` cells thick per axis (default: the ghost
    width, the reach of a stencil that fits the halo); along an axis with zero width there is no rim::

        2D, rim 1:  +-----------+   slab 0: top rows     (full width)
                    |   slab 0  |   slab 1: bottom rows  (full width)
                    |s|       |s|   slab 2: left columns (between the row slabs)
                    |2| inter |3|   slab 3: right columns
                    |s|       |s|
                    |   slab 1  |
                    +-----------+

    Returns
    -------
    interior : tuple of int, or None when the block is too thin to have one
    rim : list of tuple of int, non-empty slabs covering owned minus interior
    """
    rim_width = tuple(halo_width if rim_width is None else rim_width)
    lo = [w for w in halo_width]
    hi = [w + n for w, n in zip(halo_width, local_shape)]
    inner_lo = [l + r for l, r in zip(lo, rim_width)]
    inner_hi = [h - r for h, r in zip(hi, rim_width)]
    rim = []
    current_lo, current_hi = list(lo), list(hi)
    for axis, r in enumerate(rim_width):
        if r == 0:
            continue
        for a, b in ((current_lo[axis], min(inner_lo[axis], current_hi[axis])),
                     (max(inner_hi[axis], inner_lo[axis], current_lo[axis]), current_hi[axis])):
            if b > a:
                slab_lo, slab_hi = list(current_lo), list(current_hi)
                slab_lo[axis], slab_hi[axis] = a, b
                if all(h > l for l, h in zip(slab_lo, slab_hi)):
                    rim.append(tuple(v for pair in zip(slab_lo, slab_hi) for v in pair))
        current_lo[axis] = min(inner_lo[axis], current_hi[axis])
        current_hi[axis] = max(inner_hi[axis], current_lo[axis])
    interior = tuple(v for pair in zip(current_lo, current_hi) for v in pair)
    if any(h <= l for l, h in zip(current_lo, current_hi)):
        interior = None
    return interior, rim

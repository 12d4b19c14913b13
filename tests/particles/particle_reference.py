"""Serial references for :mod:`hpcgpu.particles`: owners, periodic images and ghost shells, by brute force.

Written independently of the package: owners by testing every block of every axis, ghosts by trying all
27 periodic images of every particle of the whole system. A sub-box along an axis of length ``L`` cut
into ``P`` blocks is ``[L c / P, L (c + 1) / P)``, the last upper edge ``L`` exactly::

    x:  0        L/3        2L/3         L
        | c = 0   | c = 1    | c = 2     |

Positions are compared with the edges rounded to the positions' dtype, the package's documented rule.
"""

from __future__ import annotations

import itertools

import numpy as np


def process_grids(n_ranks: int) -> list[tuple[int, int, int]]:
    """Every ``(Px, Py, Pz)`` with ``Px * Py * Pz == n_ranks``, e.g. 4 -> (1, 1, 4), (1, 2, 2), ... (4, 1, 1)."""
    return [dims for dims in itertools.product(range(1, n_ranks + 1), repeat=3) if np.prod(dims) == n_ranks]


def block_edges(length: float, n_blocks: int, block: int) -> tuple[float, float]:
    """``(lower, upper)`` of block ``block`` of ``n_blocks`` along an axis of ``length`` (float64)."""
    upper = length if block == n_blocks - 1 else length * (block + 1) / n_blocks
    return length * block / n_blocks, upper


def owner_blocks(positions: np.ndarray, box, dims) -> np.ndarray:
    """Block coordinates ``(cx, cy, cz)`` of every position, shape (n, 3), int64; -1 where none holds it.

    Each block of each axis is tested in turn (``lower <= x < upper``, edges in the positions' dtype).
    """
    positions = np.asarray(positions)
    coords = np.full(positions.shape, -1, dtype=np.int64)
    for axis in range(3):
        for block in range(dims[axis]):
            lower, upper = (np.asarray(edge).astype(positions.dtype) for edge in block_edges(box[axis], dims[axis],
                                                                                               block))
            inside = (positions[:, axis] >= lower) & (positions[:, axis] < upper)
            assert not np.any(inside & (coords[:, axis] >= 0)), "two blocks hold one position"
            coords[inside, axis] = block
    return coords


def wrap(positions: np.ndarray, box) -> np.ndarray:
    """Positions folded into ``[0, L)`` per axis, in their own dtype (a rounded ``L`` folds to 0)."""
    box = np.asarray(box, dtype=np.float64).astype(positions.dtype)
    wrapped = positions - np.floor(positions / box) * box
    return np.where(wrapped >= box, wrapped - box, np.where(wrapped < 0, wrapped + box, wrapped))


def ghost_shell(positions: np.ndarray, ids: np.ndarray, box, lower, upper, width: float):
    """What a sub-box ``[lower, upper)`` must see as ghosts: the periodic images of every particle of the
    system inside ``[lower - width, upper + width)``, except the particles it owns themselves.

    Parameters
    ----------
    positions : numpy.ndarray, shape (n, 3) -- every particle of the system, wrapped into the box
    ids : numpy.ndarray, shape (n,), int64
    box, lower, upper : array_like, shape (3,), float64
    width : float -- ghost shell thickness

    Returns
    -------
    ids : numpy.ndarray, shape (n_ghost,)
    positions : numpy.ndarray, shape (n_ghost, 3) -- ``position + shift``, summed in the positions' dtype
    shifts : numpy.ndarray, shape (n_ghost, 3), float64 -- the periodic shift of each image (multiples of L)
    """
    box, lower, upper = (np.asarray(v, dtype=np.float64) for v in (box, lower, upper))
    dtype = positions.dtype
    low_shell, high_shell, low_box, high_box = ((v).astype(dtype) for v in
                                                (lower - width, upper + width, lower, upper))
    found_ids, found_positions, found_shifts = [], [], []
    for image in itertools.product((-1, 0, 1), repeat=3):
        shift = np.asarray(image, dtype=np.float64) * box
        moved = positions + shift.astype(dtype)
        in_shell = np.all((moved >= low_shell) & (moved < high_shell), axis=1)
        if not any(image):
            in_shell &= ~np.all((moved >= low_box) & (moved < high_box), axis=1)   # owned, not a ghost
        found_ids.append(ids[in_shell])
        found_positions.append(moved[in_shell])
        found_shifts.append(np.repeat(shift[None, :], int(in_shell.sum()), axis=0))
    return np.concatenate(found_ids), np.concatenate(found_positions), np.concatenate(found_shifts)


def sorted_rows(ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rows ``(id, x, y, z)`` in float64, sorted lexicographically: compares two sets of ghosts."""
    table = np.column_stack([ids.astype(np.float64), positions.astype(np.float64)])
    return table[np.lexsort(table.T[::-1])]

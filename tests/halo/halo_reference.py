"""A NumPy reference for halo exchange: what every ghost cell must hold."""

from __future__ import annotations

import numpy as np


def expected_padded(global_array: np.ndarray, grid, halo_width, untouched=np.nan):
    """The padded local array a rank must hold after an exchange with corners.

    Ghost cells beyond a non-periodic edge keep ``untouched`` (the exchange does not write them).
    Returns (expected, mask) where mask is False on cells that are not checked.
    """
    pad = [(w, w) for w in halo_width]
    wrapped = np.pad(global_array, pad, mode="wrap")
    valid = np.ones(global_array.shape, dtype=bool)
    valid = np.pad(valid, pad, mode="constant", constant_values=False)
    for axis, periodic in enumerate(grid.periodic):
        if periodic:
            # periodic axes: the wrapped ghost layers along this axis are valid
            valid = np.logical_or(valid, _wrapped_valid(valid, axis, halo_width[axis]))
    selection = tuple(slice(s, e + 2 * w) for s, e, w in zip(grid.local_start, grid.local_stop, halo_width))
    expected = wrapped[selection].copy()
    mask = valid[selection]
    expected[~mask] = untouched
    return expected, mask


def _wrapped_valid(valid: np.ndarray, axis: int, width: int) -> np.ndarray:
    """Validity after filling the ghost layers of one periodic axis from the opposite side."""
    result = valid.copy()
    if width == 0:
        return result
    n = valid.shape[axis] - 2 * width
    src_low = [slice(None)] * valid.ndim
    src_high = [slice(None)] * valid.ndim
    dst_low = [slice(None)] * valid.ndim
    dst_high = [slice(None)] * valid.ndim
    dst_low[axis], src_low[axis] = slice(0, width), slice(n, n + width)
    dst_high[axis], src_high[axis] = slice(n + width, n + 2 * width), slice(width, 2 * width)
    result[tuple(dst_low)] = valid[tuple(src_low)]
    result[tuple(dst_high)] = valid[tuple(src_high)]
    return result

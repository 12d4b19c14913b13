"""Free-slip wall ghost rows of the channel (y = 0 and y = Ly).

Only the physical walls are filled here; x-periodicity and the ghosts between tiles come from the
halo exchange, which must run *first*: the wall ghost rows are mirrors of whole owned rows, x ghost
columns included, so the corners are right once the owned rows' x ghosts are.

South wall, halo width 2 (padded row indices on the left; ``w`` = halo width = first owned row)::

    row w+1   h1 u1    v2           owned
    row w     h0 u0    v1           owned  (v0 = 0 lies on its south face: the wall)
    ---------------------------- y = 0, v[w] = 0
    row w-1   h0 u0   -v1           ghost  (mirror of row w)
    row w-2   h1 u1   -v2           ghost  (mirror of row w+1)

h and u (cell-centre rows) are mirrored (even), so du/dy = 0 on the wall: no stress, free slip.
v is odd about the wall face, so v = 0 on it. The north wall is the same picture upside down; its
wall face is the v face of the first ghost row above the last owned row.
"""

from __future__ import annotations

from typing import Any


def fill_channel_boundaries(
    h: Any, u: Any, v: Any, halo_width: int, at_south: bool, at_north: bool
) -> None:
    """Fill the ghost rows beyond the channel walls (free slip), in place; returns None.

    Parameters
    ----------
    h, u, v : array, shape (n_rows + 2*halo_width, n_cols + 2*halo_width)
        Padded local fields (NumPy or CuPy), axis order (y, x); x ghosts of the owned rows already
        filled by the halo exchange.
    halo_width : int
        Ghost width w >= 1 of the arrays.
    at_south, at_north : bool
        Whether this tile's owned rows touch the south (y = 0) or north (y = Ly) wall. A tile that
        touches neither is left untouched.
    """
    if halo_width < 1:
        raise ValueError(f"halo_width must be >= 1 for walls; found {halo_width}.")
    shapes = {a.shape for a in (h, u, v)}
    if len(shapes) != 1 or len(h.shape) != 2:
        raise ValueError(
            f"h, u, v must be 2D padded arrays of one shape; found shapes {[a.shape for a in (h, u, v)]}."
        )
    n_padded_rows = h.shape[0]
    w = halo_width
    n_rows = n_padded_rows - 2 * w
    if n_rows < w:
        raise ValueError(
            f"A tile needs at least halo_width={w} owned rows to mirror into its wall ghosts; "
            f"found {n_rows}. Use fewer ranks along y."
        )
    if at_south:
        for k in range(1, w + 1):
            h[w - k, :] = h[w + k - 1, :]
            u[w - k, :] = u[w + k - 1, :]
            v[w - k, :] = -v[w + k, :]
        v[w, :] = 0
    if at_north:
        top = w + n_rows  # padded row whose v face is the north wall
        for k in range(1, w + 1):
            h[top + k - 1, :] = h[top - k, :]
            u[top + k - 1, :] = u[top - k, :]
        v[top, :] = 0
        for k in range(1, w):
            v[top + k, :] = -v[top - k, :]

"""Integral diagnostics and Williamson error norms of one tile, as additive local sums.

With the scheme's cell area ``A_j = a^2 cos(lat_j) dlon dlat`` (see :mod:`apps.stencil.sphere.stage`)::

    mass                = sum h A                                                   [m^3]
    energy              = sum A [h K + g (h + h_s)^2 / 2 - g h_s^2 / 2]              [m^5/s^2]
    potential_enstrophy = sum_corners A' h_q q^2 / 2    (A' = a^2 cos(lat_face) dlon dlat, 0 at poles)

with K the scheme's cell kinetic energy. Energies per unit density. The model allreduces ("sum").
Williamson et al. (1992) normalised errors use the area-weighted integral I::

    l1 = I|h - h_T| / I|h_T|,   l2 = sqrt(I (h - h_T)^2) / sqrt(I h_T^2),   linf = max|h - h_T| / max|h_T|

:func:`local_error_sums` returns the additive pieces (sums and maxima).
"""

from __future__ import annotations

import numpy as np

from apps.stencil.sphere.parameters import SphereTile

DIAGNOSTIC_NAMES = ("mass", "energy", "potential_enstrophy")


def _owned(params: SphereTile):
    w = params.halo_width
    return slice(w, w + params.n_rows), slice(w, w + params.n_columns)


def cell_areas(params: SphereTile) -> np.ndarray:
    """Area of the owned cells' rows, shape (n_rows, 1), m^2 (float64)."""
    rows, _ = _owned(params)
    cos = np.asarray(params.cos_center, dtype=np.float64)[rows]
    return (params.radius**2 * params.dlon * params.dlat * cos)[:, None]


def local_diagnostics(h, u, v, params: SphereTile) -> dict:
    """Local sums of :data:`DIAGNOSTIC_NAMES` over owned cells (ghosts filled), NumPy arrays."""
    rows, columns = _owned(params)
    w = params.halo_width
    j0, j1, i0, i1 = rows.start, rows.stop, columns.start, columns.stop
    h64, u64, v64 = (np.asarray(a, dtype=np.float64) for a in (h, u, v))
    area = cell_areas(params)
    cos_face = np.asarray(params.cos_face, dtype=np.float64)
    rcos = np.asarray(params.rcos_center, dtype=np.float64)
    hs = np.asarray(params.topography, dtype=np.float64)[rows, columns]
    depth = h64[rows, columns]
    u2, v2 = u64 * u64, v64 * v64
    kinetic = 0.25 * ((u2[j0:j1, i0:i1] + u2[j0:j1, i0 + 1:i1 + 1])
                      + (v2[j0:j1, i0:i1] * cos_face[j0:j1, None] + v2[j0 + 1:j1 + 1, i0:i1] * cos_face[j0 + 1:j1 + 1, None]) * rcos[j0:j1, None])  # fmt: skip
    g = params.gravity
    energy = float(np.sum(area * (depth * kinetic + 0.5 * g * ((depth + hs) ** 2 - hs * hs))))
    # Corners: owned rows (the north pole corner row has zero area and is skipped).
    rdx_face = np.asarray(params.rdx_face, dtype=np.float64)[j0:j1, None]
    rdy_face = np.asarray(params.rdy_face, dtype=np.float64)[j0:j1, None]
    cos_c = np.asarray(params.cos_center, dtype=np.float64)
    zeta = (v64[j0:j1, i0:i1] - v64[j0:j1, i0 - 1:i1 - 1]) * rdx_face - (
        u64[j0:j1, i0:i1] * cos_c[j0:j1, None] - u64[j0 - 1:j1 - 1, i0:i1] * cos_c[j0 - 1:j1 - 1, None]) * rdy_face
    h_corner = 0.25 * ((h64[j0 - 1:j1 - 1, i0 - 1:i1 - 1] + h64[j0 - 1:j1 - 1, i0:i1]) + (h64[j0:j1, i0 - 1:i1 - 1] + h64[j0:j1, i0:i1]))
    q = (np.asarray(params.coriolis, dtype=np.float64)[j0:j1, i0:i1] + zeta) / h_corner
    corner_area = params.radius**2 * params.dlon * params.dlat * cos_face[j0:j1, None]
    enstrophy = float(np.sum(corner_area * 0.5 * h_corner * q * q))
    del w
    return {"mass": float(np.sum(area * depth)), "energy": energy, "potential_enstrophy": enstrophy}


def local_error_sums(h, exact_owned, params: SphereTile) -> dict:
    """Additive pieces of the Williamson norms of h against ``exact_owned`` (shape of the owned cells).

    Keys: ``abs_error``, ``abs_exact``, ``sq_error``, ``sq_exact`` (area-weighted sums, reduce with
    "sum") and ``max_error``, ``max_exact`` (reduce with "max").
    """
    rows, columns = _owned(params)
    area = cell_areas(params)
    error = np.asarray(h, dtype=np.float64)[rows, columns] - exact_owned
    return {"abs_error": float(np.sum(area * np.abs(error))), "abs_exact": float(np.sum(area * np.abs(exact_owned))),
            "sq_error": float(np.sum(area * error * error)), "sq_exact": float(np.sum(area * exact_owned * exact_owned)),
            "max_error": float(np.max(np.abs(error))), "max_exact": float(np.max(np.abs(exact_owned)))}  # fmt: skip


def error_norms(sums: dict) -> dict:
    """l1, l2, linf from globally reduced :func:`local_error_sums`."""
    return {"l1": sums["abs_error"] / sums["abs_exact"], "l2": float(np.sqrt(sums["sq_error"] / sums["sq_exact"])),
            "linf": sums["max_error"] / sums["max_exact"]}  # fmt: skip

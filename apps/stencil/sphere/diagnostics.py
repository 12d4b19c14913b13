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

from apps.stencil.sphere.diagnostics_gpu import local_diagnostics_gpu
from apps.stencil.sphere.parameters import SphereTile
from hpcgpu.arch import array_module, is_device_array

DIAGNOSTIC_NAMES = ("mass", "energy", "potential_enstrophy")


def _owned(params: SphereTile):
    w = params.halo_width
    return slice(w, w + params.n_rows), slice(w, w + params.n_columns)


def cell_areas(params: SphereTile) -> np.ndarray:
    """Area of the owned cells' rows, shape (n_rows, 1), m^2 (float64, in the tile's array library)."""
    rows, _ = _owned(params)
    xp = array_module(params.cos_center)
    cos = xp.asarray(params.cos_center, dtype=np.float64)[rows]
    return (params.radius**2 * params.dlon * params.dlat * cos)[:, None]


def local_diagnostics(h, u, v, params: SphereTile) -> dict:
    """Local sums of :data:`DIAGNOSTIC_NAMES` over owned cells (ghosts filled); Python floats.

    ``h, u, v`` (padded, shape (n_rows + 2w, n_columns + 2w)) and the tile arrays are NumPy, or CuPy:
    then one fused kernel and three device sums in float64
    (:func:`apps.stencil.sphere.diagnostics_gpu.local_diagnostics_gpu`, bitwise the values of these
    expressions evaluated with CuPy) and one host synchronisation.
    """
    if is_device_array(h):
        return local_diagnostics_gpu(h, u, v, params)
    return _local_diagnostics_arrays(h, u, v, params)


def _local_diagnostics_arrays(h, u, v, params: SphereTile) -> dict:
    """:func:`local_diagnostics` as array expressions of NumPy or CuPy (the reference of the GPU kernel)."""
    xp = array_module(h)
    rows, columns = _owned(params)
    w = params.halo_width
    j0, j1, i0, i1 = rows.start, rows.stop, columns.start, columns.stop
    h64, u64, v64 = (xp.asarray(a, dtype=xp.float64) for a in (h, u, v))
    area = cell_areas(params)
    cos_face = xp.asarray(params.cos_face, dtype=xp.float64)
    rcos = xp.asarray(params.rcos_center, dtype=xp.float64)
    hs = xp.asarray(params.topography, dtype=xp.float64)[rows, columns]
    depth = h64[rows, columns]
    u2, v2 = u64 * u64, v64 * v64
    kinetic = 0.25 * ((u2[j0:j1, i0:i1] + u2[j0:j1, i0 + 1:i1 + 1])
                      + (v2[j0:j1, i0:i1] * cos_face[j0:j1, None] + v2[j0 + 1:j1 + 1, i0:i1] * cos_face[j0 + 1:j1 + 1, None]) * rcos[j0:j1, None])  # fmt: skip
    g = params.gravity
    energy = float(xp.sum(area * (depth * kinetic + 0.5 * g * ((depth + hs) ** 2 - hs * hs))))
    # Corners: owned rows (the north pole corner row has zero area and is skipped).
    rdx_face = xp.asarray(params.rdx_face, dtype=xp.float64)[j0:j1, None]
    rdy_face = xp.asarray(params.rdy_face, dtype=xp.float64)[j0:j1, None]
    cos_c = xp.asarray(params.cos_center, dtype=xp.float64)
    zeta = (v64[j0:j1, i0:i1] - v64[j0:j1, i0 - 1:i1 - 1]) * rdx_face - (
        u64[j0:j1, i0:i1] * cos_c[j0:j1, None] - u64[j0 - 1:j1 - 1, i0:i1] * cos_c[j0 - 1:j1 - 1, None]) * rdy_face
    h_corner = 0.25 * ((h64[j0 - 1:j1 - 1, i0 - 1:i1 - 1] + h64[j0 - 1:j1 - 1, i0:i1]) + (h64[j0:j1, i0 - 1:i1 - 1] + h64[j0:j1, i0:i1]))
    q = (xp.asarray(params.coriolis, dtype=xp.float64)[j0:j1, i0:i1] + zeta) / h_corner
    corner_area = params.radius**2 * params.dlon * params.dlat * cos_face[j0:j1, None]
    enstrophy = float(xp.sum(corner_area * 0.5 * h_corner * q * q))
    del w
    return {"mass": float(xp.sum(area * depth)), "energy": energy, "potential_enstrophy": enstrophy}


def local_error_sums(h, exact_owned, params: SphereTile) -> dict:
    """Additive pieces of the Williamson norms of h against ``exact_owned`` (shape of the owned cells).

    Keys: ``abs_error``, ``abs_exact``, ``sq_error``, ``sq_exact`` (area-weighted sums, reduce with
    "sum") and ``max_error``, ``max_exact`` (reduce with "max").
    """
    rows, columns = _owned(params)
    area = _host(cell_areas(params))
    error = _host(h[rows, columns]).astype(np.float64) - exact_owned
    return {"abs_error": float(np.sum(area * np.abs(error))), "abs_exact": float(np.sum(area * np.abs(exact_owned))),
            "sq_error": float(np.sum(area * error * error)), "sq_exact": float(np.sum(area * exact_owned * exact_owned)),
            "max_error": float(np.max(np.abs(error))), "max_exact": float(np.max(np.abs(exact_owned)))}  # fmt: skip


def _host(array) -> np.ndarray:
    return array.get() if is_device_array(array) else np.asarray(array)


def error_norms(sums: dict) -> dict:
    """l1, l2, linf from globally reduced :func:`local_error_sums`."""
    return {"l1": sums["abs_error"] / sums["abs_exact"], "l2": float(np.sqrt(sums["sq_error"] / sums["sq_exact"])),
            "linf": sums["max_error"] / sums["max_exact"]}  # fmt: skip


def wave_phase_shift(row_before, row_after, wavenumber: int, expected_shift: float) -> float:
    """Eastward shift in rad of zonal wavenumber ``wavenumber`` between two latitude rows of h.

    The phase of a wavenumber-k pattern is known modulo 2 pi / k: the shift nearest ``expected_shift``
    (rad) is returned.
    """
    before = np.fft.rfft(np.asarray(row_before, dtype=np.float64))[wavenumber]
    after = np.fft.rfft(np.asarray(row_after, dtype=np.float64))[wavenumber]
    shift = -float(np.angle(after / before)) / wavenumber
    period = 2.0 * np.pi / wavenumber
    return shift + round((expected_shift - shift) / period) * period


def rossby_haurwitz_drift(model, latitude_deg: float = 45.0) -> dict:
    """Collective: drift of the case-6 wavenumber-4 pattern of h at ``latitude_deg`` since t = 0.

    Returns (on every rank) ``days``, ``measured_deg_per_day``, ``haurwitz_deg_per_day`` (the
    nondivergent Haurwitz 1940 speed of :func:`apps.stencil.sphere.initial_conditions.williamson6`)
    and ``ratio_to_haurwitz``.
    """
    p = model.parameters
    speed = model.initial.rossby_haurwitz_speed
    if speed is None:
        raise ValueError(f"rossby_haurwitz_drift needs --init williamson6; this model runs {model.init_name}.")
    h = model.fields[0].gather(root=0)
    result = None
    if model.comm.rank == 0:
        latitudes = p.center_latitudes(np.arange(p.ny))
        row = int(np.argmin(np.abs(latitudes - np.radians(latitude_deg))))
        longitudes = (np.arange(p.nx) + 0.5) * p.dlon
        initial_row = model.initial.depth(longitudes, np.full(p.nx, latitudes[row]))
        seconds = model.time
        shift = wave_phase_shift(initial_row, h[row], 4, speed * seconds)
        per_day = np.degrees(1.0) * 86400.0 / seconds
        result = {"days": seconds / 86400.0, "latitude_deg": float(np.degrees(latitudes[row])),
                  "measured_deg_per_day": shift * per_day, "haurwitz_deg_per_day": speed * seconds * per_day,
                  "ratio_to_haurwitz": shift / (speed * seconds)}  # fmt: skip
    return model.comm.broadcast(result)

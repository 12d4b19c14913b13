"""Grid metrics: what the one set of discrete equations needs to know about a grid.

Both grids of the shallow-water core are logically rectangular C-grids, periodic in x (longitude)
and closed at the south and north (channel walls, or the zero-length faces at the poles). Their
geometry enters the scheme only through per-row factors and two per-point fields, so the discrete
equations of :mod:`apps.stencil.swe_scheme.stage` are written once with them:

====================  ==========================================  =================  ===============
name (per padded row)  meaning                                     channel            lat-lon
====================  ==========================================  =================  ===============
``cos_center``         area factor of the centre row                1                  cos(lat_j)
``rcos_center``        its inverse                                  1                  1 / cos(lat_j)
``rdx_center``         1 / zonal spacing at h and u points, 1/m     1 / dx             1/(a cos dlon)
``rdy_center``         1 / meridional spacing at h points, 1/m      1 / dy             1/(a cos dlat)
``cos_face``           length factor of the v face                  1                  cos(lat_face)
``rdx_face``           1 / zonal spacing at corners, 1/m            1 / dx             1/(a cos' dlon)
``rdy_face``           1 / meridional spacing at corners, 1/m       1 / dy             1/(a cos' dlat)
``v_face_mask``        1 where the v face may move, else 0          0 on the walls     0 on the poles
====================  ==========================================  =================  ===============

plus ``coriolis`` (f at the vorticity corners: one value per row on the beta plane, one per corner
on the sphere), ``topography`` (bottom height at the centres; ``None`` is a flat bottom) and the
scalar ``rdy`` (1 / meridional spacing at v points). With unit factors, ``h + 0`` and f per row the
lat-lon expressions *are* the channel's, bit for bit (``x * 1`` and ``x + 0`` are exact in IEEE
arithmetic for every x but -0, and depths are positive).

Every array is evaluated in float64 on the host from *global* indices and only then cast, so each
decomposition sees bitwise the same values at the same global point.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ROW_ARRAYS = ("cos_center", "rcos_center", "rdx_center", "rdy_center", "cos_face", "rdx_face", "rdy_face", "v_face_mask")
"""The per-row metric arrays, in the order the kernels take them."""


@dataclasses.dataclass(frozen=True, eq=False)
class GridMetrics:
    """The metric terms of one tile (build it with :func:`channel_metrics` or :func:`latlon_metrics`).

    Attributes
    ----------
    cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask : array
        Shape (n_rows + 2w,), field dtype, on the fields' device (see the module docstring).
    coriolis : array
        f at the south-west corners in 1/s: shape (n_rows + 2w,) (one value per row) or
        (n_rows + 2w, n_columns + 2w) (one per corner).
    topography : array or None
        Bottom height at the cell centres in m, shape (n_rows + 2w, n_columns + 2w); None: flat.
    unfiltered_rows : int8 array, shape (n_rows + 2w,)
        Zeros: the ``filtered_rows`` of a grid without a polar filter.
    gravity : float
        g in m/s^2.
    rdy : float
        1 / meridional spacing at the v points, 1/m.
    rdx, rdx2, rdy2 : float
        ``1/dx``, ``1/dx^2`` and ``1/dy^2`` of a uniform grid (0 otherwise): the Laplacians of the
        (hyper)viscosity are those of a uniform grid.
    viscosity, hyperviscosity : float
        nu in m^2/s and nu4 in m^4/s (0 switches each off; uniform grids only).
    uniform : bool
        True for the channel's metrics (unit factors, f per row, flat bottom): the fast GPU kernels
        of :mod:`apps.stencil.swe_scheme.cuda_uniform` apply.
    dtype : numpy.dtype
        float64 or float32, the fields' dtype.
    coriolis_by_row : bool
        True when a per-corner ``coriolis`` is constant along every padded row (a grid whose rotation
        axis is the polar axis): the GPU stage reads one value per row. Exact equality, in ``dtype``.
    flat : bool
        True when every value of ``topography`` is zero: the GPU stage does not read it.
    """

    cos_center: Any
    rcos_center: Any
    rdx_center: Any
    rdy_center: Any
    cos_face: Any
    rdx_face: Any
    rdy_face: Any
    v_face_mask: Any
    coriolis: Any
    topography: Any
    unfiltered_rows: Any
    gravity: float
    rdy: float
    rdx: float
    rdx2: float
    rdy2: float
    viscosity: float
    hyperviscosity: float
    uniform: bool
    dtype: np.dtype
    coriolis_by_row: bool = False
    flat: bool = False

    @property
    def stencil_reach(self) -> int:
        """How far (cells) the stage reads around an updated cell: 2 with hyperviscosity, else 1."""
        return 2 if self.hyperviscosity > 0 else 1

    def row_arrays(self) -> tuple:
        """The per-row arrays in the order of :data:`ROW_ARRAYS`."""
        return tuple(getattr(self, name) for name in ROW_ARRAYS)

    def arrays(self) -> tuple:
        """Every array of the metrics (the validation cache keys on them)."""
        return (*self.row_arrays(), self.coriolis, self.topography, self.unfiltered_rows)


def _cast(values: Any, dtype: np.dtype, xp: Any) -> Any:
    return xp.asarray(np.ascontiguousarray(values, dtype=np.float64).astype(dtype))


def channel_metrics(
    dx: float, dy: float, coriolis_rows: Any, v_face_mask: Any, gravity: float,
    viscosity: float = 0.0, hyperviscosity: float = 0.0, xp: Any = np, dtype: Any = np.float64,
) -> GridMetrics:  # fmt: skip
    """Metrics of a uniform Cartesian grid (the beta-plane channel).

    Parameters
    ----------
    dx, dy : float
        Cell size in m.
    coriolis_rows : array, shape (n_rows + 2w,)
        f at the corners of each padded row, 1/s, already in ``dtype`` on the fields' device.
    v_face_mask : array, shape (n_rows + 2w,)
        1 on the v faces strictly between the walls, 0 on and beyond them (``dtype``, device).
    gravity, viscosity, hyperviscosity : float
        g in m/s^2, nu in m^2/s, nu4 in m^4/s.
    xp, dtype
        Where the arrays live (numpy or cupy) and the fields' dtype.
    """
    dtype = np.dtype(dtype)
    n_rows = int(coriolis_rows.shape[0])
    ones = np.ones(n_rows)
    return GridMetrics(
        cos_center=_cast(ones, dtype, xp), rcos_center=_cast(ones, dtype, xp),
        rdx_center=_cast(np.full(n_rows, 1.0 / dx), dtype, xp), rdy_center=_cast(np.full(n_rows, 1.0 / dy), dtype, xp),
        cos_face=_cast(ones, dtype, xp), rdx_face=_cast(np.full(n_rows, 1.0 / dx), dtype, xp),
        rdy_face=_cast(np.full(n_rows, 1.0 / dy), dtype, xp), v_face_mask=v_face_mask,
        coriolis=coriolis_rows, topography=None, unfiltered_rows=xp.zeros(n_rows, dtype=np.int8),
        gravity=float(gravity), rdy=1.0 / dy, rdx=1.0 / dx, rdx2=1.0 / (dx * dx), rdy2=1.0 / (dy * dy),
        viscosity=float(viscosity), hyperviscosity=float(hyperviscosity), uniform=True, dtype=dtype,
    )  # fmt: skip


def latlon_metrics(
    radius: float, dlon: float, dlat: float, cos_center: np.ndarray, cos_face: np.ndarray, inside: np.ndarray,
    coriolis: np.ndarray, topography: np.ndarray, gravity: float, xp: Any = np, dtype: Any = np.float64,
) -> GridMetrics:  # fmt: skip
    """Metrics of a latitude-longitude grid from float64 host values (cast once, here).

    Parameters
    ----------
    radius, dlon, dlat : float
        a in m; spacings in rad.
    cos_center : float64 array, shape (n_rows + 2w,)
        cos of the centre latitudes (mirrored beyond the poles, > 0).
    cos_face : float64 array, shape (n_rows + 2w,)
        cos of the v-face latitudes, 0 on the pole faces and beyond.
    inside : bool array, shape (n_rows + 2w,)
        True where the v face lies strictly between the poles.
    coriolis, topography : float64 arrays, shape (n_rows + 2w, n_columns + 2w)
        f at the corners in 1/s and h_s at the centres in m.
    gravity : float
        g in m/s^2.
    xp, dtype
        Where the arrays live and the fields' dtype.
    """
    dtype = np.dtype(dtype)
    coriolis_cast = np.ascontiguousarray(coriolis, dtype=np.float64).astype(dtype)
    topography_cast = np.ascontiguousarray(topography, dtype=np.float64).astype(dtype)
    safe_cos_face = np.where(inside, cos_face, 1.0)
    rdx_face = np.where(inside, 1.0 / (radius * safe_cos_face * dlon), 0.0)
    rdy_face = np.where(inside, 1.0 / (radius * safe_cos_face * dlat), 0.0)
    return GridMetrics(
        cos_center=_cast(cos_center, dtype, xp), rcos_center=_cast(1.0 / cos_center, dtype, xp),
        rdx_center=_cast(1.0 / (radius * cos_center * dlon), dtype, xp),
        rdy_center=_cast(1.0 / (radius * cos_center * dlat), dtype, xp),
        cos_face=_cast(cos_face, dtype, xp), rdx_face=_cast(rdx_face, dtype, xp), rdy_face=_cast(rdy_face, dtype, xp),
        v_face_mask=_cast(inside.astype(np.float64), dtype, xp), coriolis=_cast(coriolis, dtype, xp),
        topography=_cast(topography, dtype, xp), unfiltered_rows=xp.zeros(cos_center.shape[0], dtype=np.int8),
        gravity=float(gravity), rdy=1.0 / (radius * dlat), rdx=0.0, rdx2=0.0, rdy2=0.0,
        viscosity=0.0, hyperviscosity=0.0, uniform=False, dtype=dtype,
        coriolis_by_row=bool(np.all(coriolis_cast == coriolis_cast[:, :1])), flat=not np.any(topography_cast),
    )  # fmt: skip


__all__ = ["ROW_ARRAYS", "GridMetrics", "channel_metrics", "latlon_metrics"]

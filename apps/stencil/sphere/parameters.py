"""Physical and grid parameters of the shallow-water model on the sphere, and their per-tile form.

:class:`SphereParameters` holds what is the same on every rank (Earth constants, grid size, the
rotation angle ``alpha`` of the Coriolis pole and the polar-filter cutoff). :func:`tile_parameters`
turns it into :class:`SphereTile`, what one tile's kernels need: per *padded row* metric arrays and
two per padded cell arrays (Coriolis parameter at the vorticity corners, bottom topography at the
cell centres). Everything is evaluated in float64 on the host from *global* indices and only then
cast, so every decomposition sees bitwise the same values at the same global point.

Grid (global indices, ``dlon = 2 pi / nx``, ``dlat = pi / ny``)::

    h[j, i]  cell centre   lon = (i + 1/2) dlon,  lat = -pi/2 + (j + 1/2) dlat
    u[j, i]  west face     lon = i dlon,          lat = -pi/2 + (j + 1/2) dlat
    v[j, i]  south face    lon = (i + 1/2) dlon,  lat = -pi/2 + j dlat       (j = 0: south pole)
    q[j, i]  SW corner     lon = i dlon,          lat = -pi/2 + j dlat

There is no point *at* a pole: the v faces j = 0 and j = ny have zero length (cos = 0), v = 0 there.
Ghost rows beyond a pole are mirror images (boundary conditions of the halo exchange:
:meth:`apps.stencil.sphere.model.LatLonModel.physical_boundary_conditions`); their metric values are
the mirrored ones too, and every term that reads them is multiplied by an exact 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from apps.stencil.swe_scheme.metrics import GridMetrics, latlon_metrics
from hpcgpu.errors import ConfigurationError

EARTH_RADIUS = 6.37122e6
"""a in m (Williamson et al. 1992)."""
EARTH_OMEGA = 7.292e-5
"""Omega in 1/s."""
EARTH_GRAVITY = 9.80616
"""g in m/s^2."""
DEFAULT_FILTER_LATITUDE_DEG = 60.0
"""Polar-filter cutoff latitude in degrees (see :mod:`apps.stencil.sphere.polar_filter`)."""


@dataclasses.dataclass(frozen=True)
class SphereParameters:
    """Global parameters of the latitude-longitude model (identical on every rank).

    Parameters
    ----------
    nx, ny : int
        Cells in longitude (periodic) and latitude (pole to pole). ``nx = 2 ny`` gives square cells
        at the equator.
    radius, omega, gravity : float
        a in m, Omega in 1/s, g in m/s^2.
    alpha : float
        Angle in rad between the Coriolis pole and the grid's north pole (Williamson case 2 rotates
        the rotation axis with the flow): ``f = 2 Omega (-cos(lon) cos(lat) sin(alpha) + sin(lat) cos(alpha))``.
    filter_latitude : float
        Polar-filter cutoff in rad; poleward of it zonal waves are damped. ``pi/2`` disables it.
    """

    nx: int = 128
    ny: int = 64
    radius: float = EARTH_RADIUS
    omega: float = EARTH_OMEGA
    gravity: float = EARTH_GRAVITY
    alpha: float = 0.0
    filter_latitude: float = math.radians(DEFAULT_FILTER_LATITUDE_DEG)

    def __post_init__(self) -> None:
        for name in ("nx", "ny"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 4:
                raise ConfigurationError(f"SphereParameters.{name} must be an integer >= 4 (cells); found {value!r}.")
        for name in ("radius", "gravity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"SphereParameters.{name} must be positive and finite; found {value!r}.")
        if not 0 < self.filter_latitude <= math.pi / 2:
            raise ConfigurationError(
                f"filter_latitude must be in (0, pi/2] rad (pi/2 switches the polar filter off); found {self.filter_latitude!r}."
            )

    @property
    def dlon(self) -> float:
        """Longitude spacing in rad."""
        return 2.0 * math.pi / self.nx

    @property
    def dlat(self) -> float:
        """Latitude spacing in rad."""
        return math.pi / self.ny

    def center_latitudes(self, rows: np.ndarray) -> np.ndarray:
        """Latitude in rad of cell-centre rows (global indices, may lie beyond the poles)."""
        return -0.5 * math.pi + (np.asarray(rows, dtype=np.float64) + 0.5) * self.dlat

    def face_latitudes(self, rows: np.ndarray) -> np.ndarray:
        """Latitude in rad of the v faces / corners of global rows ``rows``."""
        return -0.5 * math.pi + np.asarray(rows, dtype=np.float64) * self.dlat

    def coriolis(self, lon: Any, lat: Any) -> Any:
        """f in 1/s at (lon, lat) in rad for the rotated rotation axis (angle ``alpha``)."""
        return 2.0 * self.omega * (-np.cos(lon) * np.cos(lat) * math.sin(self.alpha) + np.sin(lat) * math.cos(self.alpha))

    def cell_areas(self, rows: np.ndarray) -> np.ndarray:
        """Area in m^2 of one cell of each global row: ``a^2 cos(lat_j) dlon dlat`` (the scheme's area)."""
        return self.radius**2 * np.cos(self.center_latitudes(rows)) * self.dlon * self.dlat


@dataclasses.dataclass(frozen=True)
class SphereTile:
    """What the kernels of one tile need (build it with :func:`tile_parameters`).

    Per padded row ``j`` (arrays of shape (n_rows + 2w,), field dtype, on the fields' device):

    ``cos_center``       cos(lat_j) of the cell-centre row (mirrored beyond the poles, > 0)
    ``rcos_center``      1 / cos(lat_j)
    ``rdx_center``       1 / (a cos(lat_j) dlon), 1/m: zonal derivative at h and u points
    ``rdy_center``       1 / (a cos(lat_j) dlat), 1/m: meridional flux divergence at h points
    ``cos_face``         cos of the v-face latitude; exactly 0 on the pole faces (and beyond)
    ``rdx_face``         1 / (a cos dlon) at v faces / corners, 0 on pole faces
    ``rdy_face``         1 / (a cos dlat) at corners (vorticity), 0 on pole faces
    ``v_face_mask``      1 where the v face lies strictly between the poles, else 0

    Per padded cell (arrays of shape (n_rows + 2w, n_cols + 2w)): ``coriolis`` (f at the SW corner,
    1/s) and ``topography`` (bottom height h_s at the centre, m).

    These names read ``metrics``, the core's :class:`~apps.stencil.swe_scheme.metrics.GridMetrics`
    (what :func:`apps.stencil.sphere.stage.sphere_stage` passes to the core).
    """

    gravity: float
    radius: float
    dlon: float
    dlat: float
    halo_width: int
    row_start: int
    n_rows: int
    column_start: int
    n_columns: int
    n_rows_global: int
    n_columns_global: int
    dtype: np.dtype
    metrics: GridMetrics

    # The metric arrays are the core's (one copy): each name below reads ``metrics``.
    cos_center = property(lambda self: self.metrics.cos_center)
    rcos_center = property(lambda self: self.metrics.rcos_center)
    rdx_center = property(lambda self: self.metrics.rdx_center)
    rdy_center = property(lambda self: self.metrics.rdy_center)
    cos_face = property(lambda self: self.metrics.cos_face)
    rdx_face = property(lambda self: self.metrics.rdx_face)
    rdy_face = property(lambda self: self.metrics.rdy_face)
    v_face_mask = property(lambda self: self.metrics.v_face_mask)
    coriolis = property(lambda self: self.metrics.coriolis)
    topography = property(lambda self: self.metrics.topography)

    @property
    def at_south(self) -> bool:
        return self.row_start == 0

    @property
    def at_north(self) -> bool:
        return self.row_start + self.n_rows == self.n_rows_global

    @property
    def stencil_reach(self) -> int:
        return 1

    @property
    def rdy(self) -> float:
        """1 / (a dlat) in 1/m."""
        return 1.0 / (self.radius * self.dlat)


def mirrored_center_rows(rows: np.ndarray, ny: int) -> np.ndarray:
    """Global centre row seen beyond a pole: row -1-k mirrors row k, row ny+k mirrors ny-1-k."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = np.where(rows < 0, -1 - rows, rows)
    return np.where(rows >= ny, 2 * ny - 1 - rows, rows)


def tile_parameters(
    parameters: SphereParameters,
    row_start: int,
    n_rows: int,
    column_start: int,
    n_columns: int,
    halo_width: int = 1,
    topography_fn=None,
    xp: Any = np,
    dtype: Any = np.float64,
) -> SphereTile:
    """Build the kernel parameters of the tile owning rows/columns ``[start, start + n)``.

    Parameters
    ----------
    parameters : SphereParameters
    row_start, n_rows, column_start, n_columns : int
        Global index of the first owned cell and the owned extents.
    halo_width : int
        Ghost width w >= 1 of the padded arrays.
    topography_fn : callable, optional
        ``topography_fn(lon, lat) -> h_s`` in m at cell centres (rad arguments); None for a flat bottom.
    xp : module
        numpy or cupy (where the arrays live).
    dtype : float64 or float32
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ConfigurationError(f"The sphere kernels support float64 and float32; found {dtype}.")
    if halo_width < 1:
        raise ConfigurationError(f"halo_width must be >= 1 (stencil reach 1); found {halo_width}.")
    p = parameters
    if not (0 <= row_start and n_rows >= halo_width and row_start + n_rows <= p.ny):
        raise ConfigurationError(
            f"Owned rows [{row_start}, {row_start + n_rows}) must lie in [0, {p.ny}) with at least "
            f"halo_width={halo_width} rows (the pole mirror copies owned rows); use fewer ranks in latitude."
        )
    rows = np.arange(row_start - halo_width, row_start + n_rows + halo_width, dtype=np.int64)
    columns = np.arange(column_start - halo_width, column_start + n_columns + halo_width, dtype=np.int64)
    cos_center = np.cos(p.center_latitudes(mirrored_center_rows(rows, p.ny)))
    inside = (rows > 0) & (rows < p.ny)
    cos_face = np.where(inside, np.cos(p.face_latitudes(rows)), 0.0)
    lon_corner = columns * p.dlon
    lat_corner = p.face_latitudes(rows)
    coriolis = p.coriolis(lon_corner[None, :], lat_corner[:, None])
    if topography_fn is None:
        topography = np.zeros((rows.size, columns.size))
    else:
        lon_center = (columns + 0.5) * p.dlon
        lat_center = p.center_latitudes(mirrored_center_rows(rows, p.ny))
        topography = np.broadcast_to(topography_fn(lon_center[None, :], lat_center[:, None]), (rows.size, columns.size))
    metrics = latlon_metrics(p.radius, p.dlon, p.dlat, cos_center, cos_face, inside, coriolis, topography, p.gravity,
                             xp=xp, dtype=dtype)
    return SphereTile(
        gravity=p.gravity, radius=p.radius, dlon=p.dlon, dlat=p.dlat, halo_width=int(halo_width),
        row_start=int(row_start), n_rows=int(n_rows), column_start=int(column_start), n_columns=int(n_columns),
        n_rows_global=p.ny, n_columns_global=p.nx, dtype=dtype, metrics=metrics,
    )  # fmt: skip

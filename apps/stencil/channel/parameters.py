"""Physical and grid parameters of the shallow-water channel, and their per-tile form.

:class:`SWEParameters` holds what is the same on every rank (gravity, depth, rotation, grid spacing,
global size, dissipation). :func:`tile_parameters` turns it into :class:`TileParameters`, what one
tile's kernels need: the scalars plus two *per padded row* arrays, the Coriolis parameter at the
vorticity points and the mask of the v faces that may move. Both arrays are computed from *global*
row indices, in float64 on the host, and only then cast, so every decomposition of the channel sees
bitwise the same values on the same global row.

Beta plane
----------
``f(y) = f0 + beta * (y - Ly/2)``: the reference latitude of the beta plane is the channel's centre
line ``y = Ly/2``, where ``f = f0``. The defaults ``f0 = 2e-4 1/s`` and ``beta = 2e-11 1/(m s)`` are
an idealised planet: ``f0`` exceeds Earth's largest value ``2 Omega = 1.458e-4 1/s``. They match a
planet of radius ``a = 10 000 km`` turning with ``Omega = 1.414e-4 1/s`` (about twice Earth's rate)
at the reference latitude 45 N, where ``f0 = 2 Omega sin(45)`` and ``beta = 2 Omega cos(45) / a``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from apps.stencil.swe_scheme.metrics import GridMetrics, channel_metrics
from hpcgpu.errors import ConfigurationError


@dataclasses.dataclass(frozen=True)
class SWEParameters:
    """Global parameters of the beta-plane channel (identical on every rank).

    Parameters
    ----------
    nx, ny : int
        Global number of cells in x (periodic) and y (between the walls).
    dx, dy : float
        Cell size in m.
    gravity : float
        g in m/s^2.
    mean_depth : float
        Resting fluid depth H in m.
    coriolis_f0 : float
        Coriolis parameter f0 at the channel centre line y = Ly/2, in 1/s.
    beta : float
        df/dy in 1/(m s).
    viscosity : float
        Laplacian viscosity nu in m^2/s, applied to u and v (0 switches it off).
    hyperviscosity : float
        Biharmonic viscosity nu4 in m^4/s, applied as ``-nu4 * del^4`` to u and v (0 switches it
        off). Needs a halo width of 2. The default damps the grid-scale mode (2 dx waves in x and y)
        at the rate 64 nu4/dx^4 = 1/(2.7 h) at dx = 5 km, removing the grid noise of the enstrophy
        cascade (a 4x weaker value left visible 2 dx hatching in the eddies of the default jet),
        while a 50 km scale (k = 1/L) decays on nu4 k^4 = 1/(200 years): the jet is untouched.
    """

    nx: int = 360
    ny: int = 180
    dx: float = 5.0e3
    dy: float = 5.0e3
    gravity: float = 9.81
    mean_depth: float = 100.0
    coriolis_f0: float = 2.0e-4
    beta: float = 2.0e-11
    viscosity: float = 0.0
    hyperviscosity: float = 1.0e9

    def __post_init__(self) -> None:
        for name in ("nx", "ny"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 2:
                raise ConfigurationError(
                    f"SWEParameters.{name} must be an integer >= 2 (cells); found {value!r}. "
                    f"Give the global grid size as whole numbers of cells."
                )
        for name in ("dx", "dy", "gravity", "mean_depth"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(
                    f"SWEParameters.{name} must be a positive finite number; found {value!r}."
                )
        for name in ("viscosity", "hyperviscosity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigurationError(
                    f"SWEParameters.{name} must be >= 0 (0 switches it off); found {value!r}."
                )

    @property
    def length_x(self) -> float:
        """Channel length Lx = nx * dx in m (the period in x)."""
        return self.nx * self.dx

    @property
    def length_y(self) -> float:
        """Channel width Ly = ny * dy in m (wall to wall)."""
        return self.ny * self.dy

    @property
    def halo_width(self) -> int:
        """Smallest ghost width the stage kernel needs: 2 with hyperviscosity, else 1."""
        return 2 if self.hyperviscosity > 0 else 1

    def coriolis(self, y: Any) -> Any:
        """f(y) = f0 + beta * (y - Ly/2) in 1/s for y in m (scalar or NumPy array)."""
        return self.coriolis_f0 + self.beta * (y - 0.5 * self.length_y)


@dataclasses.dataclass(frozen=True)
class TileParameters:
    """What the kernels of one tile need (build it with :func:`tile_parameters`).

    Attributes
    ----------
    gravity, dx, dy, viscosity, hyperviscosity, mean_depth : float
        Copied from :class:`SWEParameters`.
    halo_width : int
        Ghost width of the tile's padded arrays.
    row_start, n_rows : int
        Global index of the first owned row and number of owned rows.
    n_rows_global : int
        ny of the whole channel.
    coriolis_rows : array, shape (n_rows + 2*halo_width,)
        f at the vorticity (south-west corner) points of each padded row, in 1/s, from the global
        row index: ``f0 + beta * (j_global * dy - Ly/2)``.
    v_face_mask : array, shape (n_rows + 2*halo_width,)
        1 where the v face of the padded row lies strictly between the walls, 0 on the wall faces
        (and beyond them); multiplies the v tendency so the walls stay impermeable.
    dtype : numpy.dtype
        Floating dtype of the fields (float64 or float32).
    metrics : GridMetrics
        The channel's metrics for the shallow-water core (unit factors, ``1/dx``, ``1/dy``, the two
        arrays above): what :func:`apps.stencil.channel.stage.swe_stage` passes to the core.
    """

    gravity: float
    dx: float
    dy: float
    viscosity: float
    hyperviscosity: float
    mean_depth: float
    halo_width: int
    row_start: int
    n_rows: int
    n_rows_global: int
    coriolis_rows: Any
    v_face_mask: Any
    dtype: np.dtype
    metrics: GridMetrics

    @property
    def at_south(self) -> bool:
        """True when the tile's first owned row touches the south wall (y = 0)."""
        return self.row_start == 0

    @property
    def at_north(self) -> bool:
        """True when the tile's last owned row touches the north wall (y = Ly)."""
        return self.row_start + self.n_rows == self.n_rows_global

    @property
    def stencil_reach(self) -> int:
        """How far (in cells) the stage kernel reads around an updated cell."""
        return 2 if self.hyperviscosity > 0 else 1


def global_rows(row_start: int, n_rows: int, halo_width: int) -> np.ndarray:
    """Global row index of every padded row of a tile, shape (n_rows + 2*halo_width,), int64."""
    return np.arange(row_start - halo_width, row_start + n_rows + halo_width, dtype=np.int64)


def tile_parameters(
    parameters: SWEParameters,
    row_start: int,
    n_rows: int,
    halo_width: int | None = None,
    xp: Any = np,
    dtype: Any = np.float64,
) -> TileParameters:
    """Build the per-tile kernel parameters for owned rows ``[row_start, row_start + n_rows)``.

    Parameters
    ----------
    parameters : SWEParameters
        Global parameters.
    row_start, n_rows : int
        Global index of the tile's first owned row and its number of owned rows (x does not matter:
        nothing varies along x).
    halo_width : int, optional
        Ghost width of the padded arrays; defaults to ``parameters.halo_width``.
    xp : module
        ``numpy`` or ``cupy``: where the per-row arrays live (the same place as the fields).
    dtype : numpy dtype
        float64 (default) or float32, the dtype of the fields.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ConfigurationError(
            f"The shallow-water kernels support float64 and float32 fields; found dtype {dtype}. "
            f"Pass dtype='float64' (default) or 'float32'."
        )
    if halo_width is None:
        halo_width = parameters.halo_width
    if halo_width < parameters.halo_width:
        raise ConfigurationError(
            f"halo_width={halo_width} is too narrow: the stencil needs {parameters.halo_width} ghost "
            f"cells (2 when hyperviscosity > 0). Allocate the fields with halo_width="
            f"{parameters.halo_width} or more."
        )
    if not (0 <= row_start and n_rows >= 1 and row_start + n_rows <= parameters.ny):
        raise ConfigurationError(
            f"Owned rows [{row_start}, {row_start + n_rows}) must lie inside the channel's "
            f"{parameters.ny} rows; pass the tile's global row start and its owned row count."
        )
    rows = global_rows(row_start, n_rows, halo_width)
    # Evaluated in float64 from the integer global index only, so any decomposition agrees bitwise.
    coriolis = parameters.coriolis_f0 + parameters.beta * (rows * parameters.dy - 0.5 * parameters.length_y)
    mask = ((rows > 0) & (rows < parameters.ny)).astype(np.float64)
    coriolis_rows = xp.asarray(coriolis.astype(dtype))
    v_face_mask = xp.asarray(mask.astype(dtype))
    metrics = channel_metrics(parameters.dx, parameters.dy, coriolis_rows, v_face_mask, parameters.gravity,
                              parameters.viscosity, parameters.hyperviscosity, xp=xp, dtype=dtype)
    return TileParameters(
        gravity=parameters.gravity,
        dx=parameters.dx,
        dy=parameters.dy,
        viscosity=parameters.viscosity,
        hyperviscosity=parameters.hyperviscosity,
        mean_depth=parameters.mean_depth,
        halo_width=int(halo_width),
        row_start=int(row_start),
        n_rows=int(n_rows),
        n_rows_global=int(parameters.ny),
        coriolis_rows=coriolis_rows,
        v_face_mask=v_face_mask,
        dtype=dtype,
        metrics=metrics,
    )

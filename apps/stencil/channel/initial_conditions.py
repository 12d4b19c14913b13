"""Initial conditions of the channel, as functions of *global* coordinates (any tile fills alike).

Each initial condition has ``height(x, y)``, ``u(x, y)`` and ``v(x, y)`` taking coordinate arrays in
m (for the point kind being filled: see :func:`staggered_coordinates`) and returning h in m, u and v
in m/s. :func:`fill_initial_state` evaluates them on a tile's owned cells.

``jet`` -- barotropically unstable zonal jet
    ``u(y) = U0 sech^2((y - Ly/2)/L)`` (a Bickley jet) in geostrophic balance ``g dh/dy = -f(y) u``
    with ``f = f0 + beta (y - Ly/2)``. With ``s = (y - Ly/2)/L`` the balance integrates exactly::

        h(y) = H - (U0 L / g) * [ f0 tanh(s) + beta L (s tanh(s) - ln cosh(s)) ]

    (``d/ds [s tanh s - ln cosh s] = s sech^2 s``), so ``h = H`` on the centre line.

    Choice of U0 = 10 m/s and L = 50 km (10 cells): the Bickley jet's sinuous mode is the most
    unstable (Lipps 1962; Drazin & Reid, Hydrodynamic Stability, sec. 31), with wavenumber
    ``k L ~ 0.9`` (wavelength ``2 pi L / 0.9 ~ 350 km``: five waves fit in Lx = 1800 km) and growth
    rate ``sigma ~ 0.16 U0 / L = 3.2e-5 1/s``, an e-folding time of ~9 h (the finite deformation
    radius sqrt(gH)/f0 = 157 km slows it somewhat). Beta cannot stabilise it:
    ``max |u''| ~ 2 U0 / L^2 = 8e-9 >> beta``. The jet is inertially stable (the absolute vorticity
    ``f - du/dy >= f0 - 0.77 U0/L = 0.23 f0 > 0``) and h stays between 90 and 110 m (Rossby number
    U0 / (f0 L) = 1). A nondivergent sinuous perturbation with streamfunction
    ``psi = A L sech^2(s) sum_m cos(2 pi m x / Lx + phase_m)``, m = 3..7 (around the fastest mode)
    and ``|v'| <= 0.05 m/s`` per mode (0.5 % of U0), needs ln(5 / 0.05) ~ 5 e-foldings, about
    two days, to reach finite amplitude. Measured with the defaults: max |v| = 1.3 m/s after 1 day
    and 5.3 m/s after 2 days (e-folding time ~8 h, as estimated); the jet meanders, rolls up into a
    street of eddies by day 2-3, and the eddies interact and merge for the rest of the run, so the
    roll-up is well inside a default 15-30 day run. Velocity (not height) is perturbed
    because at scales below the deformation radius a height perturbation radiates away as gravity
    waves instead of seeding the balanced instability.

``geostrophic`` -- the same jet unperturbed: an exact steady solution of the continuous equations
    (v = 0 and x-independence cancel every term but the balance above).

``gaussian`` -- a height bump ``H + A exp(-r^2 / (2 R^2))`` at rest at the channel centre, radiating
    gravity waves (A = 1 m, R = 100 km).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from hpcgpu.errors import ConfigurationError

from apps.stencil.channel.parameters import SWEParameters


def staggered_coordinates(point: str, rows: Any, columns: Any, parameters: SWEParameters) -> tuple[Any, Any]:
    """Coordinates (x, y) in m of C-grid points with global indices (rows, columns).

    ``point`` is ``"h"`` (cell centre ((i+1/2) dx, (j+1/2) dy)), ``"u"`` (west face
    (i dx, (j+1/2) dy)), ``"v"`` (south face ((i+1/2) dx, j dy)) or ``"q"`` (south-west corner
    (i dx, j dy)). ``rows`` and ``columns`` are broadcastable integer arrays.
    """
    offsets = {"h": (0.5, 0.5), "u": (0.0, 0.5), "v": (0.5, 0.0), "q": (0.0, 0.0)}
    if point not in offsets:
        raise ValueError(f"point must be one of {sorted(offsets)}; found {point!r}.")
    x_offset, y_offset = offsets[point]
    x = (np.asarray(columns, dtype=np.float64) + x_offset) * parameters.dx
    y = (np.asarray(rows, dtype=np.float64) + y_offset) * parameters.dy
    return x, y


def _log_cosh(s: np.ndarray) -> np.ndarray:
    """ln cosh(s) without overflow for large |s|."""
    a = np.abs(s)
    return a + np.log1p(np.exp(-2.0 * a)) - math.log(2.0)


@dataclasses.dataclass(frozen=True)
class Jet:
    """Geostrophically balanced Bickley jet, optionally with a sinuous perturbation (module docstring).

    Parameters
    ----------
    parameters : SWEParameters
        Channel parameters (g, H, f0, beta, Lx, Ly).
    max_speed : float
        U0 in m/s.
    half_width : float
        L in m.
    perturbation_speed : float
        Largest meridional velocity of each perturbation mode, in m/s (0: exactly balanced jet).
    perturbation_modes : tuple of int
        Zonal wavenumbers m (waves per Lx) of the perturbation.
    """

    parameters: SWEParameters
    max_speed: float = 10.0
    half_width: float = 50.0e3
    perturbation_speed: float = 0.0
    perturbation_modes: tuple[int, ...] = (3, 4, 5, 6, 7)

    def _s(self, y: Any) -> np.ndarray:
        return (np.asarray(y, dtype=np.float64) - 0.5 * self.parameters.length_y) / self.half_width

    def _phase(self, m: int) -> float:
        # Deterministic, incommensurate phases (golden-ratio sequence) so modes do not line up.
        return 2.0 * math.pi * ((m * 0.6180339887498949) % 1.0)

    def height(self, x: Any, y: Any) -> np.ndarray:
        """h in m: the exact geostrophic balance of the unperturbed jet (perturbation is nondivergent)."""
        p = self.parameters
        s = self._s(y)
        tanh_s = np.tanh(s)
        balance = p.coriolis_f0 * tanh_s + p.beta * self.half_width * (s * tanh_s - _log_cosh(s))
        h = p.mean_depth - (self.max_speed * self.half_width / p.gravity) * balance
        return np.broadcast_to(h, np.broadcast(np.asarray(x), h).shape).copy()

    def _streamfunction_parts(self, x: Any, y: Any):
        s = self._s(y)
        with np.errstate(over="ignore"):   # cosh overflows far from the jet: sech^2 is 0 there, as it should be
            sech2 = 1.0 / np.cosh(s) ** 2
        x = np.asarray(x, dtype=np.float64)
        cos_sum = np.zeros(np.broadcast(x, s).shape)
        dsin_sum = np.zeros(np.broadcast(x, s).shape)
        for m in self.perturbation_modes:
            k = 2.0 * math.pi * m / self.parameters.length_x
            phase = k * x + self._phase(m)
            # Scale each mode so that its max |v'| = |dpsi/dx| is perturbation_speed.
            cos_sum = cos_sum + np.cos(phase) / k
            dsin_sum = dsin_sum - np.sin(phase)
        return s, sech2, cos_sum, dsin_sum

    def u(self, x: Any, y: Any) -> np.ndarray:
        """u in m/s: U0 sech^2(s) plus the perturbation's -dpsi/dy."""
        s, sech2, cos_sum, _ = self._streamfunction_parts(x, y)
        # psi = A sech^2(s) cos_sum  ->  -dpsi/dy = A (2/L) sech^2(s) tanh(s) cos_sum
        perturbation = self.perturbation_speed * (2.0 / self.half_width) * sech2 * np.tanh(s) * cos_sum
        return self.max_speed * sech2 + perturbation

    def v(self, x: Any, y: Any) -> np.ndarray:
        """v in m/s: the perturbation's dpsi/dx, exactly 0 on and beyond the walls."""
        _, sech2, _, dsin_sum = self._streamfunction_parts(x, y)
        v = self.perturbation_speed * sech2 * dsin_sum
        y = np.broadcast_to(np.asarray(y, dtype=np.float64), v.shape)
        return np.where((y > 0) & (y < self.parameters.length_y), v, 0.0)


@dataclasses.dataclass(frozen=True)
class GaussianBump:
    """Fluid at rest with a Gaussian height bump ``H + A exp(-r^2 / (2 R^2))``.

    Parameters
    ----------
    parameters : SWEParameters
        Channel parameters.
    amplitude : float
        A in m.
    radius : float
        R in m.
    centre : (x, y) in m, optional
        Bump centre; defaults to the channel centre (Lx/2, Ly/2).
    """

    parameters: SWEParameters
    amplitude: float = 1.0
    radius: float = 100.0e3
    centre: tuple[float, float] | None = None

    def height(self, x: Any, y: Any) -> np.ndarray:
        """h in m."""
        p = self.parameters
        x_centre, y_centre = self.centre or (0.5 * p.length_x, 0.5 * p.length_y)
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        r2 = (x - x_centre) ** 2 + (y - y_centre) ** 2
        return p.mean_depth + self.amplitude * np.exp(-r2 / (2.0 * self.radius**2))

    def u(self, x: Any, y: Any) -> np.ndarray:
        """u = 0 in m/s."""
        return np.zeros(np.broadcast(np.asarray(x), np.asarray(y)).shape)

    def v(self, x: Any, y: Any) -> np.ndarray:
        """v = 0 in m/s."""
        return np.zeros(np.broadcast(np.asarray(x), np.asarray(y)).shape)


def jet(parameters: SWEParameters, perturbation_speed: float = 0.05, **options: Any) -> Jet:
    """The default unstable jet (U0 = 10 m/s, L = 50 km, 0.05 m/s sinuous perturbation)."""
    return Jet(parameters, perturbation_speed=perturbation_speed, **options)


def geostrophic(parameters: SWEParameters, **options: Any) -> Jet:
    """The same jet without perturbation: an exact steady solution of the continuous equations."""
    return Jet(parameters, perturbation_speed=0.0, **options)


def gaussian(parameters: SWEParameters, **options: Any) -> GaussianBump:
    """A 1 m, 100 km Gaussian height bump at the channel centre, fluid at rest."""
    return GaussianBump(parameters, **options)


INITIAL_CONDITIONS: dict[str, Callable[..., Any]] = {
    "jet": jet,
    "geostrophic": geostrophic,
    "gaussian": gaussian,
}


def make_initial_condition(name: str, parameters: SWEParameters) -> Any:
    """The initial condition called ``name`` ("jet", "geostrophic" or "gaussian") with defaults."""
    if name not in INITIAL_CONDITIONS:
        raise ConfigurationError(
            f"Unknown initial condition {name!r}; expected one of {sorted(INITIAL_CONDITIONS)}."
        )
    return INITIAL_CONDITIONS[name](parameters)


def fill_initial_state(
    initial_condition: Any,
    h: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    parameters: SWEParameters,
    local_start: tuple[int, int],
    halo_width: int,
) -> None:
    """Fill the owned cells of a tile's padded host arrays from global coordinates; in place.

    Parameters
    ----------
    initial_condition : Jet or GaussianBump
        Anything with ``height``, ``u``, ``v`` methods of (x, y).
    h, u, v : numpy.ndarray, shape (n_rows + 2w, n_cols + 2w)
        Padded host arrays; ghosts are left untouched (fill them by exchange and walls).
    parameters : SWEParameters
        Channel parameters.
    local_start : (row, column)
        Global index of the first owned cell.
    halo_width : int
        Ghost width w.
    """
    w = halo_width
    n_rows, n_columns = h.shape[0] - 2 * w, h.shape[1] - 2 * w
    rows = (local_start[0] + np.arange(n_rows))[:, None]
    columns = (local_start[1] + np.arange(n_columns))[None, :]
    owned = (slice(w, w + n_rows), slice(w, w + n_columns))
    h[owned] = initial_condition.height(*staggered_coordinates("h", rows, columns, parameters))
    u[owned] = initial_condition.u(*staggered_coordinates("u", rows, columns, parameters))
    v[owned] = initial_condition.v(*staggered_coordinates("v", rows, columns, parameters))

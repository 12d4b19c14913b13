"""Time-step limit of the explicit scheme and a one-tile SSP-RK3 step.

Stability limit
---------------
The fastest linear modes of the C-grid scheme are gravity waves Doppler-shifted by the flow: their
frequency is bounded by ``|u|/dx + |v|/dy + 2 c sqrt(1/dx^2 + 1/dy^2)`` with ``c = sqrt(g h)`` (the
2 dx wave in both directions), purely imaginary eigenvalues. SSP-RK3 is stable on the imaginary axis
up to ``|lambda dt| <= sqrt(3)`` and on the negative real axis (viscosity) up to ``2.51``; the
diffusive eigenvalues are at most ``nu k2 + nu4 k2^2`` with ``k2 = 4/dx^2 + 4/dy^2``. Treating the
two parts as additive gives the local rate (1/s)::

    rate = max_cells(|u|/dx + |v|/dy + 2 c sqrt(1/dx^2 + 1/dy^2)) / sqrt(3) + (nu k2 + nu4 k2^2) / 2.51

and the scheme is stable for ``dt * rate <= 1``. :func:`stable_dt` returns ``cfl / rate``; the app
reduces it over ranks with ``min`` (or the rate with ``max``). With the defaults (H = 100 m,
dx = 5 km) ``dt`` at CFL 0.8 is about 70 s.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from apps.stencil.swe_scheme.stage import ssp_rk3_step as core_ssp_rk3_step
from apps.stencil.channel.parameters import TileParameters
from hpcgpu.arch import array_module
from hpcgpu.errors import ConfigurationError, NumericalError

# Stability bounds of SSP-RK3 on the imaginary and negative real axes.
_RK3_IMAGINARY_LIMIT = math.sqrt(3.0)
_RK3_REAL_LIMIT = 2.51

DEFAULT_CFL = 0.8


def stability_rate(h: Any, u: Any, v: Any, params: TileParameters) -> float:
    """Local stability rate in 1/s over the owned cells: the scheme is stable for ``dt * rate <= 1``.

    Parameters
    ----------
    h, u, v : array, shape (n_rows + 2w, n_cols + 2w)
        Padded fields (NumPy or CuPy); only owned cells are read.
    params : TileParameters
        Tile parameters (gravity, dx, dy, viscosity, hyperviscosity, halo width).

    Raises
    ------
    hpcgpu.errors.NumericalError
        If the owned state holds NaN/Inf or a non-positive depth.
    """
    xp = array_module(h)
    w = params.halo_width
    owned = (slice(w, h.shape[0] - w), slice(w, h.shape[1] - w))
    depth = h[owned]
    minimum_depth = float(xp.min(depth))
    if not math.isfinite(minimum_depth) or minimum_depth <= 0:
        raise NumericalError(
            f"The shallow-water state is invalid: minimum owned depth is {minimum_depth} m (expected "
            f"finite and > 0). The run became unstable or dried out; reduce dt (lower the CFL number) "
            f"or the jet/bump amplitude."
        )
    gravity_speed = xp.sqrt(params.gravity * depth)
    wave_factor = 2.0 * math.sqrt(1.0 / params.dx**2 + 1.0 / params.dy**2)
    wave_rate = xp.abs(u[owned]) / params.dx + xp.abs(v[owned]) / params.dy + wave_factor * gravity_speed
    max_wave_rate = float(xp.max(wave_rate))
    if not math.isfinite(max_wave_rate):
        raise NumericalError(
            "The shallow-water velocities hold NaN/Inf; the run became unstable. Reduce dt (lower CFL)."
        )
    k2 = 4.0 / params.dx**2 + 4.0 / params.dy**2
    diffusive_rate = params.viscosity * k2 + params.hyperviscosity * k2 * k2
    return max_wave_rate / _RK3_IMAGINARY_LIMIT + diffusive_rate / _RK3_REAL_LIMIT


def stable_dt(h: Any, u: Any, v: Any, params: TileParameters, cfl: float = DEFAULT_CFL) -> float:
    """Largest stable time step of the local owned cells, times ``cfl``, in s.

    ``cfl = 1`` is the stability limit (see the module docstring); the default 0.8 leaves a margin
    for the growth of the flow between time-step updates. The app takes the minimum over ranks.
    """
    if not (0 < cfl <= 1):
        raise ConfigurationError(
            f"The CFL number must be in (0, 1] (1 is the stability limit of SSP-RK3); found {cfl}."
        )
    return cfl / stability_rate(h, u, v, params)


def check_dt(dt: float, dt_limit: float) -> None:
    """Raise if a user-given time step exceeds the stability limit; returns None otherwise.

    Parameters
    ----------
    dt : float
        Requested time step in s.
    dt_limit : float
        The limit in s: ``stable_dt(h, u, v, params, cfl=1.0)``, reduced with ``min`` over ranks.

    Raises
    ------
    hpcgpu.errors.ConfigurationError
        If ``dt`` is not a positive finite number or exceeds ``dt_limit``.
    """
    if not (math.isfinite(dt) and dt > 0):
        raise ConfigurationError(f"The time step must be a positive number of seconds; found dt={dt}.")
    if dt > dt_limit:
        raise ConfigurationError(
            f"The time step dt={dt:g} s exceeds the stability limit {dt_limit:g} s of this state "
            f"(gravity waves plus advection and viscosity, SSP-RK3): the run would blow up. "
            f"Use dt <= {DEFAULT_CFL * dt_limit:.4g} s (CFL {DEFAULT_CFL}), or leave dt unset to derive it."
        )


def ssp_rk3_step(
    state: Sequence[Any],
    work_1: Sequence[Any],
    work_2: Sequence[Any],
    dt: float,
    params: TileParameters,
    region: Sequence[int],
    fill_ghosts_fn: Callable[[Sequence[Any]], None],
) -> None:
    """Advance ``state`` = (h, u, v) by one SSP-RK3 step over ``region``, in place; returns None.

    A convenience for one tile that fills its own ghosts (the tests' one-tile references); the app
    splits each stage into interior and rim around its own halo exchange instead.

    Parameters
    ----------
    state, work_1, work_2 : sequence of 3 padded arrays
        The state and two scratch triples of the same shape and dtype.
    dt : float
        Time step in s.
    params : TileParameters
        Tile parameters.
    region : (j0, j1, i0, i1)
        Owned cells in padded indices.
    fill_ghosts_fn : callable
        ``fill_ghosts_fn(fields)`` fills the ghosts of a triple (periodic x, walls) in place; called
        before every stage. The ghosts of ``state`` are stale when this returns.
    """
    core_ssp_rk3_step(state, work_1, work_2, dt, params.metrics, region, fill_ghosts_fn)

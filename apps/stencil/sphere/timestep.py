"""Time-step limit with the polar filter, and a one-tile SSP-RK3 step (tests, single-rank runs).

As for the channel (:mod:`apps.stencil.channel.timestep`), the rate of the fastest mode of a cell is
``|u|/dx + |v|/dy + 2 sqrt(g h) sqrt(1/dx^2 + 1/dy^2)`` over sqrt(3) (SSP-RK3 on the imaginary
axis), but with ``dx = a max(cos(lat), cos(lat_c)) dlon``: poleward of the cutoff the polar filter
caps the zonal wavenumbers at the cutoff's resolution (:mod:`apps.stencil.sphere.polar_filter`).
Without the filter (``lat_c = pi/2``) the pole rows set the limit.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from apps.stencil.sphere.parameters import SphereTile
from apps.stencil.sphere.polar_filter import FilterPlan, filter_and_combine, local_gather
from apps.stencil.swe_scheme.stage import ssp_rk3_step as core_ssp_rk3_step
from hpcgpu.arch import is_device_array
from hpcgpu.errors import NumericalError

DEFAULT_CFL = 0.8


def stability_rate(h: Any, u: Any, v: Any, params: SphereTile, cutoff_latitude: float) -> float:
    """Local rate in 1/s over the owned cells; stable for ``dt * rate <= 1``. Raises on NaN / h <= 0."""
    w = params.halo_width
    owned = (slice(w, w + params.n_rows), slice(w, w + params.n_columns))
    # Called once per run: CuPy fields are simply copied to the host.
    h, u, v, cos_center = (a.get() if is_device_array(a) else a for a in (h, u, v, params.cos_center))
    depth = np.asarray(h[owned], dtype=np.float64)
    if not (np.isfinite(depth).all() and depth.min() > 0):
        raise NumericalError(f"the latlon state is invalid (minimum depth {depth.min()} m or NaN); reduce dt / --cfl")
    cos = np.maximum(np.asarray(cos_center, dtype=np.float64)[owned[0]], math.cos(cutoff_latitude))[:, None]
    dx = params.radius * cos * params.dlon
    dy = params.radius * params.dlat
    rate = (np.abs(u[owned]) / dx + np.abs(v[owned]) / dy
            + 2.0 * np.sqrt(params.gravity * depth) * np.sqrt(1.0 / dx**2 + 1.0 / dy**2))  # fmt: skip
    value = float(rate.max()) / math.sqrt(3.0)
    if not math.isfinite(value):
        raise NumericalError("the latlon velocities hold NaN/Inf; reduce dt / --cfl")
    return value


def ssp_rk3_step(
    state: Sequence[Any], work_1: Sequence[Any], work_2: Sequence[Any], increment: Sequence[Any],
    dt: float, params: SphereTile, plan: FilterPlan, region: Sequence[int],
    fill_ghosts_fn: Callable[[Sequence[Any]], None], gather=local_gather,
) -> None:
    """Advance (h, u, v) of one tile by one SSP-RK3 step in place, polar filter included.

    ``fill_ghosts_fn(fields)`` fills the ghosts of a triple (periodic longitude, neighbours, pole
    mirrors) before each stage; ``gather`` builds whole latitude circles (:func:`local_gather` for a
    tile spanning all longitudes).
    """
    def finish_stage(target, source, a, b):
        filter_and_combine(target, state, source, increment, a, b, plan, gather)

    core_ssp_rk3_step(state, work_1, work_2, dt, params.metrics, region, fill_ghosts_fn, increment,
                      plan.filtered_rows_like(state[0]), finish_stage)

"""The stability limit: check_dt refuses unstable steps, and the limit is where runs blow up."""

import numpy as np
import pytest
from swe_reference import single_tile_fill_fn

from hpcgpu.errors import ConfigurationError, NumericalError

from apps.stencil.channel import (
    SWEParameters,
    check_dt,
    fill_initial_state,
    ssp_rk3_step,
    stability_rate,
    stable_dt,
    tile_parameters,
)
from apps.stencil.channel.initial_conditions import gaussian

PARAMETERS = SWEParameters(nx=32, ny=32, dx=20.0e3, dy=20.0e3, hyperviscosity=0.0)


def bump_state():
    w = PARAMETERS.halo_width
    shape = (PARAMETERS.ny + 2 * w, PARAMETERS.nx + 2 * w)
    state = [np.zeros(shape) for _ in range(3)]
    fill_initial_state(gaussian(PARAMETERS, radius=60.0e3), *state, PARAMETERS, (0, 0), w)
    params = tile_parameters(PARAMETERS, 0, PARAMETERS.ny, w)
    fill = single_tile_fill_fn(PARAMETERS, w)
    fill(state)
    return state, params, fill


def max_height_anomaly_after(dt, n_steps):
    state, params, fill = bump_state()
    w = params.halo_width
    shape = state[0].shape
    work_1 = [np.zeros(shape) for _ in range(3)]
    work_2 = [np.zeros(shape) for _ in range(3)]
    region = (w, shape[0] - w, w, shape[1] - w)
    with np.errstate(all="ignore"):
        for _ in range(n_steps):
            ssp_rk3_step(state, work_1, work_2, dt, params, region, fill)
        anomaly = np.abs(state[0][w:-w, w:-w] - PARAMETERS.mean_depth).max()
    return anomaly if np.isfinite(anomaly) else np.inf


def test_stable_dt_is_the_gravity_wave_limit():
    """At rest, dt_limit = sqrt(3) / (2 c sqrt(1/dx^2 + 1/dy^2)) with c from the deepest cell."""
    state, params, _ = bump_state()
    c = np.sqrt(PARAMETERS.gravity * state[0].max())
    expected = np.sqrt(3.0) / (2.0 * c * np.sqrt(2.0) / PARAMETERS.dx)
    assert stable_dt(*state, params, cfl=1.0) == pytest.approx(expected, rel=1e-12)
    assert stable_dt(*state, params, cfl=0.5) == pytest.approx(0.5 * expected, rel=1e-12)
    assert stability_rate(*state, params) == pytest.approx(1.0 / expected, rel=1e-12)


def test_limit_separates_stable_from_unstable_runs():
    """300 steps at the limit stay bounded; 1.5 times the limit blows up (the check is not idle)."""
    state, params, _ = bump_state()
    limit = stable_dt(*state, params, cfl=1.0)
    assert max_height_anomaly_after(limit, 300) < 1.0
    assert max_height_anomaly_after(1.5 * limit, 300) > 100.0


def test_check_dt_raises_for_unstable_dt():
    state, params, _ = bump_state()
    limit = stable_dt(*state, params, cfl=1.0)
    check_dt(0.8 * limit, limit)
    check_dt(limit, limit)
    with pytest.raises(ConfigurationError, match="exceeds the stability limit"):
        check_dt(1.5 * limit, limit)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigurationError, match="positive"):
            check_dt(bad, limit)
    with pytest.raises(ConfigurationError, match="CFL"):
        stable_dt(*state, params, cfl=1.5)


def test_invalid_state_raises_numerical_error():
    state, params, _ = bump_state()
    w = params.halo_width
    state[0][w + 3, w + 4] = np.nan
    with pytest.raises(NumericalError, match="depth"):
        stable_dt(*state, params)
    state[0][w + 3, w + 4] = -1.0
    with pytest.raises(NumericalError, match="depth"):
        stable_dt(*state, params)

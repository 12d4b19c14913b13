"""The polar filter: damping factors as documented, and the same result for any longitude split."""

import math

import numpy as np
import pytest

from apps.stencil.sphere import SphereParameters, damping_factors, filter_and_combine, make_filter_plan

CUTOFF = math.radians(60.0)


def test_damping_factors_follow_the_documented_formula():
    nx = 64
    k = np.arange(nx // 2 + 1)
    latitude = math.radians(80.0)
    s = damping_factors(latitude, nx, CUTOFF)
    expected = np.ones(nx // 2 + 1)
    sine = np.abs(np.sin(0.5 * k[1:] * 2 * math.pi / nx))
    expected[1:] = np.minimum(1.0, math.cos(latitude) / (math.cos(CUTOFF) * sine))
    np.testing.assert_allclose(s, expected, rtol=1e-15)
    assert s[0] == 1.0 and s[-1] < 0.4
    # Equatorward of the cutoff nothing is damped; on the pole face only the zonal mean survives.
    assert np.all(damping_factors(math.radians(50.0), nx, CUTOFF) == 1.0)
    assert np.all(damping_factors(-math.pi / 2, nx, CUTOFF)[1:] < 1e-14)
    # Damped modes' effective zonal frequency never exceeds the 2-grid wave at the cutoff.
    effective = s * np.abs(np.sin(0.5 * k * 2 * math.pi / nx)) / math.cos(latitude)
    assert effective.max() <= 1.0 / math.cos(CUTOFF) * (1 + 1e-12)


def _filter_rows(parameters, column_splits, increments, a=0.75, b=0.25):
    """Run filter_and_combine on every tile of one full-height band; returns the assembled out fields."""
    ny, nx = parameters.ny, parameters.nx
    base = [np.full((ny + 2, nx + 2), 1.0) for _ in range(3)]
    stage = [np.full((ny + 2, nx + 2), 2.0) for _ in range(3)]
    tiles = list(zip(column_splits[:-1], column_splits[1:]))
    plans = {t: make_filter_plan(parameters, 0, ny, t[0], t[1] - t[0]) for t in tiles}
    padded = {}
    for c0, c1 in tiles:
        inc = [np.zeros((ny + 2, c1 - c0 + 2)) for _ in range(3)]
        for field in range(3):
            inc[field][1:-1, 1:-1] = increments[field][:, c0:c1]
        padded[(c0, c1)] = inc
    blocks = {t: np.stack([np.stack([x[j, 1:1 + t[1] - t[0]] for x in padded[t]]) for j in plans[t].rows]) for t in tiles}
    circle = np.concatenate([blocks[t] for t in tiles], axis=-1)
    result = [np.full((ny, nx), np.nan) for _ in range(3)]
    for c0, c1 in tiles:
        width = c1 - c0
        out = [np.full((ny + 2, width + 2), np.nan) for _ in range(3)]
        tile_base = [x[:, :width + 2].copy() for x in base]
        tile_stage = [x[:, :width + 2].copy() for x in stage]
        filter_and_combine(out, tile_base, tile_stage, padded[(c0, c1)], a, b, plans[(c0, c1)], lambda block: circle)
        for field in range(3):
            result[field][:, c0:c1] = out[field][1:-1, 1:-1]
    return result, plans[tiles[0]]


def test_pure_mode_is_damped_as_documented():
    p = SphereParameters(nx=32, ny=16, filter_latitude=CUTOFF)
    lon = (np.arange(p.nx) + 0.5) * p.dlon
    wavenumber = 12
    mode = np.cos(wavenumber * lon)
    increments = [np.tile(mode, (p.ny, 1)) for _ in range(3)]
    out, plan = _filter_rows(p, [0, p.nx], increments)
    lat_center = p.center_latitudes(np.arange(p.ny))
    factors = []
    for j in plan.rows:
        global_row = j - 1
        factor = damping_factors(lat_center[global_row], p.nx, CUTOFF)[wavenumber]
        if abs(lat_center[global_row]) > CUTOFF:
            factors.append(factor)
            # out = 0.75*1 + 0.25*(2 + S_k * mode), for h (and u: same latitude).
            for field in (0, 1):
                np.testing.assert_allclose(out[field][global_row], 0.75 + 0.25 * (2.0 + factor * mode), rtol=0, atol=1e-14)
    assert min(factors) < 0.25 and max(factors) <= 1.0
    # Rows equatorward of the cutoff are not touched by the filter (left to the stage kernel).
    assert np.isnan(out[0][p.ny // 2]).all()


@pytest.mark.parametrize("column_splits", [[0, 7, 32], [0, 8, 16, 24, 32], [0, 1, 2, 31, 32]])
def test_filter_is_bitwise_independent_of_the_longitude_split(column_splits):
    p = SphereParameters(nx=32, ny=16, filter_latitude=math.radians(45.0))
    rng = np.random.default_rng(5)
    increments = [rng.standard_normal((p.ny, p.nx)) for _ in range(3)]
    whole, _ = _filter_rows(p, [0, p.nx], increments)
    split, _ = _filter_rows(p, column_splits, increments)
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a, b)

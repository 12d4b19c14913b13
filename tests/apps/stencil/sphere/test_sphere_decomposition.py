"""Decomposition independence (tile by tile = single tile, bitwise, polar rows included) and mass."""

import math

import numpy as np
import pytest
from sphere_reference import global_state, run_tiled

from apps.stencil.sphere import SphereParameters, tile_parameters
from apps.stencil.sphere.diagnostics import cell_areas

PARAMETERS = SphereParameters(nx=24, ny=12, alpha=math.pi / 2 - 0.05, filter_latitude=math.radians(45.0))


def perturbed_state(parameters, init="williamson2", seed=11):
    state, initial = global_state(parameters, init)
    rng = np.random.default_rng(seed)
    state[0] = state[0] + 5.0 * rng.standard_normal(state[0].shape)
    state[1] = state[1] + rng.standard_normal(state[1].shape)
    state[2] = state[2] + rng.standard_normal(state[2].shape)
    state[2][0, :] = 0.0
    return state, initial


@pytest.mark.parametrize(
    "row_splits, column_splits",
    [([0, 5, 12], [0, 7, 24]), ([0, 1, 3, 9, 12], [0, 24]), ([0, 12], [0, 3, 5, 13, 24]), ([0, 6, 12], [0, 8, 16, 24])],
)
def test_tiled_run_is_bitwise_single_tile_run(row_splits, column_splits):
    state, _ = perturbed_state(PARAMETERS)
    single = run_tiled(state, PARAMETERS, [0, 12], [0, 24], 900.0, n_steps=3)
    tiled = run_tiled(state, PARAMETERS, row_splits, column_splits, 900.0, n_steps=3)
    for single_field, tiled_field in zip(single, tiled):
        assert np.all(np.isfinite(single_field))
        np.testing.assert_array_equal(single_field, tiled_field)
    assert np.abs(single[0] - state[0]).max() > 1e-2


@pytest.mark.parametrize("init", ["williamson5", "williamson6"])
def test_mass_is_conserved_to_rounding(init):
    p = SphereParameters(nx=48, ny=24)
    state, initial = global_state(p, init)
    dt = 600.0
    final = run_tiled(state, p, [0, 24], [0, 48], dt, n_steps=30, topography_fn=initial.topography)
    area = cell_areas(tile_parameters(p, 0, 24, 0, 48))
    before, after = np.sum(area * state[0]), np.sum(area * final[0])
    assert abs(after - before) / before <= 1e-12
    assert np.abs(final[0] - state[0]).max() > 1.0  # the flow did evolve
    assert np.all(final[2][0, :] == 0.0)  # no flow through the south pole face

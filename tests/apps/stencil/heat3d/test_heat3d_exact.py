"""heat3d against its exact discrete solution: a Fourier mode decays by lambda per step."""

import numpy as np
import pytest

from apps.stencil.heat3d import amplification_factor, exact_solution, heat3d_step, initial_condition
from hpcgpu.errors import ConfigurationError, NumericalError


def run_periodic(global_shape, wavenumbers, r, n_steps, dtype):
    """Run n_steps on one padded array with periodic ghosts; return the owned cells."""
    indices = np.meshgrid(*(np.arange(n) for n in global_shape), indexing="ij")
    current = np.zeros(tuple(n + 2 for n in global_shape), dtype)
    current[1:-1, 1:-1, 1:-1] = initial_condition(*indices, global_shape, wavenumbers, dtype)
    following = np.zeros_like(current)
    region = (1, global_shape[0] + 1, 1, global_shape[1] + 1, 1, global_shape[2] + 1)
    for _ in range(n_steps):
        current[...] = np.pad(current[1:-1, 1:-1, 1:-1], 1, mode="wrap")
        heat3d_step(following, current, region, r)
        current, following = following, current
    return current[1:-1, 1:-1, 1:-1], exact_solution(*indices, global_shape, wavenumbers, r, n_steps)


@pytest.mark.parametrize("wavenumbers, r", [((1, 1, 1), 0.1), ((1, 0, 1), 1.0 / 6.0), ((2, 0, 1), 0.05)])
def test_float64_matches_exact_discrete_solution_after_50_steps(wavenumbers, r):
    numerical, exact = run_periodic((10, 12, 16), wavenumbers, r, 50, "float64")
    assert np.max(np.abs(numerical - exact)) <= 1e-12 * np.max(np.abs(exact))
    assert np.max(np.abs(exact)) > 5e-3  # the mode has not decayed to nothing: the test has teeth


def test_float32_matches_exact_solution_to_single_precision():
    numerical, exact = run_periodic((8, 8, 12), (1, 1, 2), 0.12, 50, "float32")
    assert np.max(np.abs(numerical - exact)) <= 2e-5 * np.max(np.abs(exact))


def test_amplification_factor_and_initial_condition():
    shape = (8, 6, 4)
    # kx = nx/2 is the checkerboard: sin^2(pi/2) = 1, so lambda = 1 - 4 r.
    assert amplification_factor(shape, (0, 0, 2), 0.1) == pytest.approx(0.6, abs=1e-15)
    assert amplification_factor(shape, (0, 0, 0), 0.1) == 1.0
    iz, iy, ix = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    values = initial_condition(iz, iy, ix, shape, (1, 0, 0))
    np.testing.assert_allclose(values, np.cos(2 * np.pi * iz / 8), atol=1e-15)
    # periodic in the global index: a ghost index -1 equals index n - 1
    assert initial_condition(-1, 0, 0, shape, (1, 2, 3)) == initial_condition(7, 0, 0, shape, (1, 2, 3))


def test_bad_arguments():
    with pytest.raises(NumericalError, match="dt <= dx"):
        amplification_factor((4, 4, 4), (1, 1, 1), 0.2)
    with pytest.raises(ConfigurationError, match="global_shape"):
        exact_solution(0, 0, 0, (4, 4), (1, 1, 1), 0.1, 3)
    with pytest.raises(ConfigurationError, match="n_steps"):
        exact_solution(0, 0, 0, (4, 4, 4), (1, 1, 1), 0.1, -1)

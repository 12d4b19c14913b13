"""The Jacobi problem: initial state, Dirichlet columns, and convergence to the discrete Laplace solution."""

import numpy as np
import pytest

from apps.stencil.jacobi import (
    boundary_values,
    fill_initial_state,
    fixed_local_columns,
    initial_condition,
    jacobi_sweep,
)
from hpcgpu.errors import ConfigurationError


def test_initial_condition_matches_nvidia_boundary_formula():
    ny, nx = 9, 7
    rows, columns = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    values = initial_condition(rows, columns, (ny, nx), "float64")
    expected_boundary = np.sin(2.0 * np.pi * np.arange(ny) / (ny - 1))
    np.testing.assert_array_equal(values[:, 0], expected_boundary)
    np.testing.assert_array_equal(values[:, -1], expected_boundary)
    assert not values[:, 1:-1].any()
    assert initial_condition(rows, columns, (ny, nx)).dtype == np.float32


def test_fill_initial_state_is_independent_of_the_decomposition():
    ny, nx = 10, 12
    whole = np.zeros((ny + 2, nx + 2))
    fill_initial_state(whole, (0, 0), (ny, nx))
    np.testing.assert_array_equal(whole[0], whole[ny])  # periodic ghost rows
    np.testing.assert_array_equal(whole[ny + 1], whole[1])
    tile = np.zeros((4 + 2, 5 + 2))
    fill_initial_state(tile, (3, 7), (ny, nx))
    np.testing.assert_array_equal(tile, whole[3 : 3 + 6, 7 : 7 + 7])
    np.testing.assert_array_equal(boundary_values([-1, ny], (ny, nx)), boundary_values([ny - 1, 0], (ny, nx)))


def test_fixed_local_columns():
    assert fixed_local_columns(0, 10, 10) == (1, 10)
    assert fixed_local_columns(0, 4, 10) == (1,)
    assert fixed_local_columns(4, 3, 10) == ()
    assert fixed_local_columns(7, 3, 10) == (3,)


def direct_solution(ny, nx):
    """Solve the discrete Laplace problem (periodic y, Dirichlet x) directly, float64."""
    unknown = np.arange(ny * (nx - 2)).reshape(ny, nx - 2)
    matrix = np.zeros((unknown.size, unknown.size))
    rhs = np.zeros(unknown.size)
    boundary = boundary_values(np.arange(ny), (ny, nx))
    for y in range(ny):
        for x in range(nx - 2):
            row = unknown[y, x]
            matrix[row, row] = 4.0
            for dy, dx in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                neighbour_x = x + dx
                if neighbour_x < 0 or neighbour_x >= nx - 2:
                    rhs[row] += boundary[y]
                else:
                    matrix[row, unknown[(y + dy) % ny, neighbour_x]] -= 1.0
    solution = np.empty((ny, nx))
    solution[:, 0] = solution[:, -1] = boundary
    solution[:, 1:-1] = np.linalg.solve(matrix, rhs).reshape(ny, nx - 2)
    return solution


def test_converges_to_the_discrete_laplace_solution_with_decreasing_residual():
    ny, nx, n_sweeps = 8, 10, 900
    current = np.zeros((ny + 2, nx + 2))
    fill_initial_state(current, (0, 0), (ny, nx))
    following = current.copy()
    residuals = []
    for _ in range(n_sweeps):
        current[0], current[-1] = current[-2], current[1]  # periodic ghost rows
        residual = np.zeros(1)
        jacobi_sweep(following, current, (1, ny + 1, 1, nx + 1), (1, nx), residual)
        residuals.append(residual[0])
        current, following = following, current
    residuals = np.array(residuals)
    # The Jacobi iteration matrix is symmetric here, so ||u^{n+1} - u^n|| can never grow.
    assert np.all(np.diff(residuals) <= 1e-15 * residuals[:-1])
    assert residuals[-1] < 1e-18 * residuals[0]
    np.testing.assert_allclose(current[1:-1, 1:-1], direct_solution(ny, nx), rtol=0, atol=1e-9)


def test_bad_global_shape():
    with pytest.raises(ConfigurationError, match="ny >= 2 and nx >= 3"):
        initial_condition(np.arange(3), np.arange(3), (1, 5))

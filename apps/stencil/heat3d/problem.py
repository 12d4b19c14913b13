"""The heat3d validation problem: one Fourier mode diffusing in a periodic box, solved exactly.

The explicit 7-point scheme on a periodic ``nz x ny x nx`` grid (axis order z, y, x) ::

    u^{n+1} = u^n + r * (sum of the 6 neighbours - 6 u^n),      r = kappa dt / dx^2

maps the mode ``cos(2 pi kz iz / nz) cos(2 pi ky iy / ny) cos(2 pi kx ix / nx)`` (integer wavenumbers,
global indices) onto itself times ::

    lambda = 1 - 4 r (sin^2(pi kx / nx) + sin^2(pi ky / ny) + sin^2(pi kz / nz))

because the discrete second difference of ``cos(theta i)`` is ``-4 sin^2(theta / 2) cos(theta i)``. So
``u^n = lambda^n u^0`` exactly (up to rounding), a sharp test of the kernel and of halo exchange. The
scheme is stable (``|lambda| <= 1`` for every mode) iff ``0 <= r <= 1/6``.

Values are computed on the host with NumPy in float64 (then rounded once to the working dtype), so
every backend and decomposition starts from bitwise the same state.
"""

from __future__ import annotations

import math

import numpy as np

from apps.stencil.jacobi.arrays import is_cupy
from hpcgpu.errors import ConfigurationError, NumericalError

MAX_STABLE_R = 1.0 / 6.0


def check_stability(r: float) -> float:
    """Return ``r`` as a float if ``0 <= r <= 1/6``; else raise :class:`hpcgpu.errors.NumericalError`."""
    try:
        value = float(r)
    except (TypeError, ValueError):
        raise ConfigurationError(f"heat3d: expected a real diffusion number r, found {r!r}") from None
    if not 0.0 <= value <= MAX_STABLE_R:
        raise NumericalError(
            f"heat3d: the explicit 7-point scheme needs 0 <= r = kappa*dt/dx^2 <= 1/6 = {MAX_STABLE_R:.6f} "
            f"to be stable, found r = {value!r}; reduce the time step to dt <= dx^2 / (6 kappa)"
        )
    return value


def _check_shape_and_modes(global_shape, wavenumbers):
    try:
        shape = tuple(int(n) for n in global_shape)
        modes = tuple(int(k) for k in wavenumbers)
    except (TypeError, ValueError):
        shape, modes = (), ()
    if len(shape) != 3 or len(modes) != 3 or min(shape) < 1:
        raise ConfigurationError(
            "heat3d: expected global_shape (nz, ny, nx) of positive integers and wavenumbers (kz, ky, kx) "
            f"of integers, found global_shape={global_shape!r}, wavenumbers={wavenumbers!r}"
        )
    return shape, modes


def amplification_factor(global_shape, wavenumbers, r: float) -> float:
    """``lambda = 1 - 4 r sum_axes sin^2(pi k / n)``: the factor one step multiplies the mode by."""
    shape, modes = _check_shape_and_modes(global_shape, wavenumbers)
    r = check_stability(r)
    return 1.0 - 4.0 * r * sum(math.sin(math.pi * k / n) ** 2 for k, n in zip(modes, shape))


def exact_solution(global_z, global_y, global_x, global_shape, wavenumbers, r: float, n_steps: int, dtype="float64"):
    """Exact discrete solution ``lambda**n_steps * mode`` at global indices.

    Parameters
    ----------
    global_z, global_y, global_x : array_like of int, broadcastable
        Global indices (NumPy or CuPy; any integers, the mode is periodic).
    global_shape : (int, int, int)
        ``(nz, ny, nx)``.
    wavenumbers : (int, int, int)
        ``(kz, ky, kx)``.
    r : float
        Diffusion number ``kappa dt / dx^2`` in ``[0, 1/6]``.
    n_steps : int
        Number of steps taken (0 gives the initial condition).
    dtype : str or numpy.dtype
        Dtype of the result.

    Returns
    -------
    array, the broadcast shape of the indices
        A CuPy array when any index array is a CuPy array, else a NumPy array.
    """
    if int(n_steps) != n_steps or n_steps < 0:
        raise ConfigurationError(f"heat3d: expected a non-negative integer n_steps, found {n_steps!r}")
    shape, modes = _check_shape_and_modes(global_shape, wavenumbers)
    factor = amplification_factor(shape, modes, r) ** int(n_steps)
    indices = (global_z, global_y, global_x)
    on_gpu = any(is_cupy(index) for index in indices)
    if on_gpu:
        import cupy

        indices = tuple(cupy.asnumpy(index) for index in indices)
    value = factor
    for index, k, n in zip(indices, modes, shape):
        # Reduce k * i modulo n in integers first: the cosine argument then stays in [0, 2 pi).
        phase = np.mod(np.asarray(index, dtype=np.int64) * k, n)
        value = value * np.cos(2.0 * np.pi * phase / n)
    values = np.asarray(value, dtype=np.dtype(dtype))
    if on_gpu:
        return cupy.asarray(values)
    return values


def initial_condition(global_z, global_y, global_x, global_shape, wavenumbers, dtype="float64"):
    """The initial Fourier mode at global indices (``exact_solution`` at step 0, any r)."""
    return exact_solution(global_z, global_y, global_x, global_shape, wavenumbers, 0.0, 0, dtype)

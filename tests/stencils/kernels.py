"""Stencils used by the kernel-layer tests, each with a serial NumPy reference on the global array.

The references use ``np.roll`` on periodic global arrays (or padded copies for walls) and write the
arithmetic in the order the stencil does, so that results compare bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from hpcgpu.stencils import stencil


@stencil
def heat(u, alpha):
    """5-point explicit diffusion."""
    return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])


def heat_reference(u, alpha):
    s = lambda dy, dx: np.roll(u, (-dy, -dx), axis=(0, 1))
    return u + alpha * ((((s(-1, 0) + s(1, 0)) + s(0, -1)) + s(0, 1)) - 4 * u)


@stencil
def gray_scott(u, v, feed, kill, diffusion_u, diffusion_v, dt):
    laplacian_u = u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0]
    laplacian_v = v[-1, 0] + v[1, 0] + v[0, -1] + v[0, 1] - 4 * v[0, 0]
    reaction = u[0, 0] * v[0, 0] ** 2
    return (u[0, 0] + dt * (diffusion_u * laplacian_u - reaction + feed * (1 - u[0, 0])),
            v[0, 0] + dt * (diffusion_v * laplacian_v + reaction - (feed + kill) * v[0, 0]))


def gray_scott_reference(u, v, feed, kill, diffusion_u, diffusion_v, dt):
    def laplacian(a):
        s = lambda dy, dx: np.roll(a, (-dy, -dx), axis=(0, 1))
        return (((s(-1, 0) + s(1, 0)) + s(0, -1)) + s(0, 1)) - 4 * a
    reaction = u * (v * v)
    return (u + dt * ((diffusion_u * laplacian(u) - reaction) + feed * (1 - u)),
            v + dt * ((diffusion_v * laplacian(v) + reaction) - (feed + kill) * v))


@stencil
def box_blur_wide(u, w):
    """9 points with corners and a reach of 2 along x: corners needed, rim 1 x 2."""
    centre = u[0, 0] + u[0, -2] + u[0, 2]
    diagonal = u[-1, -1] + u[-1, 1] + u[1, -1] + u[1, 1]
    return w * centre + (1 - w) * 0.25 * diagonal + abs(u[1, 0] - u[-1, 0])


def box_blur_wide_reference(u, w):
    s = lambda dy, dx: np.roll(u, (-dy, -dx), axis=(0, 1))
    centre = (u + s(0, -2)) + s(0, 2)
    diagonal = ((s(-1, -1) + s(-1, 1)) + s(1, -1)) + s(1, 1)
    return (w * centre + ((1 - w) * 0.25) * diagonal) + np.abs(s(1, 0) - s(-1, 0))


@stencil
def diffusion_3d(c, k):
    """7-point diffusion with a clipped, min/max/where-style tail."""
    laplacian = c[-1, 0, 0] + c[1, 0, 0] + c[0, -1, 0] + c[0, 1, 0] + c[0, 0, -1] + c[0, 0, 1] - 6 * c[0, 0, 0]
    new = c[0, 0, 0] + k * laplacian
    return max(min(new, 10.0), -10.0) if new == new else 0.0


def diffusion_3d_reference(c, k):
    s = lambda d: np.roll(c, tuple(-x for x in d), axis=(0, 1, 2))
    laplacian = (((((s((-1, 0, 0)) + s((1, 0, 0))) + s((0, -1, 0))) + s((0, 1, 0))) + s((0, 0, -1)))
                 + s((0, 0, 1))) - 6 * c
    new = c + k * laplacian
    clipped = np.where(-10.0 > np.where(10.0 < new, 10.0, new), -10.0, np.where(10.0 < new, 10.0, new))
    return np.where(new == new, clipped, 0.0)


@stencil
def upwind_1d(q, courant):
    return q[0] - courant * (q[0] - q[-1])


def upwind_1d_reference(q, courant):
    return q - courant * (q - np.roll(q, 1))


@stencil
def smooth_sqrt(u):
    return math.sqrt(u[0, 0] * u[0, 0] + u[1, 0] ** 2) / 2


def smooth_sqrt_reference(u):
    return np.sqrt(u * u + np.roll(u, -1, axis=0) ** 2) / 2

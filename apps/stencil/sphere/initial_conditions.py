"""Williamson et al. (1992) test cases 2, 5 and 6 as point values on the staggered grid.

Each case is an :class:`InitialCondition`: functions of (lon, lat) in rad giving the fluid depth h
(m; ``h + h_s`` is the free surface), u, v (m/s) and the bottom height h_s (m). Case 2 is a steady
state, so its initial h is also the exact solution at any time.

``williamson2``  steady zonal geostrophic flow, ``u0 = 2 pi a / 12 days``, ``g h0 = 2.94e4 m^2/s^2``,
                 flow (and Coriolis) axis tilted by ``alpha``
``williamson5``  zonal flow over an isolated mountain, ``u0 = 20 m/s``, ``h0 = 5960 m``, cone of
                 2000 m, radius pi/9, centred at (3 pi/2, pi/6)
``williamson6``  Rossby-Haurwitz wave 4, ``omega = K = 7.848e-6 1/s``, ``h0 = 8000 m``
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from apps.stencil.sphere.parameters import SphereParameters
from hpcgpu.errors import ConfigurationError

SECONDS_PER_DAY = 86400.0
INITIAL_CONDITIONS = ("williamson2", "williamson5", "williamson6")


@dataclasses.dataclass(frozen=True)
class InitialCondition:
    """Point-value functions ``f(lon, lat)`` (rad, broadcasting NumPy arrays) of one test case."""

    name: str
    depth: Callable
    u: Callable
    v: Callable
    topography: Callable | None = None
    rossby_haurwitz_speed: float | None = None  # analytic zonal drift in rad/s (case 6)


def williamson2(p: SphereParameters) -> InitialCondition:
    a, omega, g, alpha = p.radius, p.omega, p.gravity, p.alpha
    u0 = 2.0 * math.pi * a / (12.0 * SECONDS_PER_DAY)
    gh0 = 2.94e4

    def depth(lon, lat):
        tilt = -np.cos(lon) * np.cos(lat) * math.sin(alpha) + np.sin(lat) * math.cos(alpha)
        return (gh0 - (a * omega * u0 + 0.5 * u0 * u0) * tilt * tilt) / g

    return InitialCondition(
        "williamson2", depth,
        lambda lon, lat: u0 * (np.cos(lat) * math.cos(alpha) + np.cos(lon) * np.sin(lat) * math.sin(alpha)),
        lambda lon, lat: -u0 * np.sin(lon) * math.sin(alpha) + 0.0 * lat,
    )  # fmt: skip


def williamson5(p: SphereParameters) -> InitialCondition:
    a, omega, g = p.radius, p.omega, p.gravity
    u0, h0, mountain, radius = 20.0, 5960.0, 2000.0, math.pi / 9.0
    lon_c, lat_c = 1.5 * math.pi, math.pi / 6.0

    def topography(lon, lat):
        r = np.sqrt(np.minimum(radius**2, (lon - lon_c) ** 2 + (lat - lat_c) ** 2))
        return mountain * (1.0 - r / radius)

    def depth(lon, lat):
        surface = h0 - (a * omega * u0 + 0.5 * u0 * u0) * np.sin(lat) ** 2 / g
        return surface - topography(lon, lat)

    return InitialCondition("williamson5", depth, lambda lon, lat: u0 * np.cos(lat) + 0.0 * lon,
                            lambda lon, lat: 0.0 * (lon + lat), topography)  # fmt: skip


def williamson6(p: SphereParameters) -> InitialCondition:
    a, big_omega, g = p.radius, p.omega, p.gravity
    w = k = 7.848e-6
    r, h0 = 4, 8000.0

    def depth(lon, lat):
        c = np.cos(lat)
        big_a = 0.5 * w * (2.0 * big_omega + w) * c**2 + 0.25 * k * k * c ** (2 * r) * (
            (r + 1) * c**2 + (2 * r * r - r - 2) - 2 * r * r / c**2)
        big_b = 2.0 * (big_omega + w) * k / ((r + 1) * (r + 2)) * c**r * ((r * r + 2 * r + 2) - (r + 1) ** 2 * c**2)
        big_c = 0.25 * k * k * c ** (2 * r) * ((r + 1) * c**2 - (r + 2))
        return h0 + a * a * (big_a + big_b * np.cos(r * lon) + big_c * np.cos(2 * r * lon)) / g

    def u(lon, lat):
        c = np.cos(lat)
        return a * w * c + a * k * c ** (r - 1) * (r * np.sin(lat) ** 2 - c * c) * np.cos(r * lon)

    def v(lon, lat):
        return -a * k * r * np.cos(lat) ** (r - 1) * np.sin(lat) * np.sin(r * lon)

    speed = (r * (3 + r) * w - 2.0 * big_omega) / ((1 + r) * (2 + r))
    return InitialCondition("williamson6", depth, u, v, None, speed)


def make_initial_condition(name: str, parameters: SphereParameters) -> InitialCondition:
    """The named case (one of :data:`INITIAL_CONDITIONS`) for these parameters."""
    builders = {"williamson2": williamson2, "williamson5": williamson5, "williamson6": williamson6}
    if name not in builders:
        raise ConfigurationError(f"unknown --init {name!r} for the latlon grid; choose one of {', '.join(INITIAL_CONDITIONS)}")
    return builders[name](parameters)


def staggered_coordinates(p: SphereParameters, rows: np.ndarray, columns: np.ndarray) -> dict:
    """(lon, lat) 2D arrays in rad of the h, u and v points of global ``rows`` x ``columns``."""
    lat_center = p.center_latitudes(rows)[:, None]
    lat_face = p.face_latitudes(rows)[:, None]
    lon_center = ((np.asarray(columns) + 0.5) * p.dlon)[None, :]
    lon_face = (np.asarray(columns) * p.dlon)[None, :]
    shape = (len(rows), len(columns))
    return {"h": (np.broadcast_to(lon_center, shape), np.broadcast_to(lat_center, shape)),
            "u": (np.broadcast_to(lon_face, shape), np.broadcast_to(lat_center, shape)),
            "v": (np.broadcast_to(lon_center, shape), np.broadcast_to(lat_face, shape))}  # fmt: skip


def initial_owned_state(initial: InitialCondition, p: SphereParameters, local_start, local_shape):
    """(h, u, v) float64 arrays of the owned cells (shape ``local_shape``); v = 0 on the pole faces."""
    rows = np.arange(local_start[0], local_start[0] + local_shape[0])
    columns = np.arange(local_start[1], local_start[1] + local_shape[1])
    points = staggered_coordinates(p, rows, columns)
    h = np.ascontiguousarray(initial.depth(*points["h"]), dtype=np.float64) + np.zeros(local_shape)
    u = np.ascontiguousarray(initial.u(*points["u"]), dtype=np.float64) + np.zeros(local_shape)
    v = np.ascontiguousarray(initial.v(*points["v"]), dtype=np.float64) + np.zeros(local_shape)
    v[rows == 0, :] = 0.0
    return h, u, v

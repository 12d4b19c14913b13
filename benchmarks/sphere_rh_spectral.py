"""Independent spectral reference for the drift of the Williamson case-6 Rossby-Haurwitz wave.

Runs the shallow-water equations on the sphere with Google's spectral dynamical core *Dinosaur*
(PyPI ``dinosaur``, JAX; vorticity-divergence form, Gaussian grid, triangular truncation,
IMEX SIL3 Runge-Kutta of Whitaker & Kar 2013 with gravity-wave terms implicit) and measures the
eastward drift of the wavenumber-4 pattern of h exactly as ``apps.stencil.sphere.diagnostics``
does for the lat-lon C-grid model: phase shift of the zonal wavenumber-4 Fourier coefficient of h
on the latitude circle nearest 45 N between t = 0 and t = ``--days``, divided by the time, as a
ratio to Haurwitz's nondivergent speed ``nu = (R(3+R)w - 2 Omega)/((1+R)(2+R))`` = 12.195 deg/day.

The initial h, u, v are those of :func:`apps.stencil.sphere.initial_conditions.williamson6`
(and ``williamson2`` for the steady-flow validation); vorticity and divergence are computed from
u, v by Dinosaur's spectral transforms. Validations (``--validate``):

1. Williamson case 2 (alpha = 0) stays steady: relative l2 / linf error of h after the run.
2. Nondivergent limit: with g x 1000 (h0 = 8000 m kept, so the same geopotential perturbation
   over a 1000x deeper mean geopotential) the drift must approach Haurwitz's 12.195 deg/day.

Usage::

    python benchmarks/sphere_rh_spectral.py --truncations 21 42 85 --validate
    python benchmarks/sphere_rh_spectral.py --truncations 170

Needs ``pip install dinosaur`` (pulls jax / jaxlib CPU wheels). Runs in float64.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import types

os.environ.setdefault("JAX_ENABLE_X64", "1")

import numpy as np

REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY_ROOT not in sys.path:
    sys.path.insert(0, REPOSITORY_ROOT)

from apps.stencil.sphere.diagnostics import wave_phase_shift  # noqa: E402
from apps.stencil.sphere.initial_conditions import williamson2, williamson6  # noqa: E402

RADIUS = 6.37122e6  # m
OMEGA = 7.292e-5  # 1/s
GRAVITY = 9.80616  # m/s^2
SECONDS_PER_DAY = 86400.0
# Dinosaur works in nondimensional units; we choose radius = 1 and Omega = 1, so the time unit is
# 1/Omega, the velocity unit a Omega and the geopotential unit (a Omega)^2.
VELOCITY_UNIT = RADIUS * OMEGA
GEOPOTENTIAL_UNIT = VELOCITY_UNIT**2

# Default time steps (s) per truncation: advective CFL ~ a / (N u_max) with u_max ~ 100 m/s,
# halved again for accuracy; gravity waves are implicit and do not limit the step.
DEFAULT_TIME_STEP = {21: 1200.0, 31: 900.0, 42: 600.0, 85: 300.0, 106: 240.0, 119: 200.0, 170: 150.0, 213: 120.0}
def _import_dinosaur():
    import jax

    jax.config.update("jax_enable_x64", True)
    from dinosaur import coordinate_systems, layer_coordinates, shallow_water, spherical_harmonic, time_integration

    return types.SimpleNamespace(jax=jax, coordinate_systems=coordinate_systems, layer_coordinates=layer_coordinates,
                                 shallow_water=shallow_water, spherical_harmonic=spherical_harmonic,
                                 time_integration=time_integration)  # fmt: skip


def make_grid(truncation: int):
    """Dinosaur's standard Gaussian grid of triangular truncation T``truncation`` (radius 1)."""
    dino = _import_dinosaur()
    return dino.spherical_harmonic.Grid.construct(max_wavenumber=truncation, gaussian_nodes={
        21: 16, 31: 24, 42: 32, 85: 64, 106: 80, 119: 90, 170: 128, 213: 160}[truncation])  # fmt: skip


# Latitudes (deg) at which the lat-lon C-grid model measures the drift: the cell-centre row that
# argmin |lat - 45| picks at 64x32, 128x64 and 256x128 (exact ties between 2 rows go south).
CGRID_LATITUDES_DEG = (42.1875, 43.59375, 44.296875)


def normalized_legendre(order: int, degree_max: int, mu: np.ndarray) -> np.ndarray:
    """Orthonormal associated Legendre functions P_n^m(mu), n = m..degree_max; shape (n, len(mu)).

    Normalised so that the integral over mu in [-1, 1] of P_n^m P_k^m is delta_nk; standard stable
    three-term recurrence in n (no Condon-Shortley phase: only |F_m| ratios and phases in longitude
    are used, so the sign convention does not matter).
    """
    mu = np.asarray(mu, dtype=np.float64)
    m = order
    start = math.sqrt(0.5 * (2 * m + 1) * math.prod((2 * k - 1) / (2 * k) for k in range(1, m + 1)))
    values = np.zeros((degree_max - m + 1, mu.size))
    values[0] = start * (1.0 - mu * mu) ** (0.5 * m)
    previous_a = None
    for i, n in enumerate(range(m + 1, degree_max + 1), start=1):
        a = math.sqrt((4.0 * n * n - 1.0) / (n * n - m * m))
        values[i] = a * (mu * values[i - 1] - (values[i - 2] / previous_a if i >= 2 else 0.0))
        previous_a = a
    return values


def fourier_coefficient_at_latitude(h_nodal, sin_latitudes, weights, order: int, degree_max: int, latitude: float):
    """Zonal Fourier coefficient ``order`` of the field ``h_nodal`` (n_lon, n_lat) at any latitude (rad).

    Exact for a field of triangular truncation ``degree_max`` on a Gaussian grid: the coefficient's
    Legendre expansion is found by Gaussian quadrature and summed at ``sin(latitude)``.
    """
    row_coefficients = np.fft.rfft(np.asarray(h_nodal, dtype=np.float64), axis=0)[order]  # (n_lat,)
    w = np.asarray(weights, dtype=np.float64)
    w = 2.0 * w / np.sum(w)  # Gauss-Legendre weights sum to 2
    basis = normalized_legendre(order, degree_max, sin_latitudes)
    legendre_coefficients = basis @ (w * row_coefficients)
    return complex(legendre_coefficients @ normalized_legendre(order, degree_max, np.array([math.sin(latitude)]))[:, 0])


def run_case(case: str, truncation: int, days: float, gravity: float = GRAVITY, time_step: float | None = None,
             diffusion_hours: float = 0.0) -> dict:
    """Integrate Williamson ``case`` ("williamson2" or "williamson6") for ``days`` at T``truncation``.

    Parameters
    ----------
    gravity : m/s^2; the initial h is the test case's formula with this g (h0 unchanged).
    time_step : s; default from :data:`DEFAULT_TIME_STEP`.
    diffusion_hours : e-folding time (h) of the highest total wavenumber under a del-4
        hyperdiffusion filter; 0 disables it.

    Returns
    -------
    dict with the drift (case 6) or the steady-state errors (case 2), the grid and the run time.
    """
    dino = _import_dinosaur()
    jnp = dino.jax.numpy
    grid = make_grid(truncation)
    coords = dino.coordinate_systems.CoordinateSystem(grid, dino.layer_coordinates.LayerCoordinates(1))
    params = types.SimpleNamespace(radius=RADIUS, omega=OMEGA, gravity=gravity, alpha=0.0)
    initial = {"williamson2": williamson2, "williamson6": williamson6}[case](params)

    longitudes, sin_latitudes = grid.nodal_mesh  # shape (n_lon, n_lat), rad
    latitudes = np.arcsin(sin_latitudes)
    u = initial.u(longitudes, latitudes) / VELOCITY_UNIT
    v = initial.v(longitudes, latitudes) / VELOCITY_UNIT
    geopotential = gravity * initial.depth(longitudes, latitudes) / GEOPOTENTIAL_UNIT
    area_weights = np.asarray(grid.quadrature_weights)  # (n_lon, n_lat), sums to 4 pi
    weights = area_weights[0]  # (n_lat,) Gauss weights (up to a constant factor)
    # The global mean is the semi-implicit reference geopotential: gravity waves on it are implicit.
    mean_geopotential = float(np.sum(geopotential * area_weights) / np.sum(area_weights))
    vorticity, divergence = dino.spherical_harmonic.uv_nodal_to_vor_div_modal(grid, jnp.asarray(u), jnp.asarray(v))
    state = dino.shallow_water.State(vorticity=vorticity[None], divergence=divergence[None],
                                     potential=grid.to_modal(jnp.asarray(geopotential - mean_geopotential))[None])

    dt_seconds = time_step or DEFAULT_TIME_STEP[truncation]
    n_steps = int(round(days * SECONDS_PER_DAY / dt_seconds))
    dt = dt_seconds * OMEGA  # nondimensional
    physics = types.SimpleNamespace(angular_velocity=1.0)
    equation = dino.shallow_water.ShallowWaterEquations(coords, physics, None, np.array([mean_geopotential]))
    step = dino.time_integration.imex_rk_sil3(equation, dt)
    filters = []
    if diffusion_hours > 0:
        filters.append(dino.time_integration.horizontal_diffusion_step_filter(
            grid, dt, tau=diffusion_hours * 3600.0 * OMEGA, order=2))
    step = dino.time_integration.step_with_filters(step, filters)
    advance = dino.jax.jit(lambda s: dino.jax.lax.fori_loop(0, n_steps, lambda i, x: step(x), s))

    start = time.perf_counter()
    final = advance(state)
    final.potential.block_until_ready()
    seconds = time.perf_counter() - start

    h = (np.asarray(grid.to_nodal(final.potential[0])) + mean_geopotential) * GEOPOTENTIAL_UNIT / gravity
    elapsed = n_steps * dt_seconds
    result = {"case": case, "truncation": truncation, "grid": f"{grid.longitude_nodes}x{grid.latitude_nodes}",
              "gravity_factor": gravity / GRAVITY, "time_step_s": dt_seconds, "steps": n_steps,
              "days": elapsed / SECONDS_PER_DAY, "wall_s": seconds, "finite": bool(np.all(np.isfinite(h)))}  # fmt: skip
    if case == "williamson2":
        exact = initial.depth(longitudes, latitudes)
        w = area_weights
        result["l2"] = float(np.sqrt(np.sum(w * (h - exact) ** 2) / np.sum(w * exact**2)))
        result["linf"] = float(np.max(np.abs(h - exact)) / np.max(np.abs(exact)))
        return result
    row = int(np.argmin(np.abs(latitudes[0] - math.radians(45.0))))
    row_longitudes = longitudes[:, row]
    initial_row = initial.depth(row_longitudes, np.full_like(row_longitudes, latitudes[0, row]))
    speed = initial.rossby_haurwitz_speed  # rad/s
    shift = wave_phase_shift(initial_row, h[:, row], 4, speed * elapsed)
    per_day = math.degrees(1.0) * SECONDS_PER_DAY / elapsed
    # Sensitivity to the latitude choice: the same measurement on every Gaussian row in 40-50 N.
    band = [j for j in range(latitudes.shape[1]) if 40.0 <= math.degrees(latitudes[0, j]) <= 50.0]
    band_ratios = [wave_phase_shift(initial.depth(row_longitudes, np.full_like(row_longitudes, latitudes[0, j])),
                                    h[:, j], 4, speed * elapsed) / (speed * elapsed) for j in band]  # fmt: skip
    result.update(band_ratio_min=min(band_ratios), band_ratio_max=max(band_ratios))
    # The same measurement at exactly 45 N and at the C-grid model's rows, from the exact spectral
    # interpolation of the m = 4 coefficient (initial one from the analytic h on a fine circle).
    circle = np.arange(256) * 2.0 * math.pi / 256  # starts at 0 like the Gaussian grid
    exact_ratios = {}
    for latitude_deg in (45.0,) + CGRID_LATITUDES_DEG:
        lat = math.radians(latitude_deg)
        before = np.fft.rfft(initial.depth(circle, np.full_like(circle, lat)))[4] / 256
        after = fourier_coefficient_at_latitude(h, sin_latitudes[0], weights, 4, truncation, lat) / grid.longitude_nodes
        # wave_phase_shift works on rows; feed it two pure wavenumber-4 rows with these coefficients.
        pure = lambda c: 2.0 * np.real(c * np.exp(4j * circle))  # noqa: E731
        exact_ratios[latitude_deg] = wave_phase_shift(pure(before), pure(after), 4, speed * elapsed) / (speed * elapsed)
    result["ratio_at_latitude"] = exact_ratios
    result.update(latitude_deg=math.degrees(latitudes[0, row]), measured_deg_per_day=shift * per_day,
                  haurwitz_deg_per_day=speed * elapsed * per_day, ratio_to_haurwitz=shift / (speed * elapsed))
    return result


def _print_drift(result: dict) -> None:
    print(f"T{result['truncation']:<4d} {result['grid']:>9s} g x{result['gravity_factor']:<6g} dt={result['time_step_s']:6.0f}s "
          f"lat={result['latitude_deg']:6.2f}  drift={result['measured_deg_per_day']:8.4f} deg/day  "
          f"Haurwitz={result['haurwitz_deg_per_day']:7.4f}  ratio={result['ratio_to_haurwitz']:.4f} "
          f"(40-50N rows: {result['band_ratio_min']:.4f}..{result['band_ratio_max']:.4f}; at "
          + ", ".join(f"{lat:g}N {r:.4f}" for lat, r in result["ratio_at_latitude"].items()) + ")  "
          f"wall={result['wall_s']:6.1f}s", flush=True)  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--truncations", type=int, nargs="+", default=[21, 42, 85],
                        help="triangular truncations to run (21 31 42 85 106 119 170 213); default 21 42 85")
    parser.add_argument("--days", type=float, default=5.0, help="integration length in days (default 5)")
    parser.add_argument("--time-step", type=float, default=None,
                        help="time step in s for all truncations (default: per truncation, T85 300 s)")
    parser.add_argument("--diffusion-hours", type=float, default=0.0,
                        help="del-4 hyperdiffusion e-folding time of the top wavenumber in hours (0 = off, default)")
    parser.add_argument("--validate", action="store_true",
                        help="also run case 2 (steady state) and the g x 1000 nondivergent limit at each truncation")
    parser.add_argument("--dt-check", action="store_true", help="also rerun each truncation with half the time step")
    args = parser.parse_args(argv)

    common = {"days": args.days, "diffusion_hours": args.diffusion_hours}
    if args.validate:
        print("# validation 1: Williamson case 2 (alpha = 0), relative h errors after the run")
        for n in args.truncations:
            r = run_case("williamson2", n, time_step=args.time_step, **common)
            print(f"T{n:<4d} {r['grid']:>9s} dt={r['time_step_s']:6.0f}s days={r['days']:.2f}  l2={r['l2']:.3e}  "
                  f"linf={r['linf']:.3e}  wall={r['wall_s']:.1f}s", flush=True)  # fmt: skip
        print("# validation 2: case 6 with g x 1000 (nondivergent limit), ratio should be ~1")
        for n in args.truncations:
            _print_drift(run_case("williamson6", n, gravity=1000.0 * GRAVITY, time_step=args.time_step, **common))
            if args.dt_check:
                dt = (args.time_step or DEFAULT_TIME_STEP[n]) / 2
                _print_drift(run_case("williamson6", n, gravity=1000.0 * GRAVITY, time_step=dt, **common))
    print("# case 6 at Earth's g: drift of wavenumber 4 at the Gaussian latitude nearest 45 N")
    for n in args.truncations:
        _print_drift(run_case("williamson6", n, time_step=args.time_step, **common))
        if args.dt_check:
            dt = (args.time_step or DEFAULT_TIME_STEP[n]) / 2
            _print_drift(run_case("williamson6", n, time_step=dt, **common))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Williamson case 2 convergence, and energy / enstrophy behaviour of the scheme.

Measured (1 day, CFL 0.8, cutoff 60 deg; l2 of h): 32x64 2.69e-4, 64x128 6.62e-5, 128x256 1.65e-5
for alpha = 0 (order 2.02, 2.01); alpha = pi/2 - 0.05: 3.40e-4, 8.55e-5, 2.13e-5 (order 1.99, 2.01).
"""

import math

import numpy as np
import pytest
from sphere_reference import global_state, padded_from_global, run_tiled

from apps.stencil.sphere.parameters import EARTH_GRAVITY
from apps.stencil.sphere import SphereParameters, error_norms, local_diagnostics, local_error_sums, stability_rate, tile_parameters

FORMAL_ORDER = 2.0


def case2_errors(n, alpha, days=1.0):
    p = SphereParameters(nx=2 * n, ny=n, alpha=alpha)
    state, _ = global_state(p)
    tile = tile_parameters(p, 0, p.ny, 0, p.nx)
    rate = stability_rate(*padded_from_global(state, (0, p.ny), (0, p.nx), p), tile, p.filter_latitude)
    seconds = days * 86400.0
    n_steps = math.ceil(seconds * rate / 0.8)
    final = run_tiled(state, p, [0, p.ny], [0, p.nx], seconds / n_steps, n_steps)
    padded_h = padded_from_global(final, (0, p.ny), (0, p.nx), p)[0]
    return error_norms(local_error_sums(padded_h, state[0], tile))


@pytest.mark.parametrize("alpha", [0.0, math.pi / 2 - 0.05])
def test_case2_height_error_converges_at_second_order(alpha):
    errors = [case2_errors(n, alpha) for n in (16, 32, 64)]
    for norm in ("l1", "l2", "linf"):
        orders = [math.log2(coarse[norm] / fine[norm]) for coarse, fine in zip(errors, errors[1:])]
        assert min(orders) >= FORMAL_ORDER - 0.3, (norm, orders, errors)
    assert errors[-1]["l2"] < 2e-4


def test_energy_is_nearly_conserved_and_the_drift_is_temporal():
    """The semi-discrete scheme conserves energy: the drift of case 6 comes from the time stepping
    (and the polar filter acting on the increments) and shrinks at least like dt^2 (measured 3.9x)."""
    p = SphereParameters(nx=32, ny=16)
    state, _ = global_state(p, "williamson6")
    tile = tile_parameters(p, 0, p.ny, 0, p.nx)

    def energy(fields):
        return local_diagnostics(*padded_from_global(fields, (0, p.ny), (0, p.nx), p), tile)["energy"]

    start = energy(state)
    drifts = []
    for dt, steps in ((1200.0, 18), (600.0, 36)):
        drifts.append(abs(energy(run_tiled(state, p, [0, p.ny], [0, p.nx], dt, steps)) - start) / start)
    assert drifts[0] < 1e-6
    assert drifts[1] < drifts[0] / 3.5


def rossby_haurwitz_drift_ratio(n=32, gravity_factor=1.0, days=5.0, n_steps=None):
    """Case 6 at 2n x n: the eastward shift of the wavenumber-4 pattern of h at 45N after ``days``,
    divided by the shift at Haurwitz's nondivergent speed. ``gravity_factor`` multiplies g with the
    geopotential of the initial state unchanged (gH grows, the flow tends to the nondivergent one)."""
    p = SphereParameters(nx=2 * n, ny=n, gravity=EARTH_GRAVITY * gravity_factor)
    state, initial = global_state(p, "williamson6")
    seconds = days * 86400.0
    if n_steps is None:
        tile = tile_parameters(p, 0, p.ny, 0, p.nx)
        rate = stability_rate(*padded_from_global(state, (0, p.ny), (0, p.nx), p), tile, p.filter_latitude)
        n_steps = math.ceil(seconds * rate / 0.8)
    final = run_tiled(state, p, [0, p.ny], [0, p.nx], seconds / n_steps, n_steps)
    row = int(np.argmin(np.abs(p.center_latitudes(np.arange(p.ny)) - math.radians(45.0))))
    before, after = np.fft.rfft(state[0][row])[4], np.fft.rfft(final[0][row])[4]
    expected_shift = initial.rossby_haurwitz_speed * seconds
    # The phase of wavenumber 4 is known modulo 2 pi / 4: pick the shift nearest the expected one.
    shift = -np.angle(after / before) / 4
    shift += round((expected_shift - shift) / (math.pi / 2)) * (math.pi / 2)
    return shift / expected_shift


def test_rossby_haurwitz_wave_drifts_east_near_the_haurwitz_speed():
    """Case 6 at 64x32 for 5 days: the wavenumber-4 pattern of h at 45N moves east at 0.94 of the
    nondivergent Haurwitz speed (measured 0.944; 0.929 at 128x64). The shallow-water wave is slower
    than the nondivergent formula, so this checks the drift loosely (within 10%), not the 5% goal."""
    ratio = rossby_haurwitz_drift_ratio(32, n_steps=720)
    assert abs(ratio - 1) < 0.10, ratio


def test_rossby_haurwitz_drift_tends_to_haurwitz_in_the_nondivergent_limit():
    """Haurwitz's speed is exact for nondivergent flow. Raising g with the same initial geopotential
    (gH -> infinity) makes the shallow-water flow nondivergent, and the measured drift must approach
    the formula: measured 0.9445 (g), 0.9585 (4 g), 0.9708 (16 g) at 64x32 (0.9297, 0.9602, 0.9844 at
    128x64). Within 5% at 16 g, and monotone in g: the ~7% deficit at Earth's g is the divergence of the
    shallow-water wave, not a wrong term in the scheme (which would not vanish in this limit)."""
    ratios = [rossby_haurwitz_drift_ratio(32, factor) for factor in (1.0, 4.0, 16.0)]
    assert ratios[0] < ratios[1] < ratios[2], ratios
    assert abs(ratios[2] - 1) <= 0.05, ratios


# Case-6 drift over 5 days / Haurwitz's speed from an independent spectral shallow-water model (Google's
# Dinosaur, T170, converged: docs/sphere_spectral_reference.md), at the latitude rows nearest 45N that
# this model measures on at 64x32 (42.1875N) and 128x64 (43.59375N).
SPECTRAL_REFERENCE_DRIFT = {32: 0.9252, 64: 0.9243}


def test_rossby_haurwitz_drift_converges_to_the_spectral_reference():
    """The shallow-water drift is not Haurwitz's nondivergent speed but ~0.923 of it (spectral
    reference). Our drift approaches that reference as the grid is refined: measured +2.1% at 64x32,
    +0.6% at 128x64 (+0.1% at 256x128, docs/performance.md)."""
    differences = {n: rossby_haurwitz_drift_ratio(n, n_steps=720 if n == 32 else None) / reference - 1
                   for n, reference in SPECTRAL_REFERENCE_DRIFT.items()}
    assert abs(differences[32]) <= 0.03, differences
    assert abs(differences[64]) <= 0.01, differences
    assert abs(differences[64]) < abs(differences[32]), differences


@pytest.mark.xfail(strict=True, reason=(
    "the goal asks for the case-6 drift within 5% of the 'analytic' (nondivergent Haurwitz) speed; at Earth's g "
    "the scheme converges to about 0.92 of it (0.9445, 0.9297, 0.9249 at 64x32, 128x64, 256x128). The test "
    "above shows the deficit vanishes as gH -> infinity, i.e. it is the shallow-water wave's divergence, and an "
    "independent spectral model gives 0.923 (docs/sphere_spectral_reference.md): no correct shallow-water "
    "solver meets this criterion"))
def test_rossby_haurwitz_drift_within_5_percent_of_haurwitz():
    ratio = rossby_haurwitz_drift_ratio(32, n_steps=720)
    assert abs(ratio - 1) <= 0.05, ratio

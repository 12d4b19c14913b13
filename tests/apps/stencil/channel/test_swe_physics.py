"""Physical properties of the scheme: conservation, steady geostrophic jet and its convergence,
symmetry of a radiating bump, and the closed-form balance of the jet."""

import numpy as np
import pytest
from swe_reference import single_tile_fill_fn, tile_from_global

from apps.stencil.channel import (
    SWEParameters,
    fill_channel_boundaries,
    fill_initial_state,
    local_diagnostics,
    ssp_rk3_step,
    stable_dt,
    tile_parameters,
)
from apps.stencil.channel.initial_conditions import Jet, gaussian, jet, staggered_coordinates


def run_single_tile(parameters, initial_condition, n_steps=None, end_time=None, cfl=0.8):
    """Run one whole-channel tile; returns (padded state, tile params, initial diagnostics, dt)."""
    w = parameters.halo_width
    shape = (parameters.ny + 2 * w, parameters.nx + 2 * w)
    state = [np.zeros(shape) for _ in range(3)]
    fill_initial_state(initial_condition, *state, parameters, (0, 0), w)
    params = tile_parameters(parameters, 0, parameters.ny, w)
    fill = single_tile_fill_fn(parameters, w)
    fill(state)
    initial = local_diagnostics(*state, params)
    dt = stable_dt(*state, params, cfl=cfl)
    if end_time is not None:
        n_steps = int(np.ceil(end_time / dt))
        dt = end_time / n_steps
    work_1 = [np.zeros(shape) for _ in range(3)]
    work_2 = [np.zeros(shape) for _ in range(3)]
    region = (w, w + parameters.ny, w, w + parameters.nx)
    for _ in range(n_steps):
        ssp_rk3_step(state, work_1, work_2, dt, params, region, fill)
    fill(state)
    return state, params, initial, dt


def test_mass_conserved_over_hundreds_of_jet_steps():
    """Flux-form continuity: total mass changes only by rounding (<= 1e-12 relative, 300 steps)."""
    parameters = SWEParameters(nx=64, ny=48, dx=10.0e3, dy=10.0e3)
    state, params, initial, _ = run_single_tile(parameters, jet(parameters), n_steps=300)
    final = local_diagnostics(*state, params)
    assert abs(final["mass"] / initial["mass"] - 1.0) <= 1e-12
    # The jet did evolve (the perturbation grows), so this is not a trivially frozen state.
    assert np.abs(state[2]).max() > 0.05


def test_energy_nearly_conserved_without_dissipation():
    """Sadourny's energy-conserving scheme: only the time stepping changes energy (tiny), and
    hyperviscosity removes some."""
    inviscid = SWEParameters(nx=64, ny=48, dx=10.0e3, dy=10.0e3, hyperviscosity=0.0)
    state, params, initial, _ = run_single_tile(inviscid, jet(inviscid), n_steps=300)
    final = local_diagnostics(*state, params)
    assert abs(final["energy"] / initial["energy"] - 1.0) < 1e-6
    assert abs(final["potential_enstrophy"] / initial["potential_enstrophy"] - 1.0) < 1e-4

    viscous = SWEParameters(nx=64, ny=48, dx=10.0e3, dy=10.0e3, hyperviscosity=1.0e10)
    state, params, initial, _ = run_single_tile(viscous, jet(viscous), n_steps=300)
    assert local_diagnostics(*state, params)["energy"] < initial["energy"] * (1 - 1e-6)


def test_jet_height_is_the_exact_geostrophic_balance():
    """Closed-form h(y) satisfies g dh/dy = -f(y) u(y) (centred differences, beta included)."""
    parameters = SWEParameters(beta=5.0e-11)
    initial = Jet(parameters, max_speed=10.0, half_width=50.0e3)
    y = np.linspace(0.1, 0.9, 41) * parameters.length_y
    x = np.zeros_like(y)
    step = 1.0
    dh_dy = (initial.height(x, y + step) - initial.height(x, y - step)) / (2 * step)
    np.testing.assert_allclose(
        parameters.gravity * dh_dy, -parameters.coriolis(y) * initial.u(x, y), rtol=1e-6, atol=1e-12
    )
    assert initial.height(x, np.array([0.5 * parameters.length_y]))[0] == parameters.mean_depth


def geostrophic_height_error(n_rows, end_time):
    """RMS height error of the unperturbed jet after end_time on an (n_rows x 2) channel.

    Nothing depends on x, so two columns suffice; Ly = 1000 km, L = 100 km, no dissipation (the
    biharmonic operator would change the continuous solution).
    """
    dy = 1000.0e3 / n_rows
    parameters = SWEParameters(nx=2, ny=n_rows, dx=dy, dy=dy, hyperviscosity=0.0)
    initial = Jet(parameters, max_speed=10.0, half_width=100.0e3)
    state, params, _, _ = run_single_tile(parameters, initial, end_time=end_time, cfl=0.5)
    w = params.halo_width
    rows = np.arange(n_rows)[:, None]
    columns = np.arange(2)[None, :]
    exact = initial.height(*staggered_coordinates("h", rows, columns, parameters))
    error = state[0][w:-w, w:-w] - exact
    return float(np.sqrt(np.mean(error**2))), float(np.abs(state[2]).max())


def test_geostrophic_jet_stays_steady_and_converges_at_second_order():
    """The exact steady jet drifts only by the truncation error, which halves with order 2.

    Measured RMS height errors after 6 h (Ly = 1000 km, L = 100 km, U0 = 10 m/s, CFL 0.5):
    ny = 25: 8.44e-2 m, 50: 1.99e-2 m, 100: 4.96e-3 m, 200: 1.24e-3 m: orders 2.08, 2.00, 2.00.
    """
    errors = []
    for n_rows in (25, 50, 100):
        error, max_v = geostrophic_height_error(n_rows, end_time=6 * 3600.0)
        errors.append(error)
    orders = [np.log2(coarse / fine) for coarse, fine in zip(errors, errors[1:])]
    assert all(order >= 2.0 - 0.3 for order in orders), (errors, orders)
    # Near steady: at 10 km spacing the jet (40 m height drop across it) moves by millimetres.
    assert errors[-1] < 1e-2
    assert max_v < 1e-3 * 10.0


def point_reflection(field, kind):
    """Field rotated by 180 degrees about the channel centre (a cell corner), with the sign of a
    velocity flipped; u and v live on faces, so their index maps differ from h's."""
    if kind == "h":
        return field[::-1, ::-1]
    if kind == "u":  # u[j, i] at x = i dx maps to x = (nx - i) dx: roll by one after reversing
        return -np.roll(field[::-1, ::-1], 1, axis=1)
    raise ValueError(kind)


def test_gaussian_bump_is_symmetric():
    """Without rotation the radiating bump keeps the square's mirror and diagonal symmetries; with
    constant f (beta = 0) it keeps the 180-degree rotation symmetry but not the mirror ones."""
    without_rotation = SWEParameters(nx=32, ny=32, dx=20.0e3, dy=20.0e3, coriolis_f0=0.0, beta=0.0)
    state, params, _, _ = run_single_tile(without_rotation, gaussian(without_rotation, radius=60.0e3), 60)
    w = params.halo_width
    h = state[0][w:-w, w:-w]
    u, v = state[1][w:-w, w:-w], state[2][w:-w, w:-w]
    assert h.max() - h.min() > 0.05  # waves have left the centre
    tolerance = 1e-11
    np.testing.assert_allclose(h, h[::-1, :], rtol=0, atol=tolerance)
    np.testing.assert_allclose(h, h[:, ::-1], rtol=0, atol=tolerance)
    np.testing.assert_allclose(h, h.T, rtol=0, atol=tolerance)
    np.testing.assert_allclose(u, v.T, rtol=0, atol=tolerance)  # u[j, i] and v[i, j] are mirror points

    rotating = SWEParameters(nx=32, ny=32, dx=20.0e3, dy=20.0e3, beta=0.0)
    state, params, _, _ = run_single_tile(rotating, gaussian(rotating, radius=60.0e3), 60)
    h, u = state[0][w:-w, w:-w], state[1][w:-w, w:-w]
    np.testing.assert_allclose(h, point_reflection(h, "h"), rtol=0, atol=tolerance)
    np.testing.assert_allclose(u, point_reflection(u, "u"), rtol=0, atol=tolerance)
    assert np.abs(h - h[::-1, :]).max() > 1e-4  # rotation breaks the mirror symmetry


def test_diagnostics_add_up_over_tiles():
    """Local sums over tiles (wall corners weighted 1/2, north wall corners counted once) equal the
    single-tile value."""
    parameters = SWEParameters(nx=16, ny=12, dx=20.0e3, dy=20.0e3)
    rng = np.random.default_rng(4)
    global_state = [
        100.0 + rng.standard_normal((12, 16)),
        rng.standard_normal((12, 16)),
        rng.standard_normal((12, 16)),
    ]
    global_state[2][0, :] = 0.0
    w = 2
    whole = tile_from_global(global_state, (0, 12), (0, 16), w, parameters)
    expected = local_diagnostics(*whole, tile_parameters(parameters, 0, 12, w))
    totals = dict.fromkeys(expected, 0.0)
    for rows in ((0, 3), (3, 9), (9, 12)):
        for columns in ((0, 5), (5, 16)):
            tile = tile_from_global(global_state, rows, columns, w, parameters)
            params = tile_parameters(parameters, rows[0], rows[1] - rows[0], w)
            for name, value in local_diagnostics(*tile, params).items():
                totals[name] += value
    for name, value in expected.items():
        assert totals[name] == pytest.approx(value, rel=1e-12), name


def test_free_slip_walls_mirror_ghost_rows():
    """South wall, halo 2: h and u mirrored about the wall, v odd with v = 0 on the wall face."""
    w = 2
    rows = np.arange(8, dtype=float)[:, None] * np.ones((1, 5))
    h, u, v = rows + 100.0, rows + 10.0, rows + 1.0
    fill_channel_boundaries(h, u, v, w, at_south=True, at_north=True)
    np.testing.assert_array_equal(h[:, 0], [103, 102, 102, 103, 104, 105, 105, 104])
    np.testing.assert_array_equal(u[:, 0], [13, 12, 12, 13, 14, 15, 15, 14])
    # v rows: ghost 0, 1 = -v[4], -v[3]; wall row 2 = 0; north wall face is row 2 + 4 = 6.
    np.testing.assert_array_equal(v[:, 0], [-5, -4, 0, 4, 5, 6, 0, -6])
    untouched = rows + 7.0
    copy = untouched.copy()
    fill_channel_boundaries(copy, copy.copy(), copy.copy(), w, at_south=False, at_north=False)
    np.testing.assert_array_equal(copy, untouched)

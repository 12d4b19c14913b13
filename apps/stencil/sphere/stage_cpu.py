"""CPU (Numba) implementation of the fused SSP-RK3 stage on the sphere; see :mod:`apps.stencil.sphere.stage`.

Each helper is one discrete quantity at one staggered point, with explicit parentheses; the tests'
NumPy slicing reference writes the same expressions in the same order, so both agree bitwise
(Numba does not contract multiply-adds without ``fastmath``). Constants come in the field dtype.
"""

from __future__ import annotations

from numba import njit, prange

PARALLEL_MIN_CELLS = 16384
"""Regions with fewer cells run the serial loop (same arithmetic, no thread-pool overhead)."""


@njit(cache=True, error_model="numpy")
def _u_flux(h, u, j, i, half):
    """h_u * u at the u point (j, i), m^2/s."""
    return (half * (h[j, i - 1] + h[j, i])) * u[j, i]


@njit(cache=True, error_model="numpy")
def _v_flux(h, v, cos_face, j, i, half):
    """h_v * v * cos(lat_face) at the v point (j, i), m^2/s (0 on the pole faces)."""
    return ((half * (h[j - 1, i] + h[j, i])) * v[j, i]) * cos_face[j]


@njit(cache=True, error_model="numpy")
def _potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, j, i, quarter):
    """q = (f + zeta) / h_q at the SW corner (j, i), 1/(m s); zeta is the circulation / area (0 at poles)."""
    zeta = (v[j, i] - v[j, i - 1]) * rdx_face[j] - (u[j, i] * cos_center[j] - u[j - 1, i] * cos_center[j - 1]) * rdy_face[j]
    h_corner = quarter * ((h[j - 1, i - 1] + h[j - 1, i]) + (h[j, i - 1] + h[j, i]))
    return (coriolis[j, i] + zeta) / h_corner


@njit(cache=True, error_model="numpy")
def _bernoulli(h, u, v, topography, cos_face, rcos_center, j, i, gravity, quarter):
    """B = g (h + h_s) + K at the centre (j, i); K area-weights the v faces by cos(lat_face)/cos(lat_j)."""
    kinetic = quarter * (
        (u[j, i] * u[j, i] + u[j, i + 1] * u[j, i + 1])
        + ((v[j, i] * v[j, i]) * cos_face[j] + (v[j + 1, i] * v[j + 1, i]) * cos_face[j + 1]) * rcos_center[j]
    )
    return gravity * (h[j, i] + topography[j, i]) + kinetic


@njit(cache=True, error_model="numpy")
def _update_row(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
    cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
    coriolis, topography, a, b, dt, gravity, rdy, half, quarter, j, i0, i1,
):  # fmt: skip
    for i in range(i0, i1):
        dh = -((_u_flux(h, u, j, i + 1, half) - _u_flux(h, u, j, i, half)) * rdx_center[j]
               + (_v_flux(h, v, cos_face, j + 1, i, half) - _v_flux(h, v, cos_face, j, i, half)) * rdy_center[j])  # fmt: skip

        q_here = _potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, j, i, quarter)
        q_north = _potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, j + 1, i, quarter)
        q_east = _potential_vorticity(h, u, v, cos_center, rdx_face, rdy_face, coriolis, j, i + 1, quarter)
        v_flux_south = half * (_v_flux(h, v, cos_face, j, i - 1, half) + _v_flux(h, v, cos_face, j, i, half))
        v_flux_north = half * (_v_flux(h, v, cos_face, j + 1, i - 1, half) + _v_flux(h, v, cos_face, j + 1, i, half))
        u_flux_west = half * (_u_flux(h, u, j - 1, i, half) + _u_flux(h, u, j, i, half))
        u_flux_east = half * (_u_flux(h, u, j - 1, i + 1, half) + _u_flux(h, u, j, i + 1, half))

        bernoulli_here = _bernoulli(h, u, v, topography, cos_face, rcos_center, j, i, gravity, quarter)
        bernoulli_west = _bernoulli(h, u, v, topography, cos_face, rcos_center, j, i - 1, gravity, quarter)
        bernoulli_south = _bernoulli(h, u, v, topography, cos_face, rcos_center, j - 1, i, gravity, quarter)
        du = (half * (q_here * v_flux_south + q_north * v_flux_north)) * rcos_center[j] - (
            bernoulli_here - bernoulli_west) * rdx_center[j]
        dv = -(half * (q_here * u_flux_west + q_east * u_flux_east)) - (bernoulli_here - bernoulli_south) * rdy
        # Pole faces never move: v = 0 stays exactly 0.
        dv = dv * v_face_mask[j]

        if filtered_rows[j] != 0:
            # Polar row: leave out alone; the polar filter combines the filtered increment later.
            inc_h[j, i] = dt * dh
            inc_u[j, i] = dt * du
            inc_v[j, i] = dt * dv
        else:
            out_h[j, i] = a * base_h[j, i] + b * (h[j, i] + dt * dh)
            out_u[j, i] = a * base_u[j, i] + b * (u[j, i] + dt * du)
            out_v[j, i] = a * base_v[j, i] + b * (v[j, i] + dt * dv)


@njit(parallel=True, cache=True, error_model="numpy")
def _stage_parallel(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
    cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
    coriolis, topography, a, b, dt, gravity, rdy, half, quarter, j0, j1, i0, i1,
):  # fmt: skip
    """Rows [j0, j1) spread over the Numba thread pool."""
    for j in prange(j0, j1):
        _update_row(
            out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
            cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
            coriolis, topography, a, b, dt, gravity, rdy, half, quarter, j, i0, i1,
        )  # fmt: skip


@njit(cache=True, error_model="numpy")
def _stage_serial(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
    cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
    coriolis, topography, a, b, dt, gravity, rdy, half, quarter, j0, j1, i0, i1,
):  # fmt: skip
    """Rows [j0, j1) one after the other on the calling thread."""
    for j in range(j0, j1):
        _update_row(
            out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
            cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
            coriolis, topography, a, b, dt, gravity, rdy, half, quarter, j, i0, i1,
        )  # fmt: skip


def stage_cpu(*args) -> None:
    """Run the stage loop; ``args`` as for ``_stage_serial``, region bounds (j0, j1, i0, i1) last."""
    j0, j1, i0, i1 = args[-4:]
    if (j1 - j0) * (i1 - i0) >= PARALLEL_MIN_CELLS:
        _stage_parallel(*args)
    else:
        _stage_serial(*args)

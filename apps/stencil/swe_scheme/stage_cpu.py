"""CPU (Numba) kernel of the fused SSP-RK3 stage, for both grids; see :mod:`apps.stencil.swe_scheme.stage`.

Each helper is one discrete quantity of the scheme at one staggered point, written with explicit
parentheses and the grid's metric factors (:mod:`apps.stencil.swe_scheme.metrics`). The CUDA
device functions (:mod:`apps.stencil.swe_scheme.cuda_device`) and the tests' NumPy references
write the same expressions in the same order, so all agree bitwise (Numba does not contract
multiply-adds without ``fastmath``; the CUDA modules are built with ``--fmad=false``).

The loop is compiled twice, threaded (``prange`` over rows) and serial: below
:data:`PARALLEL_MIN_CELLS` cells (thin rim strips, small tiles) the fork/join of the thread pool
costs more than the work. Both run the identical per-cell arithmetic.

Constants (0.5, 0.25, 2) come in as arguments of the field dtype: a float literal in Numba is
float64 and would silently promote float32 arithmetic. The per-row metric factors are read once
per row. ``coriolis`` and ``topography`` are 2-D (a grid with f per row or a flat bottom passes
stride-0 broadcast views).
"""

from __future__ import annotations

from numba import njit, prange

PARALLEL_MIN_CELLS = 16384
"""Regions with fewer cells run the serial loop (same arithmetic, no thread-pool overhead)."""


@njit(cache=True, error_model="numpy")
def _u_flux(h, u, j, i, half):
    """Zonal mass flux U = h_u * u at the u point (j, i) (west face), m^2/s."""
    return (half * (h[j, i - 1] + h[j, i])) * u[j, i]


@njit(cache=True, error_model="numpy")
def _v_flux(h, v, j, i, cos_face_j, half):
    """Meridional mass flux V = h_v * v * cos_face at the v point (j, i) (south face), m^2/s."""
    return ((half * (h[j - 1, i] + h[j, i])) * v[j, i]) * cos_face_j


@njit(cache=True, error_model="numpy")
def _potential_vorticity(h, u, v, coriolis, j, i, cos_south, cos_north, rdx_face_j, rdy_face_j, quarter):
    """q = (f + zeta) / h_q at the south-west corner (j, i), 1/(m s); zeta = circulation / area.

    ``cos_south``, ``cos_north`` are ``cos_center`` of rows j - 1 and j.
    """
    zeta = (v[j, i] - v[j, i - 1]) * rdx_face_j - (u[j, i] * cos_north - u[j - 1, i] * cos_south) * rdy_face_j
    h_corner = quarter * ((h[j - 1, i - 1] + h[j - 1, i]) + (h[j, i - 1] + h[j, i]))
    return (coriolis[j, i] + zeta) / h_corner


@njit(cache=True, error_model="numpy")
def _bernoulli(h, u, v, topography, j, i, cos_face_south, cos_face_north, rcos_center_j, gravity, quarter):
    """B = g (h + h_s) + K at the centre (j, i); K weights the v faces by cos(lat_face) / cos(lat_j)."""
    kinetic = quarter * (
        (u[j, i] * u[j, i] + u[j, i + 1] * u[j, i + 1])
        + ((v[j, i] * v[j, i]) * cos_face_south + (v[j + 1, i] * v[j + 1, i]) * cos_face_north) * rcos_center_j
    )
    return gravity * (h[j, i] + topography[j, i]) + kinetic


@njit(cache=True, error_model="numpy")
def _laplacian(a, j, i, rdx2, rdy2, two):
    """Five-point Laplacian of a at (j, i) on a uniform grid, same staggering as a."""
    return ((a[j, i - 1] + a[j, i + 1]) - two * a[j, i]) * rdx2 + ((a[j - 1, i] + a[j + 1, i]) - two * a[j, i]) * rdy2


@njit(cache=True, error_model="numpy")
def _bilaplacian(a, j, i, rdx2, rdy2, two):
    """Laplacian of the Laplacian of a at (j, i) (13-point stencil)."""
    centre = _laplacian(a, j, i, rdx2, rdy2, two)
    west = _laplacian(a, j, i - 1, rdx2, rdy2, two)
    east = _laplacian(a, j, i + 1, rdx2, rdy2, two)
    south = _laplacian(a, j - 1, i, rdx2, rdy2, two)
    north = _laplacian(a, j + 1, i, rdx2, rdy2, two)
    return ((west + east) - two * centre) * rdx2 + ((south + north) - two * centre) * rdy2


@njit(cache=True, error_model="numpy")
def _update_row(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
    cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
    coriolis, topography, a, b, dt, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
    j, i0, i1,
):  # fmt: skip
    """Row j, columns [i0, i1): ``out = a*base + b*(stage + dt*L)``, or ``inc = dt*L`` on a filtered row."""
    cos_south, cos_here, cos_north = cos_center[j - 1], cos_center[j], cos_center[j + 1]
    cos_face_south, cos_face_here, cos_face_north = cos_face[j - 1], cos_face[j], cos_face[j + 1]
    rcos_south, rcos_here = rcos_center[j - 1], rcos_center[j]
    rdx_here, rdy_here = rdx_center[j], rdy_center[j]
    rdx_face_here, rdy_face_here = rdx_face[j], rdy_face[j]
    rdx_face_north, rdy_face_north = rdx_face[j + 1], rdy_face[j + 1]
    mask = v_face_mask[j]
    filtered = filtered_rows[j] != 0
    for i in range(i0, i1):
        # Continuity in flux form: what leaves one cell enters its neighbour, so mass is exact.
        dh = -((_u_flux(h, u, j, i + 1, half) - _u_flux(h, u, j, i, half)) * rdx_here
               + (_v_flux(h, v, j + 1, i, cos_face_north, half) - _v_flux(h, v, j, i, cos_face_here, half)) * rdy_here)

        # Sadourny's energy-conserving vorticity flux: q times the mass flux averaged to the
        # corners, then averaged back to the velocity point.
        q_here = _potential_vorticity(h, u, v, coriolis, j, i, cos_south, cos_here, rdx_face_here, rdy_face_here, quarter)
        q_north = _potential_vorticity(h, u, v, coriolis, j + 1, i, cos_here, cos_north, rdx_face_north, rdy_face_north,
                                       quarter)  # fmt: skip
        q_east = _potential_vorticity(h, u, v, coriolis, j, i + 1, cos_south, cos_here, rdx_face_here, rdy_face_here,
                                      quarter)  # fmt: skip
        v_flux_south = half * (_v_flux(h, v, j, i - 1, cos_face_here, half) + _v_flux(h, v, j, i, cos_face_here, half))
        v_flux_north = half * (_v_flux(h, v, j + 1, i - 1, cos_face_north, half)
                               + _v_flux(h, v, j + 1, i, cos_face_north, half))  # fmt: skip
        u_flux_west = half * (_u_flux(h, u, j - 1, i, half) + _u_flux(h, u, j, i, half))
        u_flux_east = half * (_u_flux(h, u, j - 1, i + 1, half) + _u_flux(h, u, j, i + 1, half))

        bernoulli_here = _bernoulli(h, u, v, topography, j, i, cos_face_here, cos_face_north, rcos_here, gravity, quarter)
        bernoulli_west = _bernoulli(h, u, v, topography, j, i - 1, cos_face_here, cos_face_north, rcos_here, gravity,
                                    quarter)  # fmt: skip
        bernoulli_south = _bernoulli(h, u, v, topography, j - 1, i, cos_face_south, cos_face_here, rcos_south, gravity,
                                     quarter)  # fmt: skip
        du = (half * (q_here * v_flux_south + q_north * v_flux_north)) * rcos_here - (
            bernoulli_here - bernoulli_west) * rdx_here
        dv = -(half * (q_here * u_flux_west + q_east * u_flux_east)) - (bernoulli_here - bernoulli_south) * rdy

        if viscosity != 0:
            du = du + viscosity * _laplacian(u, j, i, rdx2, rdy2, two)
            dv = dv + viscosity * _laplacian(v, j, i, rdx2, rdy2, two)
        if hyperviscosity != 0:
            du = du - hyperviscosity * _bilaplacian(u, j, i, rdx2, rdy2, two)
            dv = dv - hyperviscosity * _bilaplacian(v, j, i, rdx2, rdy2, two)
        # Wall / pole faces (and anything beyond) never move: v = 0 stays exactly 0.
        dv = dv * mask

        if filtered:
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
    coriolis, topography, a, b, dt, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
    j0, j1, i0, i1,
):  # fmt: skip
    """Rows [j0, j1) spread over the Numba thread pool."""
    for j in prange(j0, j1):
        _update_row(
            out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
            cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
            coriolis, topography, a, b, dt, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
            j, i0, i1,
        )  # fmt: skip


@njit(cache=True, error_model="numpy")
def _stage_serial(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
    cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
    coriolis, topography, a, b, dt, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
    j0, j1, i0, i1,
):  # fmt: skip
    """Rows [j0, j1) one after the other on the calling thread."""
    for j in range(j0, j1):
        _update_row(
            out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, inc_h, inc_u, inc_v,
            cos_center, rcos_center, rdx_center, rdy_center, cos_face, rdx_face, rdy_face, v_face_mask, filtered_rows,
            coriolis, topography, a, b, dt, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
            j, i0, i1,
        )  # fmt: skip


def stage_cpu(*args) -> None:
    """Run the stage loop; ``args`` as for ``_stage_serial``, region bounds (j0, j1, i0, i1) last. Returns None."""
    j0, j1, i0, i1 = args[-4:]
    if (j1 - j0) * (i1 - i0) >= PARALLEL_MIN_CELLS:
        _stage_parallel(*args)
    else:
        _stage_serial(*args)

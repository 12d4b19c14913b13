"""CPU (Numba) implementation of the fused SSP-RK3 stage; see :mod:`apps.stencil.swe.stage`.

Every helper below is one discrete quantity of the scheme at one staggered point, written with
explicit parentheses; :mod:`apps.stencil.swe.stage_gpu` writes the same expressions in CUDA in the
same order, and the tests' NumPy reference does too, so all three agree bitwise (fp contraction is
off: Numba does not fuse multiply-adds without ``fastmath``; the CUDA kernel is built with
``--fmad=false``).

The loop is compiled twice, threaded (``prange`` over rows) and serial: below
:data:`PARALLEL_MIN_CELLS` cells (thin rim strips, small tiles) the fork/join of the thread pool
costs more than the work. Both run the identical per-cell arithmetic, so results do not depend on
which one ran.

Constants (0.5, 0.25, 2) come in as arguments of the field dtype: a float literal in Numba is
float64 and would silently promote float32 arithmetic.
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
def _v_flux(h, v, j, i, half):
    """Meridional mass flux V = h_v * v at the v point (j, i) (south face), m^2/s."""
    return (half * (h[j - 1, i] + h[j, i])) * v[j, i]


@njit(cache=True, error_model="numpy")
def _potential_vorticity(h, u, v, coriolis_rows, j, i, rdx, rdy, quarter):
    """q = (f + zeta) / h_q at the south-west corner (j, i), 1/(m s)."""
    zeta = (v[j, i] - v[j, i - 1]) * rdx - (u[j, i] - u[j - 1, i]) * rdy
    h_corner = quarter * ((h[j - 1, i - 1] + h[j - 1, i]) + (h[j, i - 1] + h[j, i]))
    return (coriolis_rows[j] + zeta) / h_corner


@njit(cache=True, error_model="numpy")
def _bernoulli(h, u, v, j, i, gravity, quarter):
    """B = g h + (u^2 + v^2)/2 at the cell centre (j, i), kinetic part averaged from the faces."""
    kinetic = quarter * (
        (u[j, i] * u[j, i] + u[j, i + 1] * u[j, i + 1]) + (v[j, i] * v[j, i] + v[j + 1, i] * v[j + 1, i])
    )
    return gravity * h[j, i] + kinetic


@njit(cache=True, error_model="numpy")
def _laplacian(a, j, i, rdx2, rdy2, two):
    """Five-point Laplacian of a at (j, i), same staggering as a."""
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
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask,
    a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
    j, i0, i1,
):  # fmt: skip
    """out = a*base + b*(stage + dt*L(stage)) on row j, columns [i0, i1); in place."""
    for i in range(i0, i1):
        # Continuity in flux form: what leaves one cell enters its neighbour, so mass is exact.
        dh = -((_u_flux(h, u, j, i + 1, half) - _u_flux(h, u, j, i, half)) * rdx
               + (_v_flux(h, v, j + 1, i, half) - _v_flux(h, v, j, i, half)) * rdy)

        # Sadourny's energy-conserving vorticity flux: q times the mass flux averaged to the
        # corners, then averaged back to the velocity point.
        q_here = _potential_vorticity(h, u, v, coriolis_rows, j, i, rdx, rdy, quarter)
        q_north = _potential_vorticity(h, u, v, coriolis_rows, j + 1, i, rdx, rdy, quarter)
        q_east = _potential_vorticity(h, u, v, coriolis_rows, j, i + 1, rdx, rdy, quarter)
        v_flux_south = half * (_v_flux(h, v, j, i - 1, half) + _v_flux(h, v, j, i, half))
        v_flux_north = half * (_v_flux(h, v, j + 1, i - 1, half) + _v_flux(h, v, j + 1, i, half))
        u_flux_west = half * (_u_flux(h, u, j - 1, i, half) + _u_flux(h, u, j, i, half))
        u_flux_east = half * (_u_flux(h, u, j - 1, i + 1, half) + _u_flux(h, u, j, i + 1, half))

        bernoulli_here = _bernoulli(h, u, v, j, i, gravity, quarter)
        du = half * (q_here * v_flux_south + q_north * v_flux_north) - (
            bernoulli_here - _bernoulli(h, u, v, j, i - 1, gravity, quarter)) * rdx
        dv = -(half * (q_here * u_flux_west + q_east * u_flux_east)) - (
            bernoulli_here - _bernoulli(h, u, v, j - 1, i, gravity, quarter)) * rdy

        if viscosity != 0:
            du = du + viscosity * _laplacian(u, j, i, rdx2, rdy2, two)
            dv = dv + viscosity * _laplacian(v, j, i, rdx2, rdy2, two)
        if hyperviscosity != 0:
            du = du - hyperviscosity * _bilaplacian(u, j, i, rdx2, rdy2, two)
            dv = dv - hyperviscosity * _bilaplacian(v, j, i, rdx2, rdy2, two)
        # Wall faces (and anything beyond) never move: v = 0 stays exactly 0.
        dv = dv * v_face_mask[j]

        out_h[j, i] = a * base_h[j, i] + b * (h[j, i] + dt * dh)
        out_u[j, i] = a * base_u[j, i] + b * (u[j, i] + dt * du)
        out_v[j, i] = a * base_v[j, i] + b * (v[j, i] + dt * dv)


@njit(parallel=True, cache=True, error_model="numpy")
def _stage_parallel(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask,
    a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
    j0, j1, i0, i1,
):  # fmt: skip
    """Rows [j0, j1) spread over the Numba thread pool."""
    for j in prange(j0, j1):
        _update_row(
            out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask,
            a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
            j, i0, i1,
        )  # fmt: skip


@njit(cache=True, error_model="numpy")
def _stage_serial(
    out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask,
    a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
    j0, j1, i0, i1,
):  # fmt: skip
    """Rows [j0, j1) one after the other on the calling thread."""
    for j in range(j0, j1):
        _update_row(
            out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask,
            a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
            j, i0, i1,
        )  # fmt: skip



def stage_cpu(*args) -> None:
    """Run the stage loop; ``args`` as for ``_stage_serial``, region bounds (j0, j1, i0, i1) last."""
    j0, j1, i0, i1 = args[-4:]
    if (j1 - j0) * (i1 - i0) >= PARALLEL_MIN_CELLS:
        _stage_parallel(*args)
    else:
        _stage_serial(*args)

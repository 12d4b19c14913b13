"""The fused SSP-RK3 stage on the sphere: one pass computes h, u and v of a region.

Semi-discrete equations (vector-invariant form on the C-grid of :mod:`apps.stencil.sphere.parameters`;
``c_j = cos(lat_j)`` at centre rows, ``c'_j = cos`` at v faces, 0 on the pole faces)::

    dh/dt = -[ delta_lon(h_u u) / (a c dlon) + delta_lat(h_v v c') / (a c dlat) ]
    du/dt = +avg_lat(q * avg_lon(h_v v c')) / c             - delta_lon B / (a c dlon)
    dv/dt = -avg_lon(q * avg_lat(h_u u))                    - delta_lat B / (a dlat)
    q     = (f + zeta) / h_q,   zeta = [delta_lon v / dlon - delta_lat(u c) / dlat] / (a c')
    B     = g (h + h_s) + [avg_lon u^2 + avg_lat(v^2 c') / c] / 2

This is Sadourny's (1975) energy-conserving scheme written with the face lengths of the sphere:
with the mass fluxes through faces ``U* = h_u u a dlat`` and ``V* = h_v v a c' dlon``, the vorticity
term is ``+avg(q avg V*) / dx_u`` and ``-avg(q avg U*) / dy_v``, whose energy contributions cancel
pairwise around every corner for any q; the metric terms of the momentum equations are contained
in zeta (the discrete curl: circulation / corner area) and the kinetic-energy gradient. Mass is the
flux-form ``sum h a^2 c dlon dlat``; the pole faces have zero length, so no mass crosses a pole and
no ghost exchange across the pole is needed. q at the pole corners is never used (it multiplies
``V* = 0``) and zeta is set to 0 there (``rdx_face = rdy_face = 0``).

:func:`sphere_stage` computes ``out = a*base + b*(stage + dt*L(stage))`` for all three fields over a
region, except on *filtered rows* (``filtered_rows[j] != 0``, poleward of the polar-filter cutoff):
there it stores the raw increment ``dt*L(stage)`` in ``increment`` and leaves ``out`` untouched;
:func:`apps.stencil.sphere.polar_filter.filter_and_combine` finishes those rows once the whole
latitude circle is known. Each cell reads ``stage`` at most one cell away and ``base`` only at the
cell itself, so interior and rim may be updated separately with bitwise the same result.
"""

from __future__ import annotations

from typing import Any, Sequence

from apps.stencil.swe_scheme.metrics import ROW_ARRAYS
from apps.stencil.swe_scheme.stage import SSP_RK3_STAGES, shallow_water_stage
from apps.stencil.sphere.parameters import SphereTile


def sphere_stage(
    out: Sequence[Any],
    base: Sequence[Any],
    stage: Sequence[Any],
    increment: Sequence[Any],
    a: float,
    b: float,
    dt: float,
    params: SphereTile,
    filtered_rows: Any,
    region: Sequence[int],
) -> None:
    """``out = a*base + b*(stage + dt*L(stage))`` over ``region``, or ``increment = dt*L`` on filtered rows.

    Parameters
    ----------
    out, base, stage, increment : sequence of 3 arrays (h, u, v), each shape (n_rows + 2w, n_cols + 2w)
        Padded NumPy or CuPy fields (h in m, u and v in m/s), C-contiguous, one dtype and library
        (CuPy: the core's per-row-metrics CUDA kernel on the current stream, no sync). ``stage`` needs valid
        ghosts (one cell) around ``region``. ``out`` may be ``base``; neither ``out`` nor
        ``increment`` may share memory with ``stage``.
    a, b : float
        Stage weights (:data:`SSP_RK3_STAGES`).
    dt : float
        Time step in s.
    params : SphereTile
        From :func:`apps.stencil.sphere.parameters.tile_parameters`.
    filtered_rows : int8 array, shape (n_rows + 2w,)
        Non-zero on the padded rows the polar filter finishes (see the module docstring); on the
        fields' device (``FilterPlan.filtered_rows`` on the CPU, ``device_rows(plan, xp)`` on a GPU).
    region : (j0, j1, i0, i1)
        Padded-index bounds of the updated cells.
    """
    shallow_water_stage(out, base, stage, a, b, dt, params.metrics, region, increment, filtered_rows)


__all__ = ["ROW_ARRAYS", "SSP_RK3_STAGES", "sphere_stage"]

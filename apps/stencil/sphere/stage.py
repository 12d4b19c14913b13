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

import numpy as np

from apps.stencil.sphere.parameters import SphereTile
from apps.stencil.swe._arrays import IdentityCache
from apps.stencil.swe._arrays import is_cupy as _is_cupy

SSP_RK3_STAGES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0))
"""(a, b) of the three Shu-Osher SSP-RK3 stages; ``base`` is the state at the step start."""

ROW_ARRAYS = ("cos_center", "rcos_center", "rdx_center", "rdy_center", "cos_face", "rdx_face", "rdy_face", "v_face_mask")


def _address(array: Any) -> int:
    return int(array.data.ptr) if _is_cupy(array) else int(array.__array_interface__["data"][0])


def _triple(name: str, fields: Sequence[Any]) -> tuple[Any, Any, Any]:
    if len(fields) != 3:
        raise ValueError(f"{name} must be the three padded fields (h, u, v); found {len(fields)} items.")
    return tuple(fields)  # type: ignore[return-value]


_VALIDATED = IdentityCache()
"""(out, base, stage, increment, params, filtered_rows) tuples that passed :func:`_validate_arrays`."""


def _validate(out, base, stage, increment, params: SphereTile, filtered_rows, region) -> tuple[int, int, int, int]:
    objects = (*out, *base, *stage, *increment, params, filtered_rows, params.coriolis, params.topography,
               *(getattr(params, name) for name in ROW_ARRAYS))
    if objects not in _VALIDATED:
        _validate_arrays(out, base, stage, increment, params, filtered_rows)
        _VALIDATED.add(objects)
    return _validate_region(stage[0].shape, region)


def _validate_arrays(out, base, stage, increment, params: SphereTile, filtered_rows) -> None:
    shape = stage[0].shape
    if len(shape) != 2:
        raise ValueError(f"Fields must be 2D padded arrays (lat, lon); found shape {shape}.")
    on_gpu = _is_cupy(stage[0])
    library = "cupy" if on_gpu else "numpy"
    for array in (*out, *base, *stage, *increment, params.coriolis, params.topography):
        if (array.shape != shape or array.dtype != params.dtype or not array.flags.c_contiguous
                or _is_cupy(array) != on_gpu):
            raise ValueError(
                f"All fields, increments and params.coriolis/topography must be C-contiguous {library} arrays of "
                f"shape {shape}, dtype {params.dtype}; found shape {array.shape}, dtype {array.dtype}, "
                f"{type(array).__module__}. Pass Field.data and build the tile parameters for this tile, dtype and xp."
            )
    for name in ROW_ARRAYS:
        row_array = getattr(params, name)
        if row_array.shape != (shape[0],) or _is_cupy(row_array) != on_gpu:
            raise ValueError(f"params.{name} must be a {library} array with one entry per padded row ({shape[0]},); "
                             f"found shape {row_array.shape} ({type(row_array).__module__}). Build it for this tile "
                             f"with tile_parameters(..., xp=<the fields' xp>).")
    if filtered_rows.shape != (shape[0],) or _is_cupy(filtered_rows) != on_gpu or filtered_rows.dtype != np.int8:
        raise ValueError(f"filtered_rows must be an int8 {library} array of shape ({shape[0]},) (one flag per padded "
                         f"row); found {filtered_rows.dtype} {filtered_rows.shape} ({type(filtered_rows).__module__}).")
    stage_addresses = {_address(a) for a in stage}
    if any(_address(a) in stage_addresses for a in (*out, *increment)):
        raise ValueError("out and increment must not share memory with stage (the stencil reads stage's neighbours).")


def _validate_region(shape, region) -> tuple[int, int, int, int]:
    if len(region) != 4:
        raise ValueError(f"region must be (j0, j1, i0, i1) in padded indices; found {region!r}.")
    j0, j1, i0, i1 = (int(x) for x in region)
    n_rows, n_columns = shape
    if not (1 <= j0 <= j1 <= n_rows - 1 and 1 <= i0 <= i1 <= n_columns - 1):
        raise ValueError(
            f"region {(j0, j1, i0, i1)} reaches outside the padded arrays: it must satisfy 1 <= j0 <= j1 <= "
            f"{n_rows - 1} and 1 <= i0 <= i1 <= {n_columns - 1} (stencil reach 1)."
        )
    return j0, j1, i0, i1


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
        (CuPy: the CUDA kernel of :mod:`apps.stencil.sphere.stage_gpu` on the current stream, no sync). ``stage`` needs valid
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
    out, base, stage, increment = (_triple(n, f) for n, f in (("out", out), ("base", base), ("stage", stage), ("increment", increment)))
    j0, j1, i0, i1 = _validate(out, base, stage, increment, params, filtered_rows, region)
    if j0 == j1 or i0 == i1:
        return
    real = params.dtype.type
    args = (
        *out, *base, *stage, *increment, *(getattr(params, name) for name in ROW_ARRAYS), filtered_rows,
        params.coriolis, params.topography, real(a), real(b), real(dt), real(params.gravity), real(params.rdy),
        real(0.5), real(0.25), j0, j1, i0, i1,
    )  # fmt: skip
    if _is_cupy(stage[0]):
        from apps.stencil.sphere.stage_gpu import stage_gpu

        stage_gpu(*args)
    else:
        from apps.stencil.sphere.stage_cpu import stage_cpu

        stage_cpu(*args)


__all__ = ["ROW_ARRAYS", "SSP_RK3_STAGES", "sphere_stage"]

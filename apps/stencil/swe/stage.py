"""The fused SSP-RK3 stage of the shallow-water model: one pass computes h, u and v of a region.

Semi-discrete equations (vector-invariant form, C-grid, see the package docstring for the grid)::

    dh/dt = -(delta_x U + delta_y V)                       U = h_u u,  V = h_v v
    du/dt = +avg_y(q * avg_x V) - delta_x B  + nu lap u - nu4 lap lap u
    dv/dt = -avg_x(q * avg_y U) - delta_y B  + nu lap v - nu4 lap lap v
    q = (f + zeta) / h_q,   zeta = delta_x v - delta_y u,   B = g h + (avg_x u^2 + avg_y v^2) / 2

``h_u``, ``h_v``, ``h_q`` are the two- and four-point averages of h at the u, v and vorticity
points. The Coriolis/vorticity term is Sadourny's (1975) energy-conserving one: with the flux-form
continuity and this kinetic energy it conserves total energy of the semi-discrete system, and mass
(sum of h) exactly, up to rounding. The tendency of wall v faces is multiplied by 0.

:func:`swe_stage` computes ``out = a*base + b*(stage + dt*L(stage))`` for all three fields; the
Shu-Osher SSP-RK3 step is three such stages (:data:`SSP_RK3_STAGES`)::

    s1 = u0 + dt L(u0)                            (a, b) = (0,   1)
    s2 = 3/4 u0 + 1/4 (s1 + dt L(s1))             (a, b) = (3/4, 1/4)
    u1 = 1/3 u0 + 2/3 (s2 + dt L(s2))             (a, b) = (1/3, 2/3)

Each cell's update reads ``stage`` at most ``reach`` cells away (1, or 2 with hyperviscosity) and
``base`` only at the cell itself, so the app can update the interior while halos are in flight and
the rim after they arrive, with bitwise the same result as one whole-tile call.
"""

from __future__ import annotations

from typing import Any, Sequence

from apps.stencil.swe._arrays import IdentityCache
from apps.stencil.swe._arrays import is_cupy as _is_cupy
from apps.stencil.swe.parameters import TileParameters

SSP_RK3_STAGES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0))
"""(a, b) of the three SSP-RK3 stages in Shu-Osher form; ``base`` is the state at the step start."""


def _buffer_address(array: Any) -> int:
    if _is_cupy(array):
        return int(array.data.ptr)
    return int(array.__array_interface__["data"][0])


def _as_triple(name: str, fields: Sequence[Any]) -> tuple[Any, Any, Any]:
    if len(fields) != 3:
        raise ValueError(f"{name} must be the three padded fields (h, u, v); found {len(fields)} items.")
    return tuple(fields)  # type: ignore[return-value]


_VALIDATED = IdentityCache()
"""(out, base, stage, params) tuples that passed :func:`_validate_arrays` (the app repeats a few)."""


def _validate(out, base, stage, params: TileParameters, region) -> tuple[int, int, int, int]:
    objects = (*out, *base, *stage, params, params.coriolis_rows, params.v_face_mask)
    if objects not in _VALIDATED:
        _validate_arrays(out, base, stage, params)
        _VALIDATED.add(objects)
    return _validate_region(stage[0].shape, params, region)


def _validate_arrays(out, base, stage, params: TileParameters) -> None:
    arrays = (*out, *base, *stage)
    shape = stage[0].shape
    if len(shape) != 2:
        raise ValueError(f"Fields must be 2D padded arrays (y, x); found shape {shape}.")
    on_gpu = _is_cupy(stage[0])
    for array in arrays:
        if array.shape != shape or array.dtype != params.dtype or _is_cupy(array) != on_gpu:
            raise ValueError(
                f"All nine arrays of out, base and stage must share shape {shape}, dtype {params.dtype} "
                f"and array library ({'cupy' if on_gpu else 'numpy'}); found shape {array.shape}, dtype "
                f"{array.dtype}, {type(array).__module__}. Allocate them alike (and build the tile "
                f"parameters with the fields' dtype and xp)."
            )
        if not array.flags.c_contiguous:
            raise ValueError(
                "Fields must be C-contiguous padded arrays (pass Field.data, not a slice of it)."
            )
    for row_array, label in ((params.coriolis_rows, "coriolis_rows"), (params.v_face_mask, "v_face_mask")):
        if row_array.shape != (shape[0],) or _is_cupy(row_array) != on_gpu:
            raise ValueError(
                f"params.{label} must have one entry per padded row ({shape[0]},) on the fields' device; "
                f"found shape {row_array.shape} ({type(row_array).__module__}). Build the parameters "
                f"with tile_parameters(..., n_rows={shape[0] - 2 * params.halo_width}, xp=<fields' xp>)."
            )
    stage_addresses = {_buffer_address(a) for a in stage}
    for array in out:
        # out may alias base (read only at the cell written) but never stage (read at neighbours).
        if _buffer_address(array) in stage_addresses:
            raise ValueError(
                "out must not share memory with stage: the stencil reads neighbours of stage while "
                "writing out. Use a separate buffer for the new stage."
            )


def _validate_region(shape, params: TileParameters, region) -> tuple[int, int, int, int]:
    if len(region) != 4:
        raise ValueError(f"region must be (j0, j1, i0, i1) in padded indices; found {region!r}.")
    j0, j1, i0, i1 = (int(x) for x in region)
    reach = params.stencil_reach
    n_rows, n_columns = shape
    if not (reach <= j0 <= j1 <= n_rows - reach and reach <= i0 <= i1 <= n_columns - reach):
        raise ValueError(
            f"region {(j0, j1, i0, i1)} reaches outside the padded arrays: with a stencil reach of "
            f"{reach} it must satisfy {reach} <= j0 <= j1 <= {n_rows - reach} and "
            f"{reach} <= i0 <= i1 <= {n_columns - reach}. Update only owned cells, or widen the halo."
        )
    return j0, j1, i0, i1


def swe_stage(
    out: Sequence[Any],
    base: Sequence[Any],
    stage: Sequence[Any],
    a: float,
    b: float,
    dt: float,
    params: TileParameters,
    region: Sequence[int],
) -> None:
    """Compute ``out = a*base + b*(stage + dt*L(stage))`` for h, u, v over ``region``; in place.

    Parameters
    ----------
    out, base, stage : sequence of 3 arrays (h, u, v), each shape (n_rows + 2w, n_cols + 2w)
        Padded fields (NumPy or CuPy, float64 or float32, C-contiguous): h in m, u and v in m/s.
        ``stage`` needs valid ghosts up to the stencil reach around ``region``. ``out`` may be
        ``base`` but must not share memory with ``stage``.
    a, b : float
        Stage weights (see :data:`SSP_RK3_STAGES`).
    dt : float
        Time step in s.
    params : TileParameters
        Per-tile parameters from :func:`apps.stencil.swe.parameters.tile_parameters`.
    region : (j0, j1, i0, i1)
        Padded-index bounds of the updated cells, ``j0 <= j < j1``, ``i0 <= i < i1``. Cells of
        ``out`` outside it are left untouched.

    Notes
    -----
    GPU arrays run on CuPy's current stream; the call returns without synchronising.
    """
    out = _as_triple("out", out)
    base = _as_triple("base", base)
    stage = _as_triple("stage", stage)
    j0, j1, i0, i1 = _validate(out, base, stage, params, region)
    if j0 == j1 or i0 == i1:
        return
    real = params.dtype.type
    constants = kernel_constants(params)
    scalars = (real(a), real(b), real(dt)) + tuple(
        constants[name]
        for name in ("gravity", "rdx", "rdy", "rdx2", "rdy2", "viscosity", "hyperviscosity", "half", "quarter", "two")
    )
    if _is_cupy(stage[0]):
        from apps.stencil.swe.stage_gpu import stage_gpu

        stage_gpu(out, base, stage, params.coriolis_rows, params.v_face_mask, scalars, (j0, j1, i0, i1))
    else:
        from apps.stencil.swe.stage_cpu import stage_cpu

        stage_cpu(*out, *base, *stage, params.coriolis_rows, params.v_face_mask, *scalars, j0, j1, i0, i1)


def kernel_constants(params: TileParameters) -> dict[str, Any]:
    """The constants the kernels use, converted to the field dtype (also used by test references).

    ``rdx = 1/dx``, ``rdy = 1/dy``, ``rdx2 = 1/dx^2``, ``rdy2 = 1/dy^2`` (computed in float64, then
    cast), the physical coefficients, and the literals 0.5, 0.25 and 2.
    """
    real = params.dtype.type
    return {
        "gravity": real(params.gravity),
        "rdx": real(1.0 / params.dx),
        "rdy": real(1.0 / params.dy),
        "rdx2": real(1.0 / (params.dx * params.dx)),
        "rdy2": real(1.0 / (params.dy * params.dy)),
        "viscosity": real(params.viscosity),
        "hyperviscosity": real(params.hyperviscosity),
        "half": real(0.5),
        "quarter": real(0.25),
        "two": real(2.0),
    }


__all__ = ["SSP_RK3_STAGES", "kernel_constants", "swe_stage"]

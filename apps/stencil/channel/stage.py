"""The fused SSP-RK3 stage on the channel: the shallow-water core with the channel's uniform metrics.

The scheme, its stage weights and the interior/rim contract are those of
:mod:`apps.stencil.swe_scheme.stage`; on the channel the metric factors are 1, ``1/dx`` and
``1/dy``, f varies by row (beta plane), the bottom is flat, and the (hyper)viscosity terms are on::

    dh/dt = -(delta_x U + delta_y V)                       U = h_u u,  V = h_v v
    du/dt = +avg_y(q * avg_x V) - delta_x B  + nu lap u - nu4 lap lap u
    dv/dt = -avg_x(q * avg_y U) - delta_y B  + nu lap v - nu4 lap lap v
    q = (f + zeta) / h_q,   zeta = delta_x v - delta_y u,   B = g h + (avg_x u^2 + avg_y v^2) / 2

The tendency of the wall v faces is multiplied by 0. On a GPU the uniform metrics select the fast
kernels of :mod:`apps.stencil.swe_scheme.cuda_uniform` (:mod:`apps.stencil.channel.stage_gpu`).
"""

from __future__ import annotations

from typing import Any, Sequence

from apps.stencil.swe_scheme.stage import SSP_RK3_STAGES, shallow_water_stage
from apps.stencil.channel.parameters import TileParameters


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
        Per-tile parameters from :func:`apps.stencil.channel.parameters.tile_parameters`.
    region : (j0, j1, i0, i1)
        Padded-index bounds of the updated cells, ``j0 <= j < j1``, ``i0 <= i < i1``. Cells of
        ``out`` outside it are left untouched.

    Notes
    -----
    GPU arrays run on CuPy's current stream; the call returns without synchronising.
    """
    shallow_water_stage(out, base, stage, a, b, dt, params.metrics, region)


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

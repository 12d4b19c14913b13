"""The channel's stage with the argument list of the CPU kernel it had before the core (benchmarks).

:func:`stage_cpu` takes the channel's two row arrays and thirteen scalars and runs the core's one
Numba kernel (:mod:`apps.stencil.swe_scheme.stage_cpu`) with the channel's metrics: unit factors,
``rdx``/``rdy`` per row, f broadcast along x, a flat bottom and no filtered rows. The models call
:func:`apps.stencil.channel.stage.swe_stage` instead, which validates its arguments.
"""

from __future__ import annotations

import numpy as np

from apps.stencil.swe_scheme.stage_cpu import PARALLEL_MIN_CELLS
from apps.stencil.swe_scheme.stage_cpu import stage_cpu as _core_stage_cpu


def stage_cpu(out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, coriolis_rows, v_face_mask,
              a, b, dt, gravity, rdx, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
              j0, j1, i0, i1) -> None:  # fmt: skip
    """``out = a*base + b*(stage + dt*L(stage))`` on rows [j0, j1), columns [i0, i1); in place, returns None.

    Arrays as validated by :func:`apps.stencil.channel.stage.swe_stage`; scalars in the field dtype.
    """
    n_rows = coriolis_rows.shape[0]
    ones = np.ones(n_rows, dtype=h.dtype)
    rdx_rows, rdy_rows = np.full(n_rows, rdx, dtype=h.dtype), np.full(n_rows, rdy, dtype=h.dtype)
    coriolis = np.broadcast_to(coriolis_rows[:, None], h.shape)
    topography = np.broadcast_to(np.zeros((1, 1), dtype=h.dtype), h.shape)
    _core_stage_cpu(
        out_h, out_u, out_v, base_h, base_u, base_v, h, u, v, out_h, out_u, out_v,
        ones, ones, rdx_rows, rdy_rows, ones, rdx_rows, rdy_rows, v_face_mask, np.zeros(n_rows, dtype=np.int8),
        coriolis, topography, a, b, dt, gravity, rdy, rdx2, rdy2, viscosity, hyperviscosity, half, quarter, two,
        j0, j1, i0, i1,
    )  # fmt: skip


__all__ = ["PARALLEL_MIN_CELLS", "stage_cpu"]

"""The channel's GPU stage: the core's uniform-grid kernels (:mod:`apps.stencil.swe_scheme.stage_gpu`).

:func:`stage_gpu` (``out, base, stage, coriolis_rows, v_face_mask, scalars, region, tile=None``),
:data:`DEFAULT_TILE` and :func:`kernel_choices` are the core's uniform-grid launcher, its default
kernel per dtype and its kernel choices (the march, tiled and one-thread-per-cell kernels),
under the names the benchmarks use.
"""

from apps.stencil.swe_scheme.stage_gpu import DEFAULT_TILE, MARCH_WARPS, SIMPLE_BLOCK, kernel_choices
from apps.stencil.swe_scheme.stage_gpu import uniform_stage_gpu as stage_gpu

__all__ = ["DEFAULT_TILE", "MARCH_WARPS", "SIMPLE_BLOCK", "kernel_choices", "stage_gpu"]

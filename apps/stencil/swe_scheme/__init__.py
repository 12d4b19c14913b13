"""The shallow-water core of ``apps.stencil``: one C-grid scheme, two grids.

The nonlinear shallow-water equations in vector-invariant form on an Arakawa C-grid (h at cell
centres, u on west faces, v on south faces, vorticity at the south-west corners), with Sadourny's
energy-conserving vorticity flux, flux-form continuity and a fused SSP-RK3 stage, are written here
once. A grid enters only through its metrics (:class:`GridMetrics`: per-row factors, the Coriolis
parameter, the topography); the two grids build them and keep what is theirs alone:

- :mod:`apps.stencil.channel` -- the beta-plane channel: uniform dx, dy, f per row, (hyper)viscosity,
  free-slip walls, the idealised jet / geostrophic / Gaussian cases, netCDF in metres; on GPUs the
  fast uniform-grid kernels (warp-marching and tiled).
- :mod:`apps.stencil.sphere` -- the latitude-longitude sphere: cos(latitude) metrics, f per corner,
  topography, the Fourier polar filter (its rows take the increment path of the stage), the
  Williamson cases, netCDF on latitude/longitude.

With the channel's unit factors the lat-lon expressions are the channel's bit for bit (``x * 1`` and
``h + 0`` are exact), so one Numba kernel and one set of CUDA device functions serve both grids and
each grid's results are unchanged by the sharing.

Modules
-------
``metrics``       :class:`GridMetrics`, :func:`channel_metrics`, :func:`latlon_metrics`
``stage``         :func:`shallow_water_stage` (the scheme, one validation), :data:`SSP_RK3_STAGES`
``stage_cpu``     the one Numba kernel (metrics, optional (hyper)viscosity, optional filtered rows)
``cuda_device``   the CUDA device functions, templated on a metric policy (uniform / per row), and the
                  one-thread-per-cell kernels of both grids
``cuda_uniform``, ``cuda_march``  the uniform grid's tiled and warp-marching kernels (channel's fast path)
``stage_gpu``     the GPU launchers
``model``         :class:`~apps.stencil.swe_scheme.model.ShallowWaterModel`: fields, the overlapped
                  SSP-RK3 step, time and diagnostics bookkeeping shared by both models

Imports only hpcgpu and :mod:`apps.stencil.checkpointing`, never a grid: ``channel/`` and ``sphere/``
import from here (``APP_LAYERS`` in ``tests/imports/test_import_graph.py`` checks it).
"""

from apps.stencil.swe_scheme.metrics import ROW_ARRAYS, GridMetrics, channel_metrics, latlon_metrics
from apps.stencil.swe_scheme.stage import SSP_RK3_STAGES, shallow_water_stage

__all__ = ["ROW_ARRAYS", "SSP_RK3_STAGES", "GridMetrics", "channel_metrics", "latlon_metrics", "shallow_water_stage"]

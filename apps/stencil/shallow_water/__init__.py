"""The shallow-water core of ``apps.stencil``: one C-grid scheme, two grids.

(Expanded below once the GPU modules are in place.)
"""

from apps.stencil.shallow_water.metrics import ROW_ARRAYS, GridMetrics, channel_metrics, latlon_metrics
from apps.stencil.shallow_water.stage import SSP_RK3_STAGES, shallow_water_stage

__all__ = ["ROW_ARRAYS", "SSP_RK3_STAGES", "GridMetrics", "channel_metrics", "latlon_metrics", "shallow_water_stage"]

"""Halo (ghost-cell) exchange between neighbouring blocks of a decomposition, and physical boundaries.

See :mod:`hpcgpu.halo.regions` for which cells go where, :mod:`hpcgpu.halo.exchange` for the
split ``start()`` / ``wait()`` exchange of several fields at once, and :mod:`hpcgpu.halo.boundaries`
for the boundary conditions that ``wait()`` applies beyond non-periodic domain edges.
"""

from hpcgpu.halo.boundaries import (
    BoundaryConditions,
    BoundaryFill,
    Dirichlet,
    Mirror,
    ZeroGradient,
    free_slip_channel_walls,
)
from hpcgpu.halo.exchange import HaloExchange, PendingExchange, exchange_halos

__all__ = [
    "BoundaryConditions",
    "BoundaryFill",
    "Dirichlet",
    "HaloExchange",
    "Mirror",
    "PendingExchange",
    "ZeroGradient",
    "exchange_halos",
    "free_slip_channel_walls",
]

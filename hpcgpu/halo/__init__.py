"""Halo (ghost-cell) exchange between neighbouring blocks of a decomposition.

See :mod:`hpcgpu.halo.regions` for which cells go where and :mod:`hpcgpu.halo.exchange` for the
split ``start()`` / ``wait()`` exchange of several fields at once.
"""

from hpcgpu.halo.exchange import HaloExchange, PendingExchange, exchange_halos

__all__ = ["HaloExchange", "PendingExchange", "exchange_halos"]

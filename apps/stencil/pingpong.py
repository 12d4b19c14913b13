"""Two-buffer stencil stepping with the rim computed first and the halo exchange overlapped.

One step of a stencil that reads ``current`` and writes ``next``::

    compute the rim of next            (cells whose stencil reaches into ghost cells of *neighbours*)
    start exchanging next's halos      (NCCL on the high-priority stream; MPI on CPUs)
    compute the interior of next       (overlaps the exchange)
    wait for the exchange              (next's ghosts are valid for the following step)
    swap current and next

The exchange only reads next's rim and writes next's ghosts, and the interior update only writes
next's interior, so the two never touch the same cells.
"""

from __future__ import annotations

import hpcgpu
from hpcgpu.halo.regions import split_owned


class PingPongStencil:
    """State of a two-buffer explicit stencil on a decomposition.

    Parameters
    ----------
    grid : hpcgpu.Decomposition
    arch : hpcgpu.arch.CPU or GPU
    dtype : str
    name : str
        Name of the state field (checksums, checkpoints).
    sweep_fn : callable ``sweep_fn(out, inp, region, residual)``
        Updates ``out`` over ``region`` (flat padded bounds) from ``inp``; mutates ``out``.
    overlap : bool
        Overlap the exchange with the interior update (default). False computes everything, then
        exchanges: the same result, for measuring what the overlap hides.
    """

    def __init__(self, grid, arch, dtype: str, name: str, sweep_fn, overlap: bool = True):
        self.grid, self.arch, self.sweep_fn, self.overlap = grid, arch, sweep_fn, overlap
        self.current = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name=name)
        self.next = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name=name)
        # Along an axis with no neighbour at all (one block, not periodic) no ghost is ever filled by
        # an exchange, so there is no rim to compute early.
        rim_width = tuple(
            1 if (dims > 1 or periodic) else 0 for dims, periodic in zip(grid.dims, grid.periodic)
        )
        self.interior, self.rim = split_owned(grid.local_shape, self.current.halo_width, rim_width)

    def exchange_current(self) -> None:
        """Fill the ghosts of the current state (after initialisation or a restart)."""
        self.current.exchange_halos(corners=False)

    def step(self, timers, residual=None) -> None:
        """Advance one step (see the module docstring); ``residual`` is passed to every sweep."""
        source, target = self.current, self.next
        if not self.overlap:
            # Reference schedule for measurements: the whole update, then a blocking exchange.
            with timers.phase("compute"):
                for region in self.rim + ([self.interior] if self.interior is not None else []):
                    self.sweep_fn(target.data, source.data, region, residual)
            pending = target.exchange_halos(wait=False, corners=False)
            with timers.phase("communication"):
                pending.wait()
            self.current, self.next = target, source
            return
        with timers.phase("compute"):
            for region in self.rim:
                self.sweep_fn(target.data, source.data, region, residual)
        pending = target.exchange_halos(wait=False, corners=False)
        with timers.phase("compute"):
            if self.interior is not None:
                self.sweep_fn(target.data, source.data, self.interior, residual)
        with timers.phase("communication"):
            pending.wait()
        self.current, self.next = target, source

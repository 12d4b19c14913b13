"""Two-buffer stencil stepping with the rim computed first and the halo exchange overlapped.

One step of a stencil that reads ``current`` and writes ``next``::

    compute the rim of next            (cells whose stencil reaches into ghost cells of *neighbours*)
    start exchanging next's halos      (NCCL on the high-priority stream; MPI on CPUs)
    compute the interior of next       (overlaps the exchange)
    wait for the exchange              (next's ghosts are valid for the following step)
    swap current and next

The exchange only reads next's rim and writes next's ghosts, and the interior update only writes
next's interior, so the two never touch the same cells.

On GPUs the rim is computed on the high-priority communication stream, not before the interior on
the compute stream: the interior starts at once, the small rim kernels take SMs ahead of it (stream
priority) and the exchange follows them on the same stream, as in NVIDIA's multi-GPU Jacobi. The rim
still starts only after the previous step has finished on the compute stream (it overwrites cells the
previous interior update read).

Without overlap (``overlap=False``) the whole owned block is one sweep, followed by a blocking
exchange: one launch instead of rim + interior, the better schedule when the exchange is short. A
job of one rank always steps this way: its exchange only copies its own periodic faces, there is
nothing in flight to hide, and the thin rim slabs (strided along x) would cost bandwidth for nothing.
Where the sweep can fill those faces itself (``self_filling_sweep=True``: one rank, periodic along
every axis), a step is that one sweep and no exchange at all: the sweep stores each boundary value
into the opposite ghost as it computes it, instead of a second kernel reading the faces back.

With ``peer_halo=True`` (GPUs of one node, rows split only) there is no exchange at all: each step is
a wait for the neighbours' previous step, one sweep over the block, and one small kernel that stores
the two boundary rows straight into the neighbours' ghost rows (:mod:`apps.stencil.peer_rows`).
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
        Overlap the exchange with the interior update (default, where there is another rank). False
        computes everything, then exchanges: the same result, for measuring what the overlap hides.
        One rank never overlaps (see the module docstring).
    peer_halo : bool
        GPUs of one node, grid split along rows only: boundary rows go straight into the neighbours'
        memory after each sweep instead of through an exchange (collective setup; same results).
    self_filling_sweep : bool
        ``sweep_fn`` also takes ``periodic_ghosts=True`` with the whole owned block as its region, and
        then fills ``out``'s face ghosts periodically itself (as :func:`apps.stencil.heat3d.heat3d_step`
        does). Used where that is the whole exchange: one rank, periodic along every axis; elsewhere
        ignored. Same results.
    """

    def __init__(self, grid, arch, dtype: str, name: str, sweep_fn, overlap: bool = True, peer_halo: bool = False,
                 self_filling_sweep: bool = False):
        self.grid, self.arch, self.sweep_fn = grid, arch, sweep_fn
        self.overlap = overlap and grid.comm.size > 1   # one rank: nothing in flight to hide
        #: One rank, periodic everywhere, and a sweep that fills the faces: a step is one sweep.
        self.sweep_fills_ghosts = (self_filling_sweep and not peer_halo and grid.comm.size == 1
                                   and all(grid.periodic))
        self.current = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name=name)
        self.next = hpcgpu.Field(grid, arch, halo_width=1, dtype=dtype, name=name)
        self._first = self.current
        # Along an axis with no neighbour at all (one block, not periodic) no ghost is ever filled by
        # an exchange, so there is no rim to compute early.
        rim_width = tuple(
            1 if (dims > 1 or periodic) else 0 for dims, periodic in zip(grid.dims, grid.periodic)
        )
        self.interior, self.rim = split_owned(grid.local_shape, self.current.halo_width, rim_width)
        self.owned = tuple(v for w, n in zip(self.current.halo_width, grid.local_shape) for v in (w, w + n))
        self._rim_ready = None  # GPU: event after the previous step, which the rim stream waits for
        self.peer = None
        if peer_halo:
            from apps.stencil.peer_rows import PeerRowExchange

            self.peer = PeerRowExchange(grid, arch, (self.current, self.next))

    @property
    def parity(self) -> int:
        """0 or 1: which buffer is current (a CUDA graph of steps bakes in the order it was captured in)."""
        return 0 if self.current is self._first else 1

    def exchange_current(self) -> None:
        """Fill the ghosts of the current state (after initialisation or a restart).

        The other buffer's exchange is planned here too (one exchange of values the first step
        overwrites), so its planning is not part of the first, timed step.
        """
        if self.peer is None:
            self.next.exchange_halos(corners=False)
        self.current.exchange_halos(corners=False)
        if self.peer is not None:
            # Neighbours store into our buffers from the first step on: everything written into them
            # so far (initial state, restart) must be finished on every GPU first.
            self.arch.synchronize()
            self.grid.comm.barrier()

    def step(self, timers, residual=None) -> None:
        """Advance one step (see the module docstring); ``residual`` is passed to every sweep."""
        source, target = self.current, self.next
        if self.peer is not None:
            with timers.phase("communication"):
                self.peer.wait()   # the neighbours finished the previous step: our ghosts are theirs
            with timers.phase("compute"):
                self.sweep_fn(target.data, source.data, self.owned, residual)
            with timers.phase("communication"):
                self.peer.put(target)
            self.current, self.next = target, source
            return
        if self.sweep_fills_ghosts:
            with timers.phase("compute"):
                self.sweep_fn(target.data, source.data, self.owned, residual, periodic_ghosts=True)
            self.current, self.next = target, source
            return
        if not self.overlap:
            # One sweep over the whole block, then a blocking exchange.
            with timers.phase("compute"):
                self.sweep_fn(target.data, source.data, self.owned, residual)
            pending = target.exchange_halos(wait=False, corners=False)
            with timers.phase("communication"):
                pending.wait()
            self.current, self.next = target, source
            return
        if self.arch.is_gpu:
            self._compute_rim_on_comm_stream(target, source, residual)
        else:
            with timers.phase("compute"):
                for region in self.rim:
                    self.sweep_fn(target.data, source.data, region, residual)
        # On GPUs the exchange queues behind the rim on the communication stream.
        pending = target.exchange_halos(wait=False, corners=False)
        with timers.phase("compute"):
            if self.interior is not None:
                self.sweep_fn(target.data, source.data, self.interior, residual)
        with timers.phase("communication"):
            pending.wait()
        self.current, self.next = target, source

    def _compute_rim_on_comm_stream(self, target, source, residual) -> None:
        """Queue the rim sweeps on the communication stream, after all work queued so far on the compute stream."""
        if not self.rim:
            return
        if self._rim_ready is None:
            import cupy

            self._rim_ready = cupy.cuda.Event(block=False, disable_timing=True)
        self._rim_ready.record(self.arch.compute_stream)
        self.arch.comm_stream.wait_event(self._rim_ready)
        with self.arch.on_stream(self.arch.comm_stream):
            for region in self.rim:
                self.sweep_fn(target.data, source.data, region, residual)

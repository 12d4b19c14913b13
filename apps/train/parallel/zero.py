"""ZeRO stage 1: the optimiser state is sharded across ranks.

Each rank keeps the full parameters (fp32 masters and, in mixed precision, the
fp16 compute copy) but the optimiser moments only for its *shard*, a contiguous
range of the flat buffer (:meth:`ZeroRedundancy.owned_range`). One step:

1. backward as usual (no per-bucket communication: the reduce-scatter runs once
   the whole gradient buffer is final);
2. reduce-scatter of the gradients through the job's transport
   (:func:`hpcgpu.transport.collectives`): rank ``r`` receives the SUM over ranks of its
   shard ``[lo_r, hi_r)`` (``nccl``: a reduce-scatter in place of the equal shards plus an
   allreduce of the remainder, on the compute stream; the MPI transports, host or device:
   ``MPI_Reduce_scatter`` with the per-rank counts); 16-bit gradients that the library
   cannot add (bfloat16 everywhere, float16 in an MPI without it) are summed as float32
   copies and the shard is rounded back once;
3. the trainer converts/unscales only the shard, sums the shard's squared norm
   over ranks (global clipping and overflow check), and the optimiser steps only
   the shard with its shard of the state;
4. all-gather of the master parameters, so every replica holds the full updated
   model, then the compute copy is refreshed.

The update is elementwise, so the result equals unsharded data parallelism up to
the summation order of the reductions (bitwise on two ranks, where a sum of two
numbers has one order). Shards: ``chunk = n // n_ranks`` elements per rank and the
remainder to the last rank; NCCL's collectives need equal counts, so there the
remainder travels in a small extra allreduce / broadcast.

Memory per rank for AdamW: parameters + gradients + ``2 / n_ranks`` of the moments
(instead of 2 full copies).
"""

import numpy as np

from hpcgpu.transport import collectives

from apps.train.kernels.backend import array_module, is_bfloat16, is_cupy, to_numpy
from apps.train.kernels.buffers import round_to_bfloat16, scaled_copy
from .reducers import load_optimizer_slices, mpi_supports


def shard_ranges(n_params, n_ranks):
    """``[(lo, hi)]`` per rank: ``n // n_ranks`` elements each, the remainder to the last."""
    chunk = int(n_params) // int(n_ranks)
    ranges = [(rank * chunk, (rank + 1) * chunk) for rank in range(n_ranks)]
    ranges[-1] = (ranges[-1][0], int(n_params))
    return ranges


class ZeroRedundancy:
    """The trainer's ``sync`` for ZeRO-1 (see the module docstring).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    """

    zero_stage = 1
    on_grads_ready = None   # one reduce-scatter after backward, no per-bucket hook

    def __init__(self, comm, arch):
        self.comm, self.arch = comm, arch
        self.ranges = None
        self.grads = None
        self.buckets = []
        self.alone_seconds = None
        self._staging = None   # GPU bfloat16: the float32 buffer of the reduce-scatter

    # -- layout ---------------------------------------------------------------------
    def owned_range(self, n_params):
        if self.ranges is None or self.ranges[-1][1] != n_params:
            self.ranges = shard_ranges(n_params, self.comm.size)
        return self.ranges[self.comm.rank]

    @property
    def _chunk(self):
        return self.ranges[0][1] - self.ranges[0][0]

    def bind(self, grads):
        self.grads = grads
        self.owned_range(grads.shape[0])
        self.buckets = [self.ranges[self.comm.rank]]

    def before_backward(self):
        """Nothing to prepare; returns None."""

    # -- reductions -------------------------------------------------------------------
    def _movers(self, array):
        """The job's collectives for ``array``'s kind of buffer (device or host)."""
        return collectives(self.comm, on_device=is_cupy(array))

    def finish_gradients(self, grads):
        """Reduce-scatter: afterwards ``grads[owned_range]`` holds the sum over ranks."""
        if self.comm.size == 1:
            return
        movers = self._movers(grads)
        if movers.name == "nccl":
            self._reduce_scatter_nccl(movers, grads)
        else:
            self._reduce_scatter_mpi(movers, grads)

    def _reduce_scatter_mpi(self, movers, grads):
        """``MPI_Reduce_scatter`` with the shards' counts (host buffers, or device ones through MPI)."""
        lo, hi = self.ranges[self.comm.rank]
        counts = [b - a for a, b in self.ranges]
        xp = array_module(grads)
        if is_cupy(grads) and is_bfloat16(grads.dtype):
            # bit patterns (uint16): widen exactly, sum in float32, round this rank's shard once
            send = self._float32_staging(grads)
            received = xp.empty(hi - lo, dtype=xp.float32)
            movers.reduce_scatterv(send, received, counts)
            round_to_bfloat16(received, grads[lo:hi])
            return
        if mpi_supports(grads.dtype):
            send, received = grads, xp.empty(hi - lo, dtype=grads.dtype)
        else:   # bfloat16, or float16 in an MPI without it: reduce float32 copies
            send, received = grads.astype(xp.float32), xp.empty(hi - lo, dtype=xp.float32)
        movers.reduce_scatterv(send, received, counts)
        grads[lo:hi] = received

    def _reduce_scatter_nccl(self, movers, grads):
        if not is_bfloat16(grads.dtype):
            self._reduce_scatter_in_place(movers, grads)
            return
        # bfloat16 bit patterns (uint16): NCCL would add the integers. Summed in float32 like the
        # bucket allreduce and the CPU's MPI staging: widen into a float32 buffer (allocated once),
        # reduce-scatter it, round this rank's part back to bfloat16 once. All on the current
        # (compute) stream, so no other stream touches the staging buffer.
        staging = self._float32_staging(grads)
        self._reduce_scatter_in_place(movers, staging)
        lo, hi = self.ranges[self.comm.rank]
        round_to_bfloat16(staging[lo:hi], grads[lo:hi])

    def _float32_staging(self, grads):
        """``grads`` (bfloat16 bit patterns on the GPU) widened into the float32 staging buffer,
        allocated once, on the current stream."""
        import cupy

        if self._staging is None or self._staging.shape != grads.shape:
            self._staging = cupy.empty(grads.shape, dtype=cupy.float32)
        scaled_copy(grads, self._staging, 1.0)
        return self._staging

    def _reduce_scatter_in_place(self, movers, grads):
        """NCCL on the current (compute) stream, ordered after backward: a reduce-scatter in place of
        the ``size`` equal shards, then an allreduce in place of the remainder (the last rank's extra
        elements). Queued only: the host does not wait."""
        chunk, size, rank = self._chunk, self.comm.size, self.comm.rank
        if chunk:
            # in place: NCCL reads the whole [0, size*chunk) and writes rank r's chunk at r*chunk
            movers.reduce_scatter(grads[:size * chunk], grads[rank * chunk:(rank + 1) * chunk])
        if grads.shape[0] > size * chunk:
            tail = grads[size * chunk:]
            movers.allreduce(tail, out=tail)

    def sum_over_shards(self, value):
        return self.comm.allreduce(float(value), op="sum") if self.comm.size > 1 else value

    def gather_params(self, params):
        """All-gather the shards of ``params`` in place, so every rank holds them all; returns None."""
        if self.comm.size == 1:
            return
        movers = self._movers(params)
        if movers.name == "nccl":
            self._all_gather_in_place(movers, params)
            return
        lo, hi = self.ranges[self.comm.rank]
        # MPI forbids a send buffer inside the receive buffer (MPI_IN_PLACE aside): send a copy
        movers.allgatherv(params[lo:hi].copy(), params, [b - a for a, b in self.ranges])

    def _all_gather_in_place(self, movers, params):
        """NCCL on the current stream: the equal shards gathered in place, the remainder broadcast
        from the last rank."""
        chunk, size, rank = self._chunk, self.comm.size, self.comm.rank
        if chunk:
            movers.allgather(params[rank * chunk:(rank + 1) * chunk], params[:size * chunk])
        if params.shape[0] > size * chunk:
            movers.broadcast(params[size * chunk:], root=size - 1)

    def allreduce_sum(self, value):
        return self.comm.allreduce(value, op="sum") if self.comm.size > 1 else value

    # -- optimiser state for checkpoints -----------------------------------------
    def full_optimizer_state(self, optimizer_state):
        """Collective: the shards of every state array gathered into full host arrays."""
        counts = [b - a for a, b in self.ranges]
        movers = collectives(self.comm, on_device=False)
        full = {}
        for key, value in optimizer_state.items():
            local = to_numpy(value)
            if local.ndim == 0:      # a counter, the same on every rank (AdamW's step)
                full[key] = local[()]
                continue
            local = np.ascontiguousarray(local)
            gathered = np.empty(self.ranges[-1][1], dtype=local.dtype)
            movers.allgatherv(local, gathered, counts)
            full[key] = gathered
        return full

    def load_optimizer_state(self, optimizer_state, full_state):
        """Fill this rank's shard of ``optimizer_state`` from full host arrays; returns None."""
        lo, hi = self.ranges[self.comm.rank]
        load_optimizer_slices(optimizer_state, full_state, lo, hi)

    def measure_allreduce_alone(self, repeats=3):
        self.alone_seconds = None
        return None

    def overlap_stats(self):
        return {"buckets": 0, "bucket_mb": None, "hidden_fraction": None,
                "note": "ZeRO-1 reduce-scatters once after backward (no overlap)"}


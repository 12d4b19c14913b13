"""ZeRO stage 1: the optimiser state is sharded across ranks.

Each rank keeps the full parameters (fp32 masters and, in mixed precision, the
fp16 compute copy) but the optimiser moments only for its *shard*, a contiguous
range of the flat buffer (:meth:`ZeroRedundancy.owned_range`). One step:

1. backward as usual (no per-bucket communication: the reduce-scatter runs once
   the whole gradient buffer is final);
2. reduce-scatter of the gradients: rank ``r`` receives the SUM over ranks of its
   shard ``[lo_r, hi_r)`` (NCCL ``reduceScatter`` in place on the GPU,
   ``MPI_Reduce_scatter`` with per-rank counts on the CPU); 16-bit gradients that
   the library cannot add (bfloat16 everywhere, float16 in an MPI without it) are
   summed as float32 copies and the shard is rounded back once;
3. the trainer converts/unscales only the shard, sums the shard's squared norm
   over ranks (global clipping and overflow check), and the optimiser steps only
   the shard with its shard of the state;
4. all-gather of the master parameters, so every replica holds the full updated
   model, then the compute copy is refreshed.

The update is elementwise, so the result equals unsharded data parallelism up to
the summation order of the reductions (bitwise on two ranks, where a sum of two
numbers has one order). Shards: ``chunk = n // n_ranks`` elements per rank and the
remainder to the last rank; the NCCL collectives need equal counts, so the
remainder travels in a small extra allreduce / broadcast.

Memory per rank for AdamW: parameters + gradients + ``2 / n_ranks`` of the moments
(instead of 2 full copies).
"""

import numpy as np

from hpcgpu.transport.nccl import nccl_communicator, nccl_datatype

from ._backend import is_bfloat16, is_cupy, to_numpy
from .buffer_kernels import round_to_bfloat16, scaled_copy
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
    def finish_gradients(self, grads):
        """Reduce-scatter: afterwards ``grads[owned_range]`` holds the sum over ranks."""
        if self.comm.size == 1:
            return
        if is_cupy(grads):
            self._reduce_scatter_nccl(grads)
        else:
            self._reduce_scatter_mpi(grads)

    def _reduce_scatter_mpi(self, grads):
        from mpi4py import MPI

        lo, hi = self.ranges[self.comm.rank]
        counts = [b - a for a, b in self.ranges]
        if mpi_supports(grads.dtype):
            send, received = grads, np.empty(hi - lo, dtype=grads.dtype)
        else:   # no native float16 in this MPI: reduce float32 copies
            send, received = grads.astype(np.float32), np.empty(hi - lo, dtype=np.float32)
        self.comm.mpi.Reduce_scatter(send, received, recvcounts=counts, op=MPI.SUM)
        grads[lo:hi] = received

    def _reduce_scatter_nccl(self, grads):
        if not is_bfloat16(grads.dtype):
            self._reduce_scatter_nccl_in_place(grads)
            return
        # bfloat16 bit patterns (uint16): NCCL would add the integers. Summed in float32 like the
        # bucket allreduce and the CPU's MPI staging: widen into a float32 buffer (allocated once),
        # reduce-scatter it, round this rank's part back to bfloat16 once. All on the current
        # (compute) stream, so no other stream touches the staging buffer.
        import cupy

        if self._staging is None or self._staging.shape != grads.shape:
            self._staging = cupy.empty(grads.shape, dtype=cupy.float32)
        scaled_copy(grads, self._staging, 1.0)
        self._reduce_scatter_nccl_in_place(self._staging)
        lo, hi = self.ranges[self.comm.rank]
        round_to_bfloat16(self._staging[lo:hi], grads[lo:hi])

    def _reduce_scatter_nccl_in_place(self, grads):
        import cupy
        from cupy.cuda import nccl

        nccl_comm = nccl_communicator(self.comm)
        nccl_type = nccl_datatype(grads.dtype)
        stream = cupy.cuda.get_current_stream().ptr   # the compute stream: ordered after backward
        chunk, size = self._chunk, self.comm.size
        base = grads.data.ptr
        if chunk:
            # in place: NCCL reads the whole [0, size*chunk) and writes rank r's chunk at r*chunk
            nccl_comm.reduceScatter(base, base + self.comm.rank * chunk * grads.itemsize, chunk,
                                    nccl_type, nccl.NCCL_SUM, stream)
        tail = grads.shape[0] - size * chunk
        if tail:
            pointer = base + size * chunk * grads.itemsize
            nccl_comm.allReduce(pointer, pointer, tail, nccl_type, nccl.NCCL_SUM, stream)

    def sum_over_shards(self, value):
        return self.comm.allreduce(float(value), op="sum") if self.comm.size > 1 else value

    def gather_params(self, params):
        """All-gather the shards of ``params`` in place, so every rank holds them all."""
        if self.comm.size == 1:
            return
        if is_cupy(params):
            self._all_gather_nccl(params)
            return
        from mpi4py import MPI

        counts = [b - a for a, b in self.ranges]
        displacements = [a for a, _ in self.ranges]
        self.comm.mpi.Allgatherv(MPI.IN_PLACE, [params, (counts, displacements)])

    def _all_gather_nccl(self, params):
        import cupy

        nccl_comm = nccl_communicator(self.comm)
        nccl_type = nccl_datatype(params.dtype)
        stream = cupy.cuda.get_current_stream().ptr
        chunk, size = self._chunk, self.comm.size
        base = params.data.ptr
        if chunk:
            nccl_comm.allGather(base + self.comm.rank * chunk * params.itemsize, base, chunk,
                                nccl_type, stream)
        tail = params.shape[0] - size * chunk
        if tail:
            nccl_comm.bcast(base + size * chunk * params.itemsize, tail, nccl_type, size - 1, stream)

    def allreduce_sum(self, value):
        return self.comm.allreduce(value, op="sum") if self.comm.size > 1 else value

    # -- optimiser state for checkpoints -----------------------------------------
    def full_optimizer_state(self, optimizer_state):
        """Collective: the shards of every state array gathered into full host arrays."""
        counts = [b - a for a, b in self.ranges]
        displacements = [a for a, _ in self.ranges]
        full = {}
        for key, value in optimizer_state.items():
            local = to_numpy(value)
            if local.ndim == 0:      # a counter, the same on every rank (AdamW's step)
                full[key] = local[()]
                continue
            local = np.ascontiguousarray(local)
            gathered = np.empty(self.ranges[-1][1], dtype=local.dtype)
            self.comm.mpi.Allgatherv(local, [gathered, (counts, displacements), _mpi_type(local)])
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


def _mpi_type(array):
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(array.dtype)

"""The gradient synchronisation of a D x T x P grid: the trainer's ``sync`` for the split model.

Used by :class:`apps.train.parallel.trainer.ParallelTrainer`; see that module for one optimiser step.
"""

from hpcgpu.errors import ConfigurationError

from .distributed import DEFAULT_BUCKET_MB, DataParallel
from apps.train.training.optim import grad_sum_of_squares
from .zero import ZeroRedundancy


class ParallelSync:
    """The trainer's ``sync`` for a D x T x P grid (see :mod:`apps.train.training.trainer`).

    Gradients: summed over the data group by a :class:`DataParallel` on ``grid.data`` (buckets
    overlapped with the last backward) or, with ``zero_stage=1``, reduce-scattered over it by a
    :class:`~apps.train.parallel.zero.ZeroRedundancy` (ZeRO-1: each of the D replicas of this tensor/pipeline
    position owns ``1/D`` of this rank's flat buffer, steps only that part with its part of the
    optimiser state, and the updated master parameters are all-gathered over the data group).
    Norm: tensor rank 0 contributes its whole buffer (its owned part under ZeRO-1), the other tensor
    ranks only their shards (the owned part of them), summed over the data group (ZeRO-1) and then
    over the model group (T x P ranks), so replicated tensors count once. Loss: summed over the data
    group, then over the pipeline group.
    """

    def __init__(self, grid, arch, model, bucket_mb=DEFAULT_BUCKET_MB, zero_stage=0):
        if zero_stage not in (0, 1):
            raise ConfigurationError(f"parallel training: zero stage must be 0 or 1, found {zero_stage!r}")
        self.grid = grid
        self.zero_stage = int(zero_stage)
        self.data_parallel = (ZeroRedundancy(grid.data, arch) if zero_stage == 1
                              else DataParallel(grid.data, arch, bucket_mb))
        self.sharded_ranges = [(entry.offset, entry.stop) for leaf in model.leaves()
                               for entry in model.layout.entries
                               if entry.layer == leaf.name
                               and entry.name in getattr(leaf, "sharded_params", ())]
        self.precision = None

    @property
    def on_grads_ready(self):
        return self.data_parallel.on_grads_ready

    def attach(self, precision):
        """Remember the precision policy (whose gradients the norm reads); returns None."""
        self.precision = precision

    def bind(self, grads):
        self.data_parallel.bind(grads)

    def before_backward(self):
        self.data_parallel.before_backward()

    def finish_gradients(self, grads):
        self.data_parallel.finish_gradients(grads)

    def owned_range(self, n_params):
        """``(lo, hi)`` of this rank's flat buffer that its optimiser steps: all of it, or under
        ZeRO-1 this data replica's part (:func:`apps.train.parallel.zero.shard_ranges` over ``grid.data``)."""
        return self.data_parallel.owned_range(n_params)

    def sum_over_shards(self, value):
        if self.grid.model.size == 1 and not self.zero_stage:
            return value
        contribution = value if self.grid.tensor_rank == 0 else self._sharded_sum_of_squares()
        if self.zero_stage:   # each data replica holds the reduced gradients of its part only
            contribution = self.data_parallel.sum_over_shards(contribution)
        if self.grid.model.size == 1:
            return contribution
        return self.grid.model.allreduce(float(contribution), op="sum")

    def _sharded_sum_of_squares(self):
        precision = self.precision
        if precision.name in ("full", "bf16"):
            # bf16: the trainer converted the owned range to float32 master gradients already
            buffer, factor = precision.master_grads, 1.0
        else:   # the trainer's fused fp16 path reads the scaled fp16 gradients the same way
            buffer, factor = precision.compute_grads, 1.0 / precision.loss_scale ** 2
        owned_lo, owned_hi = self.owned_range(buffer.shape[0])
        pieces = [(max(lo, owned_lo), min(hi, owned_hi)) for lo, hi in self.sharded_ranges]
        return factor * sum(grad_sum_of_squares(buffer[lo:hi]) for lo, hi in pieces if hi > lo)

    def gather_params(self, params):
        """ZeRO-1: all-gather the owned parts of ``params`` over the data group; otherwise every
        rank stepped its whole buffer and there is nothing to gather. Returns None."""
        if self.zero_stage:
            self.data_parallel.gather_params(params)

    def allreduce_sum(self, value):
        value = self.data_parallel.allreduce_sum(value)
        if self.grid.pipeline_size > 1:
            value = self.grid.pipeline.allreduce(float(value), op="sum")
        return value


__all__ = ["ParallelSync"]

"""Communication volume of a D x T x P step: the Megatron formulas, and the bytes actually sent.

Per optimiser step, a rank of stage ``s`` holding ``n_blocks`` tensor-parallel MLP blocks, with
``rows`` samples in its data replica's share of the batch (all M micro-batches together), residual
width ``width`` and compute dtype of ``itemsize`` bytes, sends

* tensor parallelism (T > 1): every block allreduces its ``(micro-batch, width)`` output forward
  (:class:`~apps.train.parallel.tensor_parallel.RowParallelLinear`) and its input gradient backward
  (:class:`~apps.train.parallel.tensor_parallel.ColumnParallelLinear`). The payload passed to the
  allreduces is ``2 * n_blocks * rows * width * itemsize`` bytes; a ring allreduce of ``b`` bytes
  sends ``2 (T - 1) / T * b`` bytes from every rank (reduce-scatter, then all-gather), so::

      tensor  = 2 (T - 1) / T * 2 * n_blocks * rows * width * itemsize

  With activation recomputation (``--recompute``) each block's forward runs again in backward,
  with its allreduce: 3 instead of 2 allreduces per block and step.

* pipeline parallelism (P > 1): the activation ``(micro-batch, width)`` of every micro-batch to
  the next stage (not on the last stage) and its gradient to the previous stage (not on the first)::

      pipeline = (boundaries of stage s) * rows * width * itemsize,   boundaries in {1, 2}

Neither depends on M: the micro-batches split the same rows. The data-parallel gradient allreduce
(the parameters' size, once per step) is reported by :mod:`apps.train.parallel.distributed`.

The *measured* side counts what the code passes to its communication calls during the step
(:attr:`TensorGroup.n_bytes_reduced <apps.train.parallel.tensor_parallel.TensorGroup>`, the pipeline
sender's ``bytes_sent``); :func:`communication_report` puts both side by side.
"""

from apps.train.data.dataset import shard_bounds


def ring_allreduce_factor(n_ranks):
    """``2 (n - 1) / n``: bytes each rank sends per byte allreduced by a ring (0 on one rank)."""
    return 2.0 * (n_ranks - 1) / n_ranks if n_ranks > 1 else 0.0


def blocks_in_stage(spec, stage_range):
    """Number of MLP blocks in the top-level layer range ``[start, stop)`` (layers 1 .. depth of
    :func:`apps.train.parallel.tensor_parallel.mlp_layers` are the blocks)."""
    start, stop = stage_range
    return max(0, min(stop, spec.depth + 1) - max(start, 1))


def computed_volume(spec, stage_ranges, stage, tensor_size, rows, itemsize, recompute=False):
    """Bytes one rank sends per step, by the formulas of the module docstring.

    Parameters
    ----------
    spec : MLPSpec
    stage_ranges : list of (int, int)
        Top-level layer ranges of the P stages.
    stage : int
    tensor_size : int
        T.
    rows : int
        Samples of the rank's data replica per step.
    itemsize : int
        Bytes per value of the compute dtype.
    recompute : bool
        Activation recomputation: the forward allreduce of every block runs twice.

    Returns
    -------
    dict
        ``tensor_payload`` (bytes given to the allreduces), ``tensor`` (ring bytes sent),
        ``pipeline`` (bytes sent to the neighbouring stages).
    """
    n_stages = len(stage_ranges)
    activation = rows * spec.width * itemsize
    allreduces_per_block = 3 if recompute else 2
    payload = (allreduces_per_block * blocks_in_stage(spec, stage_ranges[stage]) * activation
               if tensor_size > 1 else 0)
    boundaries = int(stage < n_stages - 1) + int(stage > 0)
    return {"tensor_payload": payload, "tensor": ring_allreduce_factor(tensor_size) * payload,
            "pipeline": boundaries * activation}


def computed_max_volume(spec, stage_ranges, tensor_size, data_size, global_batch_size, itemsize,
                        recompute=False):
    """:func:`computed_volume`'s largest values over every rank of the grid (replicated input:
    the same answer on every rank, no communication)."""
    largest = {"tensor_payload": 0, "tensor": 0.0, "pipeline": 0}
    for data_rank in range(data_size):
        lo, hi = shard_bounds(global_batch_size, data_rank, data_size)
        for stage in range(len(stage_ranges)):
            volume = computed_volume(spec, stage_ranges, stage, tensor_size, hi - lo, itemsize, recompute)
            largest = {key: max(largest[key], volume[key]) for key in largest}
    return largest


def find_tensor_group(model):
    """The :class:`~apps.train.parallel.tensor_parallel.TensorGroup` the split layers of ``model`` share, or
    None (T = 1, or no block on this stage)."""
    for leaf in model.leaves():
        group = getattr(leaf, "group", None)
        if group is not None:
            return group
    return None


class CommunicationMeter:
    """Bytes passed to the tensor allreduces and the pipeline sends during training steps.

    Call :meth:`begin_step` before a step's forward/backward and :meth:`end_step` after it (the
    evaluation's allreduces and sends are not counted).

    Parameters
    ----------
    tensor_group : TensorGroup or None
    point_to_point : object with ``bytes_sent``
    """

    def __init__(self, tensor_group, point_to_point):
        self.tensor_group, self.point_to_point = tensor_group, point_to_point
        self.steps, self.tensor_payload, self.pipeline = 0, 0, 0
        self._start = (0, 0)

    def _counters(self):
        tensor = self.tensor_group.n_bytes_reduced if self.tensor_group is not None else 0
        return tensor, self.point_to_point.bytes_sent

    def begin_step(self):
        self._start = self._counters()

    def end_step(self):
        tensor, pipeline = self._counters()
        self.tensor_payload += tensor - self._start[0]
        self.pipeline += pipeline - self._start[1]
        self.steps += 1

    def per_step(self):
        """``(tensor_payload, pipeline)`` bytes per step, averaged over the steps (0 before one)."""
        if self.steps == 0:
            return 0.0, 0.0
        return self.tensor_payload / self.steps, self.pipeline / self.steps


def communication_report(runner):
    """Collective over the world: measured and computed bytes per step and rank.

    Parameters
    ----------
    runner : apps.train.parallel.trainer.ParallelTrainer

    Returns
    -------
    dict
        ``unit`` ("bytes per step and rank"), ``steps``, and for ``tensor`` (ring bytes sent),
        ``tensor_payload`` (bytes given to the allreduces) and ``pipeline``: ``measured`` and
        ``computed`` (the largest over ranks) and ``measured_per_rank`` / ``computed_per_rank``
        (world rank order).
    """
    grid = runner.grid
    meter = runner.communication
    tensor_payload, pipeline = meter.per_step()
    lo, hi = shard_bounds(runner.config.global_batch_size, grid.data_rank, grid.data_size)
    computed = computed_volume(runner.parallel_model.spec, runner.parallel_model.stage_ranges,
                               grid.pipeline_rank, grid.tensor_size, hi - lo, runner.itemsize,
                               runner.recompute)
    measured = {"tensor_payload": tensor_payload,
                "tensor": ring_allreduce_factor(grid.tensor_size) * tensor_payload,
                "pipeline": pipeline}
    gathered = grid.world.mpi.allgather((measured, computed, meter.steps))
    report = {"unit": "bytes per step and rank", "steps": min(steps for _, _, steps in gathered)}
    for key in ("tensor", "tensor_payload", "pipeline"):
        report[key] = {"measured": max(m[key] for m, _, _ in gathered),
                       "computed": max(c[key] for _, c, _ in gathered),
                       "measured_per_rank": [m[key] for m, _, _ in gathered],
                       "computed_per_rank": [c[key] for _, c, _ in gathered]}
    return report


def format_bytes(value):
    """``"12.6 MB"``: decimal units (kB, MB, GB), three significant digits."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def volume_line(tensor, tensor_computed, pipeline, pipeline_computed):
    """``communication per step: tensor 12.6 MB (computed 12.6 MB), pipeline ...``."""
    return (f"communication per step and rank (max over ranks): tensor {format_bytes(tensor)} "
            f"(computed {format_bytes(tensor_computed)}), pipeline {format_bytes(pipeline)} "
            f"(computed {format_bytes(pipeline_computed)})")

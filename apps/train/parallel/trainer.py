"""Hybrid data x tensor x pipeline training: this rank's part of the model and its optimiser step.

:class:`ParallelTrainer` holds one rank's stage of the model, its optimiser state and pipeline
engine; :meth:`ParallelTrainer.step` is one optimiser step. The app runs those steps through the
simulation driver (:class:`apps.train.run.parallel_model.ParallelTrainingModel` under
:class:`hpcgpu.simulation.Simulation`: ``python -m apps.train --model residual-mlp
--tensor-parallel 2 --pipeline-parallel 2``), which brings the loader, evaluations, checkpoints and
the summary. Built by hand::

    comm = hpcgpu.Communicator()
    grid = make_grid(comm, tensor_size=2, pipeline_size=2)          # D = n_ranks / 4
    spec = MLPSpec(n_inputs=40, n_classes=10, width=256, hidden=1024, depth=8)
    runner = ParallelTrainer(grid, spec, TrainConfig(precision="fp32", global_batch_size=256),
                             micro_batches=8, schedule="1f1b")
    metrics = runner.step(x_local, y_local, sample_index_local)   # this data replica's share of a batch

One optimiser step (:meth:`ParallelTrainer.step`):

1. zero the gradients; the :class:`~apps.train.parallel.pipeline.PipelineEngine` runs this stage's schedule
   over M micro-batches of the data replica's share of the batch (with P = 1 and M = 1 that is one
   forward and one backward); the tensor-parallel layers allreduce inside their tensor group;
   the last backward passes the data-parallel bucket hook (:class:`ParallelSync`);
2. the data-parallel buckets finish (sum over the D replicas of this shard);
3. :func:`apps.train.training.trainer.apply_gradients`: the gradient norm over all shards (replicated
   tensors counted once), clipping, overflow skip, the optimiser step on this rank's shard;
4. the loss (last stage) summed over data replicas and sent to every stage.

Every rank's initial shard is cut from the unsplit model's initialisation for the seed
(:func:`init_parallel_parameters`), so any D x T x P grid trains the model of one process to
rounding. :meth:`ParallelTrainer.evaluate` runs a split model forward only. Checkpoints:
:mod:`apps.train.parallel.sharded_checkpoint` (the unsplit model, restartable on any grid).

On GPUs the tensor groups allreduce with NCCL and the stages exchange activations with NCCL
point-to-point (:mod:`apps.train.parallel.pipeline_transport`); the communicators are created up front by
:func:`apps.train.parallel.grid.prepare_device_communication`. The bytes of both are counted per
step (:mod:`apps.train.parallel.comm_volume`).

Precision (``config.precision``): fp32, fp64, fp16 (fp32 masters, dynamic loss scaling) and bf16
(fp32 masters and optimiser state, no loss scaling), as in data-parallel training
(:mod:`apps.train.training.precision`). The activations, the tensor allreduces and the pipeline messages are
in the 16-bit compute dtype; bf16's data-parallel gradients are summed in float32 and rounded once
(MPI staging on CPUs, NCCL float32 staging on GPUs), its tensor allreduce sums float32 copies on CPUs
and bfloat16 in NCCL (:func:`apps.train.parallel.tensor_parallel.allreduce_bfloat16`); ZeRO-1's
reduce-scatter of bf16 gradients sums float32 copies too (:mod:`apps.train.parallel.zero`).

ZeRO-1 (``zero_stage=1``): the D data replicas of each (tensor, pipeline) position split that rank's
flat buffer into D contiguous parts (:func:`apps.train.parallel.zero.shard_ranges`); step 2 becomes a
reduce-scatter over the data group, step 3 steps only the owned part with its part of the optimiser
state (the gradient norm summed over the data group, then the model group) and ends with an
all-gather of the master parameters over the data group -- :class:`apps.train.parallel.zero.ZeroRedundancy`
on ``grid.data``, the same machinery as data-parallel ZeRO-1 (MPI on CPUs, NCCL on GPUs). The
optimiser state per rank drops to 1/D; the fp32 masters stay whole on every rank (as in
:mod:`apps.train.parallel.zero`).
"""

import contextlib
from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives

from apps.train.kernels.backend import to_numpy
from apps.train.data.dataset import shard_bounds
from .distributed import DEFAULT_BUCKET_MB
from .comm_volume import CommunicationMeter, find_tensor_group
from .grid import prepare_device_communication
from apps.train.nn.params import initial_tensor
from .pipeline import PipelineEngine, bubble_fraction, partition_stages
from .pipeline_transport import make_point_to_point
from .sync import ParallelSync
from apps.train.nn.sequential import Sequential
from .tensor_parallel import mlp_layers
from apps.train.training.trainer import StepMetrics, Trainer, apply_gradients, init_train_state


def _phase(timers, name):
    """``timers.phase(name)`` or a no-op context when no timers are given."""
    return contextlib.nullcontext() if timers is None else timers.phase(name)


def layer_param_count(layer):
    """Parameters of a top-level layer (all its leaves)."""
    return sum(int(np.prod(spec.shape)) for leaf in layer.leaves() for spec in leaf.param_specs())


@dataclass
class ParallelModel:
    """This rank's part of the model.

    Attributes
    ----------
    model : Sequential
        The stage's layers (tensor-parallel where T > 1).
    spec : MLPSpec
    stage_ranges : list of (int, int)
        Top-level layer range ``[start, stop)`` of every stage.
    stage : int
    """

    model: Sequential
    spec: object
    stage_ranges: list
    stage: int

    def reference(self):
        """The unsplit one-process model (layouts only: no arrays are allocated)."""
        return Sequential(mlp_layers(self.spec))

    def leaf_pairs(self):
        """``(stage leaf, reference leaf, reference layout)`` for every leaf of this stage."""
        reference = self.reference()
        start = self.stage_ranges[self.stage][0]
        offset = sum(len(layer.leaves()) for layer in reference.layers[:start])
        reference_leaves = reference.leaves()
        return [(leaf, reference_leaves[offset + index], reference.layout)
                for index, leaf in enumerate(self.model.leaves())]


def build_parallel_model(grid, model_spec, boundaries=None, tensor_collectives=None,
                         recompute=False):
    """This rank's stage of ``model_spec`` split over ``grid`` (no collective).

    Parameters
    ----------
    grid : ParallelGrid
    model_spec : MLPSpec
    boundaries : list of int, optional
        First top-level layer of stages 1 .. P-1; default balanced by parameter count.
    tensor_collectives : object, optional
        ``allreduce(array, op)`` of the tensor group (default: the tensor communicator, MPI).
    recompute : bool
        Activation recomputation of the stage's blocks (see :class:`ParallelTrainer`).
    """
    model_spec.validate(grid.tensor_size)
    counts = [layer_param_count(layer) for layer in mlp_layers(model_spec)]
    ranges = partition_stages(counts, grid.pipeline_size, boundaries)
    group = grid.tensor_group(tensor_collectives) if grid.tensor_size > 1 else None
    start, stop = ranges[grid.pipeline_rank]
    model = Sequential(mlp_layers(model_spec, group)[start:stop], recompute=recompute)
    return ParallelModel(model, model_spec, ranges, grid.pipeline_rank)


def init_parallel_parameters(parallel_model, seed, dtype="float64"):
    """This rank's flat parameters: each tensor (or shard) cut from the unsplit model's values.

    Returns
    -------
    numpy.ndarray, shape (parallel_model.model.layout.n_params,)
    """
    layout = parallel_model.model.layout
    flat = np.zeros(layout.n_params, dtype=np.float64)
    for leaf, reference_leaf, reference_layout in parallel_model.leaf_pairs():
        lo, _ = leaf.param_range
        reference_lo, _ = reference_leaf.param_range
        for entry, reference_entry in zip(_entries_from(layout, lo, leaf),
                                          _entries_from(reference_layout, reference_lo, reference_leaf)):
            index = reference_layout.entries.index(reference_entry)
            values = initial_tensor(reference_entry, seed, index)
            if hasattr(leaf, "shard"):
                values = leaf.shard(entry.name, values)
            flat[entry.offset:entry.stop] = values.reshape(-1)
    return flat.astype(dtype)


def _entries_from(layout, lo, leaf):
    return [entry for entry in layout.entries if entry.layer == leaf.name and entry.offset >= lo]


class ParallelTrainer:
    """Model, optimiser state and pipeline engine of one rank of a D x T x P grid.

    Parameters
    ----------
    grid : ParallelGrid
    model_spec : MLPSpec
    config : TrainConfig
        ``global_batch_size`` counts all data replicas and micro-batches; ``accum_steps`` must be 1
        (micro-batches are ``micro_batches``).
    arch : hpcgpu.arch.CPU or GPU, optional
        Default: the CPU.
    micro_batches : int
        M, micro-batches per step (the pipeline schedule's; gradient accumulation when P = 1).
    schedule : {"1f1b", "gpipe"}
    boundaries : list of int, optional
        Stage boundaries (see :func:`build_parallel_model`).
    bucket_mb : float
        Data-parallel bucket size.
    tensor_collectives, point_to_point : optional
        The tensor group's ``allreduce(array, op)`` object and the pipeline sender. Defaults: from
        :func:`~apps.train.parallel.grid.prepare_device_communication` (MPI on CPUs, NCCL on GPUs)
        and :func:`~apps.train.parallel.pipeline_transport.make_point_to_point`.
    recompute : bool
        Activation recomputation (:class:`~apps.train.nn.sequential.Sequential`): each stage keeps only
        its blocks' inputs per micro-batch in flight (the engine stashes them) and re-runs a block's
        forward just before its backward -- bitwise the same gradients. A tensor-parallel block's
        recomputed forward allreduces its output again: one more allreduce per block and step.
    zero_stage : {0, 1}
        1: ZeRO-1 over the data axis -- the D replicas of each (tensor, pipeline) position split
        that rank's optimiser state (see :class:`ParallelSync`); the result equals ``zero_stage=0``
        up to the summation order of the gradient norm (and of the gradients for D > 2).

    Attributes
    ----------
    communication : apps.train.parallel.comm_volume.CommunicationMeter
        Bytes given to the tensor allreduces and the pipeline sends in :meth:`step`.
    itemsize : int
        Bytes per value of the compute dtype (what the activations travel in).
    """

    def __init__(self, grid, model_spec, config, arch=None, micro_batches=1, schedule="1f1b",
                 boundaries=None, bucket_mb=DEFAULT_BUCKET_MB, tensor_collectives=None,
                 point_to_point=None, zero_stage=0, recompute=False):
        import hpcgpu

        if config.accum_steps != 1:
            raise ConfigurationError(
                f"parallel training: accum_steps must be 1 (found {config.accum_steps}); use "
                "micro_batches for accumulation")
        if config.global_batch_size < grid.data_size * micro_batches:
            raise ConfigurationError(
                f"parallel training: a global batch of {config.global_batch_size} cannot fill "
                f"{grid.data_size} data replicas x {micro_batches} micro-batches; raise the batch")
        self.grid, self.config = grid, config
        self.arch = arch if arch is not None else hpcgpu.arch.CPU()
        # collective, in the same order on every rank: transports and NCCL communicators first
        device_collectives = prepare_device_communication(grid, self.arch, zero_stage)
        if tensor_collectives is None:
            tensor_collectives = device_collectives
        self.recompute = bool(recompute)
        self.parallel_model = build_parallel_model(grid, model_spec, boundaries, tensor_collectives,
                                                   recompute=self.recompute)
        model = self.parallel_model.model
        self.trainer = Trainer(model, config)
        self.sync = ParallelSync(grid, self.arch, model, bucket_mb, zero_stage)
        self.state = init_train_state(self.trainer, self.arch.xp, self.sync)
        precision = self.state.precision
        master_dtype = precision.master_params.dtype
        precision.master_params[...] = self.arch.xp.asarray(
            init_parallel_parameters(self.parallel_model, config.seed, master_dtype))
        precision.refresh_compute_params()
        self.sync.attach(precision)
        if point_to_point is None:
            point_to_point = make_point_to_point(grid.pipeline, self.arch)
        self.engine = PipelineEngine(model, grid.pipeline_rank, grid.pipeline_size, micro_batches,
                                     schedule, point_to_point, grid.pipeline)
        self.itemsize = int(precision.compute_params.dtype.itemsize)
        self.communication = CommunicationMeter(find_tensor_group(model), point_to_point)
        self._timing = {"wall": 0.0, "idle": 0.0, "steps": 0, "peak_in_flight": 0}

    def step(self, x_local, y_local, sample_index_local, timers=None):
        """One optimiser step on this data replica's share of the global batch.

        Parameters
        ----------
        x_local : ndarray, shape (local_batch, n_inputs)
        y_local : ndarray of int, shape (local_batch,)
        sample_index_local : ndarray of int64, shape (local_batch,)
            As :meth:`apps.train.data.loader.ShardedLoader.next` returns them for
            ``rank=grid.data_rank, n_ranks=grid.data_size``.
        timers : hpcgpu.app.timers.PhaseTimers, optional
            Gets the phases ``compute`` (the schedule, with its waits for neighbours) and
            ``allreduce`` (waiting for the data-parallel gradients).

        Returns
        -------
        StepMetrics
            With the global mean loss on every rank.
        """
        config, state = self.config, self.state
        precision = state.precision
        with _phase(timers, "compute"):
            precision.compute_grads.fill(0)
            self.communication.begin_step()
            loss_contribution, stats = self.engine.compute_gradients(
                x_local, y_local, sample_index_local, config.seed, state.step,
                config.global_batch_size, precision.compute_params.dtype, precision.loss_scale,
                self.sync)
            self.communication.end_step()
        with _phase(timers, "allreduce"):
            self.sync.finish_gradients(precision.compute_grads)
        loss_scale = precision.loss_scale
        norm, lr, applied = apply_gradients(self.trainer, state, self.sync, timers)
        state.step += 1
        loss = self.sync.allreduce_sum(loss_contribution)
        timing = self._timing
        timing["wall"] += stats.wall
        timing["idle"] += stats.idle
        timing["steps"] += 1
        timing["peak_in_flight"] = max(timing["peak_in_flight"], stats.peak_in_flight)
        return StepMetrics(loss=loss, grad_norm=norm, lr=lr, applied=applied, loss_scale=loss_scale)

    def evaluate(self, x, y, batch_size=1000):
        """Collective: mean loss and accuracy on ``(x, y)`` (the same arrays on every rank).

        Each data replica evaluates its share of the rows through the pipeline (forward only);
        the sums are added over replicas and sent to every stage.

        Returns
        -------
        (float, float)
        """
        n_rows = int(x.shape[0])
        lo, hi = shard_bounds(n_rows, self.grid.data_rank, self.grid.data_size)
        dtype = self.state.precision.compute_params.dtype
        loss_sum, correct = self.engine.forward_only(x[lo:hi], y[lo:hi], dtype, batch_size)
        return (self.sync.allreduce_sum(float(loss_sum)) / n_rows,
                self.sync.allreduce_sum(float(correct)) / n_rows)

    def pipeline_report(self):
        """Collective over the pipeline group: the bubble, by formula and measured per stage.

        Returns
        -------
        dict
            ``schedule``, ``stages``, ``micro_batches``, ``bubble_formula`` ((P-1)/(M+P-1)),
            ``bubble_measured`` (per stage: idle / wall of the gradient phase, over all steps),
            ``peak_in_flight`` (per stage: most micro-batches whose activations were held).
        """
        timing = self._timing
        measured = timing["idle"] / timing["wall"] if timing["wall"] > 0 else 0.0
        gathered = self.grid.pipeline.mpi.allgather((measured, timing["peak_in_flight"]))
        engine = self.engine
        return {"schedule": engine.schedule, "stages": engine.n_stages,
                "micro_batches": engine.n_micro,
                "bubble_formula": bubble_fraction(engine.n_stages, engine.n_micro),
                "bubble_measured": [value for value, _ in gathered],
                "peak_in_flight": [peak for _, peak in gathered]}

    def full_parameters(self):
        """Collective over the world: the unsplit model's flat master parameters on every rank.

        Returns
        -------
        numpy.ndarray of float64, shape (n_params of the one-process model,)
            In the one-process model's layout, so it compares with a serial run (or a checksum).
        """
        full = None
        master = to_numpy(self.state.precision.master_params).astype(np.float64)
        for leaf, reference_leaf, reference_layout in self.parallel_model.leaf_pairs():
            if full is None:
                full = np.zeros(reference_layout.n_params)
            entries = _entries_from(self.parallel_model.model.layout, leaf.param_range[0], leaf)
            reference_entries = _entries_from(reference_layout, reference_leaf.param_range[0],
                                              reference_leaf)
            for entry, reference_entry in zip(entries, reference_entries):
                target = full[reference_entry.offset:reference_entry.stop].reshape(reference_entry.shape)
                sharded = entry.name in getattr(leaf, "sharded_params", ())
                if self.grid.data_rank != 0 or (self.grid.tensor_rank != 0 and not sharded):
                    continue   # written once: by data replica 0 and, if replicated, tensor rank 0
                if hasattr(leaf, "shard"):
                    target = leaf.shard(entry.name, target)
                target[...] = master[entry.offset:entry.stop].reshape(entry.shape)
        if full is None:
            full = np.zeros(self.parallel_model.reference().layout.n_params)
        return collectives(self.grid.world, on_device=False).allreduce(full)

    def optimizer_state_bytes(self):
        """Bytes of this rank's optimiser state arrays (AdamW's moments, SGD's momentum; counters
        excluded): ``2 * itemsize * n`` for AdamW on ``n`` parameters, ``n / D`` of them under ZeRO-1.

        Returns
        -------
        int
        """
        return int(sum(value.nbytes for value in self.state.optimizer_state.values()
                       if getattr(value, "ndim", 0) > 0))

    def describe(self):
        """Lines for a run header: the grid, this stage's layers and its parameter count."""
        start, stop = self.parallel_model.stage_ranges[self.grid.pipeline_rank]
        return [self.grid.describe(),
                f"pipeline: {self.engine.n_stages} stage(s) at layers "
                f"{[r[0] for r in self.parallel_model.stage_ranges]}, {self.engine.n_micro} "
                f"micro-batches, {self.engine.schedule}; this stage: layers {start}-{stop - 1}, "
                f"{self.parallel_model.model.n_params} parameters",
                self.optimizer_line()]

    def optimizer_line(self):
        """``optimiser state: N bytes on this rank (ZeRO-1: 1/D of ...)`` for a run header."""
        n_bytes = self.optimizer_state_bytes()
        if not self.sync.zero_stage:
            return (f"optimiser state: {n_bytes} bytes on this rank (the same on each of "
                    f"{self.grid.data_size} data replica(s))")
        lo, hi = self.sync.owned_range(self.parallel_model.model.n_params)
        return (f"optimiser state: {n_bytes} bytes on this rank (ZeRO-1: parameters [{lo}, {hi}) of "
                f"{self.parallel_model.model.n_params}, 1/{self.grid.data_size} over the data replicas)")

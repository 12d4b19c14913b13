"""``apps.train --model residual-mlp`` as a :class:`hpcgpu.simulation.Model`: D x T x P training.

The training itself is :class:`apps.train.parallel.trainer.ParallelTrainer` (tensor-parallel
blocks, pipeline stages with micro-batches, data-parallel buckets over the replicas); this module
adapts it to the simulation driver, as :class:`apps.train.run.simulation_model.TrainingModel` does for
the data-parallel models:

* a step is one optimiser step over one global batch: every rank of data replica ``d`` reads
  replica ``d``'s shard of the batch (:class:`~apps.train.data.loader.ShardedLoader` with
  ``rank=grid.data_rank, n_ranks=grid.data_size``) and calls :meth:`ParallelTrainer.step`;
* evaluation every ``--eval-every`` steps through :meth:`ParallelTrainer.evaluate` (the
  :class:`~apps.train.run.simulation_model.Evaluation` operation);
* diagnostics: the loss curve, the evaluations, the pipeline bubble (formula (P-1)/(M+P-1) and
  measured per stage), the data-parallel overlap, the tensor-parallel allreduce count, the
  communication volume per step (tensor and pipeline bytes, measured and by formula:
  :mod:`apps.train.parallel.comm_volume`), and the norm of the full (unsplit) parameters;
* header: the grid and which of its axes lie inside a node, the stages, the optimiser-state bytes of
  the rank (1/D of them under ``--zero 1``), how the groups communicate and the computed volume per
  step; the results repeat it beside the measured volume;
* the checksum is the SHA-256 of :meth:`ParallelTrainer.full_parameters` in the unsplit model's
  layout and master dtype, so a 1 x 2 x 1 run and a 1 x 1 x 1 run of the same ``MLPSpec`` compare
  (they agree to rounding, ~1e-16 relative per step, not bitwise: see docs/parallelism.md).

Checkpoints hold the unsplit model (parameters and optimiser state in the one-process layout,
:mod:`apps.train.parallel.sharded_checkpoint`): a restart on the same grid continues bitwise, one on another
grid (other T, P or D) continues the same training to rounding.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.app.checksum import hash_arrays

from apps.train.kernels.backend import to_numpy
from apps.train.parallel.comm_volume import communication_report, computed_max_volume, format_bytes, volume_line
from apps.train.data.dataset import shard_bounds
from apps.train.parallel.distributed import replicas_identical
from apps.train.parallel.grid import transport_note
from apps.train.parallel.sharded_checkpoint import ShardedCheckpoint
from .training_run import TrainingRun


class ParallelTrainingModel(TrainingRun):
    """One D x T x P training run of ``--model residual-mlp``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    options : hpcgpu.app.cli.FrozenOptions
        The resolved options (:func:`apps.train.app.resolve_options`).
    data : apps.train.data.loader.TrainingData
    grid : apps.train.parallel.grid.ParallelGrid
    runner : apps.train.parallel.trainer.ParallelTrainer
    """

    table_diagnostics = TrainingRun.table_diagnostics + ("parameter_norm",)

    def __init__(self, comm, arch, options, data, grid, runner):
        self.grid, self.runner = grid, runner
        self._sharded_checkpoint = None
        super().__init__(comm, arch, options, data, n_params=runner.parallel_model.reference().layout.n_params)

    @property
    def step_index(self) -> int:
        return self.runner.state.step

    # ------------------------------------------------------------------ stepping
    def prepare(self) -> None:
        """Measure the data-parallel allreduce alone (overlap report); start the loader."""
        self.runner.sync.data_parallel.measure_allreduce_alone()
        self.start_loader(self.grid.data_rank, self.grid.data_size)   # the replica's shard of each batch

    def step(self, timers) -> None:
        batch = self.loader.next()
        self.record_loss(self.runner.step(batch.x, batch.y, batch.sample_index, timers).loss)

    def evaluate(self) -> None:
        """Collective: loss and accuracy on the test set through the split model."""
        self.record_evaluation(*self.runner.evaluate(self.x_test, self.y_test))

    # ------------------------------------------------------------------ description
    def describe(self) -> str:
        options = self.options
        return (f"{options.model} (depth {options.depth}, width {options.width}, hidden {options.hidden}), "
                f"{self.n_params:,} parameters, {options.precision}, {options.optimizer} lr {options.lr:g}")

    def _replica_shares(self) -> list[int]:
        return [hi - lo for lo, hi in (shard_bounds(self.options.batch_size, d, self.grid.data_size)
                                       for d in range(self.grid.data_size))]

    def header_lines(self, comm, arch) -> list[str]:
        options, grid = self.options, self.grid
        lines = self.first_header_lines(arch)
        shares = sorted(set(self._replica_shares()))
        n_nodes = len(set(grid.node_of_rank)) if grid.node_of_rank else comm.n_nodes
        nodes = f"{n_nodes} node(s)" if n_nodes == comm.n_nodes else f"{n_nodes} simulated node(s)"
        if self.runner.sync.zero_stage:
            sync_text = ("ZeRO-1 over the data replicas (gradient reduce-scatter, optimiser state split, "
                         "parameter all-gather)")
        else:
            sync_text = (f"{len(self.runner.sync.data_parallel.buckets)} allreduce bucket(s) of <= "
                         f"{options.bucket_mb:g} MB over the data replicas")
        lines.append(f"ranks: {comm.size} on {nodes}; global batch {options.batch_size} = "
                     f"{grid.data_size} data replica(s) x {'/'.join(str(s) for s in shares)} in "
                     f"{options.micro_batches} micro-batch(es); {sync_text}")
        lines.extend(self.runner.describe())   # the grid (which axis lies inside a node), the stages
        if grid.tensor_size > 1 or grid.pipeline_size > 1:
            computed = self._computed_volume()
            lines.append(f"communication per step and rank (computed, max over ranks; "
                         f"{transport_note(grid, arch)}): tensor {format_bytes(computed['tensor'])} "
                         f"(ring allreduce 2(T-1)/T of {format_bytes(computed['tensor_payload'])}), "
                         f"pipeline {format_bytes(computed['pipeline'])}")
        return lines

    def _computed_volume(self) -> dict:
        runner, grid = self.runner, self.grid
        return computed_max_volume(runner.parallel_model.spec, runner.parallel_model.stage_ranges,
                                   grid.tensor_size, grid.data_size, self.options.batch_size,
                                   runner.itemsize, runner.recompute)

    def decomposition(self) -> dict:
        grid, options = self.grid, self.options
        return {"kind": "data x tensor x pipeline", "data": grid.data_size, "tensor": grid.tensor_size,
                "pipeline": grid.pipeline_size, "micro_batches": options.micro_batches,
                "schedule": options.pipeline_schedule, "tensor_inside_node": bool(grid.tensor_inside_node),
                "stage_layers": [list(r) for r in self.runner.parallel_model.stage_ranges],
                "global_batch_size": options.batch_size, "replica_batch_sizes": self._replica_shares(),
                "buckets": len(self.runner.sync.data_parallel.buckets), "bucket_mb": options.bucket_mb,
                "zero_stage": int(self.runner.sync.zero_stage),
                "optimizer_state_bytes_per_rank": getattr(self, "_optimizer_bytes", None)}

    def _optimizer_state_bytes(self) -> dict:
        """Collective: the optimiser-state bytes per rank (max and min over the world's ranks)."""
        local = self.runner.optimizer_state_bytes()
        self._optimizer_bytes = {"max": int(self.comm.allreduce(local, op="max")),
                                 "min": int(self.comm.allreduce(local, op="min"))}
        return self._optimizer_bytes

    # ------------------------------------------------------------------ checkpoint / restart
    def _checkpoints(self) -> ShardedCheckpoint:
        """Collective on first use: the saver/loader of this grid's shards."""
        if self._sharded_checkpoint is None:
            self._sharded_checkpoint = ShardedCheckpoint(self.runner, self.options.model)
        return self._sharded_checkpoint

    def checkpoint_state(self) -> dict:
        """Collective: the unsplit parameters and optimiser state (:mod:`apps.train.parallel.sharded_checkpoint`)."""
        return self._checkpoints().state(self.history)

    def load_checkpoint(self, control) -> int | None:
        """Collective: load ``--restart`` onto this run's grid (any grid: the checkpoint holds the
        unsplit model); the schedule rules of :func:`apps.train.training.checkpointing.check_schedule` apply."""
        options = self.options
        loud = self.comm.rank == 0 and not options.quiet

        def load(manager, which):
            self.history.update(self._checkpoints().restore(
                manager, which, steps=options.steps, reschedule=options.reschedule,
                note_fn=print if loud else None))
            return self.runner.state.step

        return control.restore_with(load)

    # ------------------------------------------------------------------ results
    def diagnostics(self) -> dict:
        """Collective: the final evaluation (unless the last step had one), the bubble, the losses."""
        runner = self.runner
        self.evaluate_unless_done()
        master = runner.state.precision.master_params
        identical = replicas_identical(self.grid.data, to_numpy(master))   # same shard on every replica
        self._full = runner.full_parameters()                                # collective (world)
        tensor_allreduces = _tensor_allreduces(runner.parallel_model.model)
        self._volume = communication_report(runner)                           # collective (world)
        return {
            **self.loss_diagnostics(runner.state.precision),
            "pipeline": runner.pipeline_report(),
            "overlap": runner.sync.data_parallel.overlap_stats(),
            "tensor_allreduces": tensor_allreduces,
            "communication": self._volume,
            "replicas_identical": bool(identical),
            "n_params": self.n_params,
            "n_params_per_rank": int(runner.parallel_model.model.n_params),
            "optimizer_state_bytes": self._optimizer_state_bytes(),                # collective (world)
            "parameter_norm": float(np.sqrt(np.dot(self._full, self._full))),
        }

    def checksum(self) -> str:
        """Collective: SHA-256 of the unsplit model's master parameters (one-process layout)."""
        full = getattr(self, "_full", None)
        if full is None:
            full = self.runner.full_parameters()
        master_dtype = to_numpy(self.runner.state.precision.master_params[:0]).dtype
        return hash_arrays([("params", full.astype(master_dtype))])

    def summary_extra(self, simulation) -> dict:
        """The base record, and the communication volume per step (bytes, max over ranks)."""
        extra = super().summary_extra(simulation)
        volume = getattr(self, "_volume", None)   # diagnostics() measured it (collective)
        if volume is not None and (self.grid.tensor_size > 1 or self.grid.pipeline_size > 1):
            extra["communication_per_step"] = {
                key: {"measured": volume[key]["measured"], "computed": volume[key]["computed"]}
                for key in ("tensor", "tensor_payload", "pipeline")}
        return extra

    def more_result_lines(self, diagnostics: dict) -> list[str]:
        """The pipeline bubble, the tensor-parallel allreduce count and the communication volume."""
        lines = []
        state_bytes = diagnostics["optimizer_state_bytes"]
        zero_note = "; ZeRO-1 over the data replicas" if self.runner.sync.zero_stage else ""
        lines.append(f"{'optimiser state':<24} {format_bytes(state_bytes['max'])} per rank (max; min "
                     f"{format_bytes(state_bytes['min'])}){zero_note}")
        volume = diagnostics["communication"]
        if self.grid.tensor_size > 1 or self.grid.pipeline_size > 1:
            lines.append(volume_line(volume["tensor"]["measured"], volume["tensor"]["computed"],
                                     volume["pipeline"]["measured"], volume["pipeline"]["computed"]))
        pipeline = diagnostics["pipeline"]
        if pipeline["stages"] > 1:
            measured = ", ".join(f"{value:.3f}" for value in pipeline["bubble_measured"])
            lines.append(f"{'pipeline bubble':<24} formula (P-1)/(M+P-1) = {pipeline['bubble_formula']:.3f}; "
                         f"measured per stage {measured} ({pipeline['schedule']}, M = {pipeline['micro_batches']}, "
                         f"activations held {pipeline['peak_in_flight']})")
        if self.grid.tensor_size > 1:
            lines.append(f"{'tensor allreduces':<24} {diagnostics['tensor_allreduces']} on this rank "
                         f"(2 per block, step and micro-batch, plus evaluation)")
        return lines


def _tensor_allreduces(model) -> int:
    """Allreduces this rank's tensor group issued (all split layers share one group)."""
    for leaf in model.leaves():
        group = getattr(leaf, "group", None)
        if group is not None:
            return int(group.n_allreduces)
    return 0

"""``apps.train --model residual-mlp`` as a :class:`hpcgpu.simulation.Model`: D x T x P training.

The training itself is :class:`apps.train.parallel_training.ParallelTrainer` (tensor-parallel
blocks, pipeline stages with micro-batches, data-parallel buckets over the replicas); this module
adapts it to the simulation driver, as :class:`apps.train.simulation_model.TrainingModel` does for
the data-parallel models:

* a step is one optimiser step over one global batch: every rank of data replica ``d`` reads
  replica ``d``'s shard of the batch (:class:`~apps.train.loader.ShardedLoader` with
  ``rank=grid.data_rank, n_ranks=grid.data_size``) and calls :meth:`ParallelTrainer.step`;
* evaluation every ``--eval-every`` steps through :meth:`ParallelTrainer.evaluate` (the
  :class:`~apps.train.simulation_model.Evaluation` operation);
* diagnostics: the loss curve, the evaluations, the pipeline bubble (formula (P-1)/(M+P-1) and
  measured per stage), the data-parallel overlap, the tensor-parallel allreduce count, and the
  norm of the full (unsplit) parameters;
* the checksum is the SHA-256 of :meth:`ParallelTrainer.full_parameters` in the unsplit model's
  layout and master dtype, so a 1 x 2 x 1 run and a 1 x 1 x 1 run of the same ``MLPSpec`` compare
  (they agree to rounding, ~1e-16 relative per step, not bitwise: see docs/parallelism.md).

No checkpoints yet: :func:`apps.train.app.check_split_model` refuses ``--checkpoint-every``,
``--restart`` and ``--wall-time-limit`` because the optimiser state of the shards is not gathered.
"""

from __future__ import annotations

import contextlib

import numpy as np

from hpcgpu.app.checksum import hash_arrays
from hpcgpu.errors import ConfigurationError
from hpcgpu.simulation import Model

from ._backend import to_numpy
from .data import shard_bounds
from .distributed import replicas_identical
from .loader import ShardedLoader
from .report import plot_history
from .simulation_model import cpu_thread_limits, launch_bound_note

#: Diagnostics printed in the final table (the summary holds all of them).
TABLE_DIAGNOSTICS = ("final_loss", "test_loss", "test_accuracy", "skipped_steps", "loss_scale",
                     "replicas_identical", "n_params", "parameter_norm")


class ParallelTrainingModel(Model):
    """One D x T x P training run of ``--model residual-mlp``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    options : hpcgpu.app.cli.FrozenOptions
        The resolved options (:func:`apps.train.app.resolve_options`).
    data : apps.train.loader.TrainingData
    grid : apps.train.parallel_grid.ParallelGrid
    runner : apps.train.parallel_training.ParallelTrainer
    """

    unit = "samples/s"
    stop_check_every = 1
    graph_unsupported = "a training step reads its loss and the next batch on the host"

    def __init__(self, comm, arch, options, data, grid, runner):
        self.comm, self.arch, self.options, self.data = comm, arch, options, data
        self.grid, self.runner = grid, runner
        self.name = options.model
        self.updates_per_step = options.batch_size
        self.n_params = int(runner.parallel_model.reference().layout.n_params)
        self.history = {"step": [], "loss": [], "eval_step": [], "test_loss": [], "test_accuracy": []}
        self.loss = None
        self.loader = None
        self._loader_io_seconds = 0.0
        self.x_test = self.y_test = None
        self._limits = contextlib.ExitStack()
        self.threads_note = self._limits.enter_context(cpu_thread_limits(options, comm, arch))

    @property
    def step_index(self) -> int:
        return self.runner.state.step

    # ------------------------------------------------------------------ stepping
    def prepare(self) -> None:
        """Measure the data-parallel allreduce alone (overlap report); start the loader."""
        self.runner.sync.data_parallel.measure_allreduce_alone()
        options, grid = self.options, self.grid
        self.loader = ShardedLoader(self.data.source, options.batch_size, options.seed, grid.data_rank,
                                    grid.data_size, start_step=self.step_index, arch=self.arch)
        if self.data.test is not None:
            self.x_test, self.y_test = self.arch.from_host(self.data.test[0]), self.arch.from_host(self.data.test[1])

    def step(self, timers) -> None:
        batch = self.loader.next()
        metrics = self.runner.step(batch.x, batch.y, batch.sample_index, timers)
        self.loss = metrics.loss
        self.history["step"].append(self.step_index)
        self.history["loss"].append(metrics.loss)

    def settle(self, timers) -> None:
        """Stop the loader; the time the steps waited for it is I/O."""
        self._close_loader()
        timers.add("io", self._loader_io_seconds)

    def _close_loader(self) -> None:
        if self.loader is not None:
            self.loader.close()
            self._loader_io_seconds = self.loader.io_seconds
            self.loader = None

    def evaluate(self) -> None:
        """Collective: loss and accuracy on the test set through the split model."""
        test_loss, accuracy = self.runner.evaluate(self.x_test, self.y_test)
        self.history["eval_step"].append(self.step_index)
        self.history["test_loss"].append(test_loss)
        self.history["test_accuracy"].append(accuracy)

    def finite_arrays(self) -> list:
        return [] if self.loss is None or self.options.precision == "fp16" else [self.loss]

    def nan_message(self, step: int, ranks: list[int]) -> str:
        return (f"the loss became {self.loss} at step {step}; expected a finite value. "
                "Lower --lr, add --clip-norm or use --warmup.")

    def progress_note(self) -> str:
        return f"loss {self.loss:.4f}" if self.loss is not None else ""

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
        lines = [f"data: {self.data.description}", f"backend: {arch.name} ({arch.reason}); {self.threads_note}"]
        note = launch_bound_note(arch.is_gpu, self.n_params, options.backend)
        if note:
            lines.append(note)
        shares = sorted(set(self._replica_shares()))
        lines.append(f"ranks: {comm.size} on {comm.n_nodes} node(s); global batch {options.batch_size} = "
                     f"{grid.data_size} data replica(s) x {'/'.join(str(s) for s in shares)} in "
                     f"{options.micro_batches} micro-batch(es); "
                     f"{len(self.runner.sync.data_parallel.buckets)} allreduce bucket(s) of <= "
                     f"{options.bucket_mb:g} MB over the data replicas")
        lines.extend(self.runner.describe())   # the grid (which axis lies inside a node), the stages
        return lines

    def decomposition(self) -> dict:
        grid, options = self.grid, self.options
        return {"kind": "data x tensor x pipeline", "data": grid.data_size, "tensor": grid.tensor_size,
                "pipeline": grid.pipeline_size, "micro_batches": options.micro_batches,
                "schedule": options.pipeline_schedule, "tensor_inside_node": bool(grid.tensor_inside_node),
                "stage_layers": [list(r) for r in self.runner.parallel_model.stage_ranges],
                "global_batch_size": options.batch_size, "replica_batch_sizes": self._replica_shares(),
                "buckets": len(self.runner.sync.data_parallel.buckets), "bucket_mb": options.bucket_mb}

    # ------------------------------------------------------------------ checkpoint / restart
    def checkpoint_state(self) -> dict:
        # check_split_model refuses every flag that saves one; a stop signal still lands here
        raise ConfigurationError("checkpoints of --model residual-mlp are not supported yet: the optimiser "
                                 "state of the tensor and pipeline shards is not gathered")

    # ------------------------------------------------------------------ results
    def diagnostics(self) -> dict:
        """Collective: the final evaluation (unless the last step had one), the bubble, the losses."""
        history, runner = self.history, self.runner
        if self.x_test is not None and (not history["eval_step"] or history["eval_step"][-1] != self.step_index):
            self.evaluate()
        master = runner.state.precision.master_params
        identical = replicas_identical(self.grid.data, to_numpy(master))   # same shard on every replica
        self._full = runner.full_parameters()                                # collective (world)
        losses = history["loss"]
        scaler = getattr(runner.state.precision, "scaler", None)
        tensor_allreduces = _tensor_allreduces(runner.parallel_model.model)
        return {
            "final_loss": losses[-1] if losses else None,
            "loss_curve": losses,
            "loss_curve_first_step": int(history["step"][0]) if history["step"] else None,
            "test_accuracy": history["test_accuracy"][-1] if history["test_accuracy"] else None,
            "test_loss": history["test_loss"][-1] if history["test_loss"] else None,
            "evaluations": {"step": history["eval_step"], "test_loss": history["test_loss"],
                            "test_accuracy": history["test_accuracy"]},
            "skipped_steps": int(scaler.skipped_steps) if scaler is not None else 0,
            "loss_scale": float(scaler.scale) if scaler is not None else None,
            "pipeline": runner.pipeline_report(),
            "overlap": runner.sync.data_parallel.overlap_stats(),
            "tensor_allreduces": tensor_allreduces,
            "replicas_identical": bool(identical),
            "n_params": self.n_params,
            "n_params_per_rank": int(runner.parallel_model.model.n_params),
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
        options = self.options
        return {"model": options.model, "n_params": self.n_params, "precision": options.precision,
                "data": self.data.description, "optimizer": options.optimizer}

    def throughput_line(self, steps: int, wall: float, throughput: float, n_ranks: int) -> str:
        return f"{steps} steps in {wall:.3f} s: {throughput:,.1f} samples/s ({throughput / n_ranks:,.1f} per rank)"

    def result_lines(self, diagnostics: dict) -> list[str]:
        lines = []
        for key in TABLE_DIAGNOSTICS:
            value = diagnostics[key]
            lines.append(f"{key:<24} {f'{value:.6g}' if isinstance(value, float) else value}")
        pipeline = diagnostics["pipeline"]
        if pipeline["stages"] > 1:
            measured = ", ".join(f"{value:.3f}" for value in pipeline["bubble_measured"])
            lines.append(f"{'pipeline bubble':<24} formula (P-1)/(M+P-1) = {pipeline['bubble_formula']:.3f}; "
                         f"measured per stage {measured} ({pipeline['schedule']}, M = {pipeline['micro_batches']}, "
                         f"activations held {pipeline['peak_in_flight']})")
        if self.grid.tensor_size > 1:
            lines.append(f"{'tensor allreduces':<24} {diagnostics['tensor_allreduces']} on this rank "
                         f"(2 per block, step and micro-batch, plus evaluation)")
        overlap = diagnostics["overlap"]
        if overlap.get("hidden_fraction") is not None:
            lines.append(f"{'allreduce hidden':<24} {100 * overlap['hidden_fraction']:.1f}% "
                         f"(alone {overlap['allreduce_alone_ms']:.3f} ms/step, exposed "
                         f"{overlap['exposed_wait_ms']:.3f} ms/step, backward {overlap['backward_ms']:.3f} ms/step)")
        return lines

    def finish(self, output, summary: dict, plot: bool = True) -> None:
        """Rank 0: the loss curve ``OUTPUT/loss_curve.png``."""
        if self.comm.rank == 0 and plot:
            plot_history(self.history, output / "loss_curve.png", title=f"apps.train {self.options.model}")

    def close(self) -> None:
        """Stop the loader and lift the BLAS thread limit (idempotent)."""
        self._close_loader()
        self._limits.close()


def _tensor_allreduces(model) -> int:
    """Allreduces this rank's tensor group issued (all split layers share one group)."""
    for leaf in model.leaves():
        group = getattr(leaf, "group", None)
        if group is not None:
            return int(group.n_allreduces)
    return 0

"""``apps.train`` as a :class:`hpcgpu.simulation.Model`: data-parallel training steps and evaluations.

The training itself stays in :mod:`apps.train.trainer` (``train_step``), :mod:`apps.train.distributed`
(gradient buckets, ZeRO) and :mod:`apps.train.loader` (prefetched shards); this module adapts it to
the simulation driver: :class:`TrainingModel` (a step is one optimiser step over one global batch;
checkpoints hold the replicated training state; the checksum covers the master weights) and
:class:`Evaluation` (the test set every ``--eval-every`` steps).
"""

from __future__ import annotations

import contextlib

import hpcgpu
from hpcgpu.app.checksum import hash_arrays
from hpcgpu.simulation import Model, Operation

from ._backend import to_numpy
from .checkpointing import restore_training_checkpoint, training_checkpoint_payload
from .data import shard_bounds
from .distributed import evaluate_distributed, replicas_identical
from .loader import ShardedLoader
from .report import plot_history
from .trainer import train_step

#: Below this many parameters a GPU step is bound by kernel launches (docs/train.md: the MNIST-1D
#: models run at 1.9-3 ms per step on an H200, 3-5x slower than on two CPU cores).
LAUNCH_BOUND_PARAMETERS = 1_000_000

#: Diagnostics printed in the final table (the summary holds all of them).
TABLE_DIAGNOSTICS = ("final_loss", "test_loss", "test_accuracy", "skipped_steps", "loss_scale",
                     "replicas_identical", "n_params")


def launch_bound_note(is_gpu, n_params, backend_option):
    """A hint for a small model that the GPU was picked for automatically, else ``None``."""
    if is_gpu and n_params < LAUNCH_BOUND_PARAMETERS and backend_option == "auto":
        return (f"note: {n_params:,} parameters is too few to keep a GPU busy (each step is a few dozen "
                "tiny kernel launches); --backend numpy runs this model faster")
    return None


@contextlib.contextmanager
def cpu_thread_limits(options, comm, arch):
    """CPU: cap BLAS threads per rank (small matmuls are 4-30x slower multithreaded on 2 cores).

    Yields the note for the header (what was capped).
    """
    if arch.is_gpu:
        yield "GPU"
        return
    threads = options.blas_threads
    if threads == 0:
        threads = 1 if options.model in ("mlp", "cnn") else hpcgpu.arch.cpu_threads_per_rank(comm)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield f"not capped (pip install threadpoolctl, or set OPENBLAS_NUM_THREADS={threads})"
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield f"{threads} BLAS thread(s) per rank"


class TrainingModel(Model):
    """One data-parallel training run.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    options : hpcgpu.app.cli.FrozenOptions
        The resolved options (:func:`apps.train.app.resolve_options`).
    data : apps.train.loader.TrainingData
    trainer : apps.train.trainer.Trainer
    sync : apps.train.distributed.DataParallel or apps.train.zero.ZeroRedundancy
    state : apps.train.trainer.TrainState
    """

    unit = "samples/s"
    stop_check_every = 1   # training steps are long: the ranks agree on stopping after every step
    graph_unsupported = "a training step reads its loss and the next batch on the host"

    def __init__(self, comm, arch, options, data, trainer, sync, state):
        self.comm, self.arch, self.options, self.data = comm, arch, options, data
        self.trainer, self.sync, self.state = trainer, sync, state
        self.name = options.model
        self.updates_per_step = options.batch_size
        self.history = {"step": [], "loss": [], "eval_step": [], "test_loss": [], "test_accuracy": []}
        self.loss = None
        self.loader = None
        self.x_test = self.y_test = None
        self._limits = contextlib.ExitStack()
        self.threads_note = self._limits.enter_context(cpu_thread_limits(options, comm, arch))

    @property
    def step_index(self) -> int:
        return self.state.step

    # ------------------------------------------------------------------ stepping
    def prepare(self) -> None:
        """Measure the bucketed allreduce alone (for the overlap report); start the prefetching loader."""
        self.sync.measure_allreduce_alone()
        options = self.options
        self.loader = ShardedLoader(self.data.source, options.batch_size, options.seed, self.comm.rank,
                                    self.comm.size, start_step=self.state.step, arch=self.arch)
        if self.data.test is not None:
            self.x_test, self.y_test = self.arch.from_host(self.data.test[0]), self.arch.from_host(self.data.test[1])

    def step(self, timers) -> None:
        batch = self.loader.next()
        metrics = train_step(self.trainer, self.state, batch.x, batch.y, batch.sample_index, self.sync, timers)
        self.loss = metrics.loss
        self.history["step"].append(self.state.step)
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
        """Collective: loss and accuracy on the test set, appended to the history."""
        test_loss, accuracy = evaluate_distributed(self.trainer, self.state, self.x_test, self.y_test, self.comm)
        self.history["eval_step"].append(self.state.step)
        self.history["test_loss"].append(test_loss)
        self.history["test_accuracy"].append(accuracy)

    def finite_arrays(self) -> list:
        # fp16: a non-finite loss is an overflow the loss scaler handles (the step is skipped).
        return [] if self.loss is None or self.options.precision == "fp16" else [self.loss]

    def nan_message(self, step: int, ranks: list[int]) -> str:
        return (f"the loss became {self.loss} at step {step}; expected a finite value. "
                "Lower --lr, add --clip-norm or use --warmup.")

    def progress_note(self) -> str:
        return f"loss {self.loss:.4f}" if self.loss is not None else ""

    # ------------------------------------------------------------------ description
    def describe(self) -> str:
        options = self.options
        return (f"{options.model}, {self.trainer.model.n_params:,} parameters, {options.precision}, "
                f"{options.optimizer} lr {options.lr:g}" + (", recompute" if options.recompute else ""))

    def header_lines(self, comm, arch) -> list[str]:
        options = self.options
        shares = sorted({hi - lo for lo, hi in (shard_bounds(options.batch_size, r, comm.size)
                                               for r in range(comm.size))})
        sync_text = ("ZeRO-1 (optimiser state sharded, reduce-scatter + all-gather)" if options.zero
                     else f"{len(self.sync.buckets)} allreduce bucket(s) of <= {options.bucket_mb:g} MB"
                     + (" (copy engines, CUDA IPC)" if options.allreduce == "peer" else ""))
        lines = [f"data: {self.data.description}", f"backend: {arch.name} ({arch.reason}); {self.threads_note}"]
        note = launch_bound_note(arch.is_gpu, self.trainer.model.n_params, options.backend)
        if note:
            lines.append(note)
        lines.append(f"ranks: {comm.size} on {comm.n_nodes} node(s); data parallel: global batch {options.batch_size} "
                     f"= {comm.size} x {'/'.join(str(s) for s in shares)} (accumulation {options.accum_steps}); "
                     f"{sync_text}")
        return lines

    def decomposition(self) -> dict:
        options, sync = self.options, self.sync
        shares = [hi - lo for lo, hi in (shard_bounds(options.batch_size, r, self.comm.size)
                                         for r in range(self.comm.size))]
        return {"kind": "data-parallel", "replicas": self.comm.size, "global_batch_size": options.batch_size,
                "local_batch_sizes": shares, "accum_steps": options.accum_steps, "zero_stage": options.zero,
                "buckets": len(sync.buckets), "bucket_mb": options.bucket_mb if options.zero == 0 else None,
                "allreduce": options.allreduce if options.zero == 0 else None}

    # ------------------------------------------------------------------ checkpoint / restart
    def checkpoint_state(self) -> dict:
        return training_checkpoint_payload(self.trainer, self.state, self.sync, self.history, self.options.model)

    def load_checkpoint(self, control) -> int | None:
        """Collective: load ``--restart`` into the training state; the schedule rules of
        :func:`apps.train.checkpointing.check_schedule` apply."""
        options = self.options
        loud = self.comm.rank == 0 and not options.quiet

        def load(manager, which):
            self.history.update(restore_training_checkpoint(
                manager, which, self.trainer, self.state, self.sync, options.model, steps=options.steps,
                reschedule=options.reschedule, note_fn=print if loud else None))
            return self.state.step

        return control.restore_with(load)

    # ------------------------------------------------------------------ results
    def diagnostics(self) -> dict:
        """Collective: the final evaluation (unless the last step had one), the replica check, the losses."""
        history = self.history
        if self.x_test is not None and (not history["eval_step"] or history["eval_step"][-1] != self.state.step):
            self.evaluate()
        identical = replicas_identical(self.comm, to_numpy(self.state.precision.master_params))
        losses = history["loss"]
        scaler = getattr(self.state.precision, "scaler", None)
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
            "overlap": self.sync.overlap_stats(),
            "replicas_identical": bool(identical),
            "n_params": int(self.trainer.model.n_params),
        }

    def checksum(self) -> str:
        """Collective: the master weights (identical on every rank)."""
        params = to_numpy(self.state.precision.master_params)
        return self.comm.broadcast(hash_arrays([("params", params)]) if self.comm.rank == 0 else None, root=0)

    def summary_extra(self, simulation) -> dict:
        options = self.options
        return {"model": options.model, "n_params": self.trainer.model.n_params, "precision": options.precision,
                "data": self.data.description, "optimizer": options.optimizer}

    def throughput_line(self, steps: int, wall: float, throughput: float, n_ranks: int) -> str:
        return f"{steps} steps in {wall:.3f} s: {throughput:,.1f} samples/s ({throughput / n_ranks:,.1f} per rank)"

    def result_lines(self, diagnostics: dict) -> list[str]:
        lines = []
        for key in TABLE_DIAGNOSTICS:
            value = diagnostics[key]
            lines.append(f"{key:<24} {f'{value:.6g}' if isinstance(value, float) else value}")
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


class Evaluation(Operation):
    """Evaluate on the test set when the trigger fires (``--eval-every``; the final evaluation is part of
    the diagnostics)."""

    def __init__(self, model: TrainingModel, trigger):
        super().__init__(trigger)
        self.model = model

    def act(self, simulation) -> None:
        self.model.evaluate()

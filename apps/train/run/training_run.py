"""What every ``apps.train`` model shares as a :class:`hpcgpu.simulation.Model`.

:class:`TrainingRun` holds the parts that do not depend on how the model is split: the loader of this
rank's shard of each global batch, the loss history and evaluations, the NaN check of the loss, the
final table, the loss-curve plot and the BLAS thread cap. :class:`apps.train.run.simulation_model.TrainingModel`
(data parallel) and :class:`apps.train.run.parallel_model.ParallelTrainingModel` (data x tensor x pipeline)
add their step, checkpoint, checksum and diagnostics.
"""

from __future__ import annotations

import contextlib

import hpcgpu
from hpcgpu.simulation import Model

from apps.train.data.loader import ShardedLoader
from .report import plot_history

#: Below this many parameters a GPU step is bound by kernel launches (docs/train.md: the MNIST-1D
#: models run at 1.9-3 ms per step on an H200, 3-5x slower than on two CPU cores).
LAUNCH_BOUND_PARAMETERS = 1_000_000


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


class TrainingRun(Model):
    """Base class of the training models: loader, loss history, evaluations, table, plot.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    options : hpcgpu.app.cli.FrozenOptions
        The resolved options (:func:`apps.train.app.resolve_options`).
    data : apps.train.data.loader.TrainingData
    n_params : int
        Parameters of the whole (unsplit) model.

    Subclasses set ``step_index`` and implement ``step`` (reading :meth:`next_batch`, then
    :meth:`record_loss`), ``evaluate`` (through :meth:`record_evaluation`) and the rest of the
    :class:`~hpcgpu.simulation.Model` interface.
    """

    unit = "samples/s"
    stop_check_every = 1   # training steps are long: the ranks agree on stopping after every step
    graph_unsupported = "a training step reads its loss and the next batch on the host"
    #: Diagnostics printed in the final table (the summary holds all of them).
    table_diagnostics = ("final_loss", "test_loss", "test_accuracy", "skipped_steps", "loss_scale",
                         "replicas_identical", "n_params")

    def __init__(self, comm, arch, options, data, n_params: int):
        self.comm, self.arch, self.options, self.data = comm, arch, options, data
        self.name = options.model
        self.n_params = int(n_params)
        self.updates_per_step = options.batch_size
        self.history = {"step": [], "loss": [], "eval_step": [], "test_loss": [], "test_accuracy": []}
        self.loss = None
        self.loader = None
        self._loader_io_seconds = 0.0
        self.x_test = self.y_test = None
        self._limits = contextlib.ExitStack()
        self.threads_note = self._limits.enter_context(cpu_thread_limits(options, comm, arch))

    # ------------------------------------------------------------------ data and history
    def start_loader(self, rank: int, n_ranks: int) -> None:
        """Start the prefetching loader of shard ``rank`` of ``n_ranks``; put the test set on the device."""
        options = self.options
        self.loader = ShardedLoader(self.data.source, options.batch_size, options.seed, rank, n_ranks,
                                    start_step=self.step_index, arch=self.arch)
        if self.data.test is not None:
            self.x_test, self.y_test = self.arch.from_host(self.data.test[0]), self.arch.from_host(self.data.test[1])

    def record_loss(self, loss: float) -> None:
        """Keep the loss of the step just taken (``step_index`` already advanced)."""
        self.loss = loss
        self.history["step"].append(self.step_index)
        self.history["loss"].append(loss)

    def record_evaluation(self, test_loss: float, accuracy: float) -> None:
        self.history["eval_step"].append(self.step_index)
        self.history["test_loss"].append(test_loss)
        self.history["test_accuracy"].append(accuracy)

    def evaluate_unless_done(self) -> None:
        """Collective: the final evaluation, unless the last step had one."""
        history = self.history
        if self.x_test is not None and (not history["eval_step"] or history["eval_step"][-1] != self.step_index):
            self.evaluate()

    def loss_diagnostics(self, precision_state) -> dict:
        """The losses, evaluations and loss-scaler counters (``precision_state``: the training state's
        ``precision``)."""
        history, losses = self.history, self.history["loss"]
        scaler = getattr(precision_state, "scaler", None)
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
        }

    def settle(self, timers) -> None:
        """Stop the loader; the time the steps waited for it is I/O."""
        self._close_loader()
        timers.add("io", self._loader_io_seconds)

    def _close_loader(self) -> None:
        if self.loader is not None:
            self.loader.close()
            self._loader_io_seconds = self.loader.io_seconds
            self.loader = None

    # ------------------------------------------------------------------ the NaN check, progress, header
    def finite_arrays(self) -> list:
        # fp16: a non-finite loss is an overflow the loss scaler handles (the step is skipped).
        return [] if self.loss is None or self.options.precision == "fp16" else [self.loss]

    def nan_message(self, step: int, ranks: list[int]) -> str:
        return (f"the loss became {self.loss} at step {step}; expected a finite value. "
                "Lower --lr, add --clip-norm or use --warmup.")

    def progress_note(self) -> str:
        return f"loss {self.loss:.4f}" if self.loss is not None else ""

    def first_header_lines(self, arch) -> list[str]:
        """The data, the backend with the thread cap and, for a small model on a GPU, the launch-bound note."""
        lines = [f"data: {self.data.description}", f"backend: {arch.name} ({arch.reason}); {self.threads_note}"]
        note = launch_bound_note(arch.is_gpu, self.n_params, self.options.backend)
        return lines + ([note] if note else [])

    # ------------------------------------------------------------------ results
    def summary_extra(self, simulation) -> dict:
        options = self.options
        return {"model": options.model, "n_params": self.n_params, "precision": options.precision,
                "data": self.data.description, "optimizer": options.optimizer}

    def throughput_line(self, steps: int, wall: float, throughput: float, n_ranks: int) -> str:
        return f"{steps} steps in {wall:.3f} s: {throughput:,.1f} samples/s ({throughput / n_ranks:,.1f} per rank)"

    def result_lines(self, diagnostics: dict) -> list[str]:
        lines = [f"{key:<24} {f'{value:.6g}' if isinstance(value, float) else value}"
                 for key, value in ((key, diagnostics[key]) for key in self.table_diagnostics)]
        lines += self.more_result_lines(diagnostics)
        overlap = diagnostics["overlap"]
        if overlap.get("hidden_fraction") is not None:
            lines.append(f"{'allreduce hidden':<24} {100 * overlap['hidden_fraction']:.1f}% "
                         f"(alone {overlap['allreduce_alone_ms']:.3f} ms/step, exposed "
                         f"{overlap['exposed_wait_ms']:.3f} ms/step, backward {overlap['backward_ms']:.3f} ms/step)")
        return lines

    def more_result_lines(self, diagnostics: dict) -> list[str]:
        """Lines between the table and the overlap line (default: none)."""
        return []

    def finish(self, output, summary: dict, plot: bool = True) -> None:
        """Rank 0: the loss curve ``OUTPUT/loss_curve.png``."""
        if self.comm.rank == 0 and plot:
            plot_history(self.history, output / "loss_curve.png", title=f"apps.train {self.options.model}")

    def close(self) -> None:
        """Stop the loader and lift the BLAS thread limit (idempotent)."""
        self._close_loader()
        self._limits.close()

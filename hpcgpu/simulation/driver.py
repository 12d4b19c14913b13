"""The simulation driver: one run loop for every app.

An app builds a :class:`~hpcgpu.simulation.model.Model` and hands it to :class:`Simulation` with its
operations; the driver does the rest the same way for every model (``docs/architecture.md``)::

    with nccl_channel_limit(options.nccl_channels):      # NCCL_MAX_NCHANNELS for this run only
        arch = hpcgpu.arch.auto(comm, backend=options.backend)
        model = MyModel(comm, arch, config)
        output = prepare_output(comm, arch, options)
        summary = Simulation(comm, arch, model, options, app="apps.mine", output=output).run()
"""

from __future__ import annotations

import contextlib
import os
import time

import hpcgpu
from hpcgpu.app.checkpointing import RunControl
from hpcgpu.app.environment import files_written
from hpcgpu.app.graph import StepGraph
from hpcgpu.app.plausibility import check_throughput
from hpcgpu.app.progress import Progress, steps_text
from hpcgpu.app.summary import make_summary, write_json
from hpcgpu.app.timers import PhaseTimers, format_timers
from hpcgpu.errors import ConfigurationError
from hpcgpu.monitor import GpuMonitor
from hpcgpu.simulation.operations import Checkpoint, ModelOutput, NanCheck, ProgressReport, check_finite
from hpcgpu.transport.selection import select_transport, transport_choice

#: Steps per CUDA graph: two, so that ping-pong buffers are back in place after each replay.
GRAPH_STEPS = 2


@contextlib.contextmanager
def nccl_channel_limit(n_channels: int):
    """Set ``NCCL_MAX_NCHANNELS`` to ``n_channels`` for the block, then restore the environment.

    NCCL reads the variable when a communicator is created (the first exchange or collective), so
    the block must hold the creation of the model and its run. 0 keeps NCCL's default; a value the
    user already exported wins (nothing is changed).
    """
    if not n_channels or "NCCL_MAX_NCHANNELS" in os.environ:
        yield
        return
    os.environ["NCCL_MAX_NCHANNELS"] = str(int(n_channels))
    try:
        yield
    finally:
        os.environ.pop("NCCL_MAX_NCHANNELS", None)


def setup_architecture(comm, options):
    """Collective: the job's architecture and transport, chosen once, before any data moves.

    ``hpcgpu.arch.auto`` with ``--backend`` and ``--bind-cpus``, then
    :func:`hpcgpu.transport.selection.select_transport` with ``--transport`` (``auto``: the
    ``HPCGPU_TRANSPORT`` environment variable, else the first usable). Every app calls this instead of
    ``arch.auto``, so halos, particle ghosts and device collectives all use the one transport the header
    and the summary name.

    Returns
    -------
    hpcgpu.arch.CPU or hpcgpu.arch.GPU
    """
    arch = hpcgpu.arch.auto(comm, backend=options.backend, bind_cpus=options.bind_cpus)
    requested = getattr(options, "transport", "auto")
    select_transport(comm, arch, None if requested in (None, "auto") else requested)
    return arch


def use_graphs(graph: bool | None, arch, model) -> bool:
    """Whether the driver replays the model's steps as CUDA graphs.

    Parameters
    ----------
    graph : bool or None
        True (``--graph``): on, refused for a model that can never be captured; False
        (``--no-graph``): eager; None (default): on where the model can be captured.
    arch : hpcgpu.arch.CPU or GPU
        On a CPU there are no graphs (always False).
    model : Model
        ``model.graph_unsupported`` says why it can never be captured (None: it can).

    Raises
    ------
    ConfigurationError
        ``graph`` is True on a GPU for a model that cannot be captured (the same on every rank).
    """
    if not arch.is_gpu or graph is False:
        return False
    if graph and model.graph_unsupported is not None:
        raise ConfigurationError(f"--graph does not apply to {model.name}: {model.graph_unsupported}. "
                                 "Run without --graph.")
    return model.graph_unsupported is None


class Simulation:
    """Runs a model: restart, timed loop with operations, checks and the summary.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or GPU
    model : hpcgpu.simulation.Model
    options : argparse.Namespace
        The common flags (``docs/app-contract.md``): ``quiet``, ``summary``, the checkpoint flags and
        ``--monitor``.
    app : str
        ``"apps.stencil"``: the header's first word, the summary's ``app``, the checkpoints' owner.
    output : pathlib.Path
        The output directory (from :func:`hpcgpu.app.environment.prepare_output`).
    final_step : int, optional
        The absolute step to end at (default ``model.default_steps``).
    operations : sequence of Operation
        The app's own operations, run in order after the model's output and before the progress line.
    nan_check : Trigger or None
        When the driver checks the state for NaN/Inf (None: never; the final state is always checked).
    graph : bool or None
        CUDA graph replay: True on, False (default) eager, None where the model can be captured (see
        :func:`use_graphs`).
    fingerprint : dict, optional
        The options that define the run, for the checkpoints' identity (default: all of ``options``
        except the restart-independent ones).
    progress_note_fn : callable
        ``note_fn(simulation) -> str`` for the progress line (default: ``model.progress_note()``).
    plot : bool
        Passed to :meth:`Model.finish` (``--no-plot`` gives False).
    """

    def __init__(self, comm, arch, model, options, *, app: str, output, final_step: int | None = None,
                 operations=(), nan_check=None, graph: bool | None = False, fingerprint: dict | None = None,
                 progress_note_fn=None, plot: bool = True):
        self.comm, self.arch, self.model, self.options = comm, arch, model, options
        self.app, self.output, self.plot = app, output, plot
        self.final_step = model.default_steps if final_step is None else final_step
        self.graph_requested = graph
        self.fingerprint = fingerprint
        progress = ProgressReport() if progress_note_fn is None else ProgressReport(progress_note_fn)
        self.operations = ([NanCheck(nan_check)] if nan_check is not None else []) + \
            [ModelOutput(), *operations, progress, Checkpoint()]
        self.loud = comm.rank == 0 and not options.quiet
        self.timers = PhaseTimers(arch)
        self.control = self.progress = self.graph = None
        self.restarted = False
        self.first_step = 0

    # ------------------------------------------------------------------ pieces the operations use
    def check_finite(self) -> None:
        """Collective: the NaN check (:func:`hpcgpu.simulation.operations.check_finite`)."""
        check_finite(self.comm, self.arch, self.model)

    def _print(self, text: str = "", flush: bool = False) -> None:
        if self.loud:
            print(text, flush=flush)

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        """Run the model to ``final_step``; returns the summary record (on every rank).

        The order, on every rank::

            header -> restart (--restart latest|PATH, any rank count) -> "steps:" line
            operations' begin (initial output) -> model.prepare() -> barrier; the clock starts
            repeat until final_step:
                step (eager, or CUDA graph replay of 2 steps where the model is capturable)
                -> NaN check (its trigger) -> model.after_step (output) -> app operations
                -> progress -> checkpoint every --checkpoint-every steps; on SIGTERM/SIGUSR1 or
                   near the wall-time limit: final checkpoint, exit 75 (requeue)
            final checkpoint (with --checkpoint-every) -> model.settle() -> the clock stops
            monitor -> NaN check -> diagnostics -> checksum -> plausibility -> summary
            -> model.finish (files, plots) -> operations' end -> table, JSON summary (rank 0)
        """
        comm, arch, model, options = self.comm, self.arch, self.model, self.options
        model.set_final_step(self.final_step)
        monitor = None
        try:
            monitor = GpuMonitor.from_options(comm, arch, options)  # --monitor: NVML sampling thread
            self._print(f"{self.app} {hpcgpu.__version__}: {model.describe()}")
            for line in model.header_lines(comm, arch):
                self._print(line)
            self._print(f"transport: {transport_choice(comm, arch).describe()}")
            if self.graph_requested and not arch.is_gpu:
                self._print("note: --graph has no effect on the CPU")
            graphs = use_graphs(self.graph_requested, arch, model)
            self.control = RunControl(comm, options, app=self.app, output=self.output, quiet=options.quiet,
                                      stop_check_every=model.stop_check_every, config=self.fingerprint)
            self.restarted = model.load_checkpoint(self.control) is not None
            self.first_step = model.step_index   # 0, or the checkpoint's step
            self._print(f"steps: {steps_text(self.first_step, self.final_step)}", flush=True)
            self.progress = Progress(comm, self.final_step, enabled=not options.quiet, first=self.first_step)
            wall = self._timed_loop(graphs)
        except BaseException:   # an error, or SystemExit(75) after a stop request's checkpoint
            if monitor is not None:
                monitor.stop()
            model.close()
            raise
        finally:
            if self.control is not None:
                self.control.close()   # after an error too: no writer thread or signal handler left
        try:
            monitor_extra = monitor.finish(comm)  # collective; {} without --monitor
            return self._report(wall, monitor, monitor_extra)
        finally:
            model.close()

    def _timed_loop(self, graphs: bool) -> float:
        comm, arch, model, timers = self.comm, self.arch, self.model, self.timers
        for operation in self.operations:
            operation.begin(self)
        model.prepare()   # compile kernels, make connections: outside the timed loop
        comm.barrier()
        arch.synchronize()
        timers.reset()    # initial output and set-up are not phases of the timed loop
        started = time.perf_counter()
        final = self.final_step
        while model.step_index < final:
            self._advance(graphs)
            step = model.step_index
            for operation in self.operations:
                if operation.trigger(step, final):
                    operation.act(self)
        finishing = time.perf_counter()
        self.control.finish(model.step_index, model.checkpoint_state)   # the end of a run is a checkpoint too
        timers.add("io", time.perf_counter() - finishing)
        model.settle(timers)
        arch.synchronize()
        return time.perf_counter() - started

    def _advance(self, graphs: bool) -> None:
        """One step, or GRAPH_STEPS replayed as a CUDA graph where nothing in them needs the host."""
        model, timers = self.model, self.timers
        if (self.graph is None and graphs and model.step_index >= GRAPH_STEPS
                and model.capturable(GRAPH_STEPS)):
            self.graph = StepGraph(self.arch, model, GRAPH_STEPS)
        with timers.range(f"step {model.step_index + 1}"):
            if (self.graph is not None and model.step_index + GRAPH_STEPS <= self.final_step
                    and model.capturable(GRAPH_STEPS) and not self.control.wants_save(model.step_index + 1)
                    and self.window_is_clear(GRAPH_STEPS)):
                self.graph.launch(timers)
            else:
                model.step(timers)

    def window_is_clear(self, n_steps: int) -> bool:
        """True when no operation with :attr:`~Operation.exact_steps` fires strictly inside the next
        ``n_steps`` steps, so they may be replayed as one graph (the loop sees only the last of them).
        A NaN check every 25 steps then still runs at step 25, not only at 50."""
        step, final = self.model.step_index, self.final_step
        return not any(operation.exact_steps and operation.trigger(step + k, final)
                       for operation in self.operations for k in range(1, n_steps))

    def _report(self, wall: float, monitor, monitor_extra: dict) -> dict:
        comm, arch, model = self.comm, self.arch, self.model
        self.check_finite()
        diagnostics = model.diagnostics()
        checksum = model.checksum()
        timer_summary = self.timers.summary(comm, wall)
        done = model.step_index - self.first_step   # the steps this job ran
        throughput = model.updates_per_step * done / wall if wall > 0 else 0.0
        # Collective; raises if the rate beats the GPU's copy bandwidth (the steps did not do their work).
        plausibility = check_throughput(comm, arch, throughput, model.unit, model.min_bytes_per_update)
        transport = transport_choice(comm, arch)
        summary = make_summary(
            app=self.app, backend=arch.name, comm=comm, decomposition=model.decomposition(),
            steps=done, wall_seconds=wall, throughput=throughput, unit=model.unit, timers=timer_summary,
            diagnostics=diagnostics, checksum=checksum,
            extra={"first_step": self.first_step, "final_step": model.step_index,
                   "transport": transport.name, "transport_source": transport.source, **model.summary_extra(self),
                   **plausibility, **monitor_extra},
        )
        model.finish(self.output, summary, plot=self.plot)
        for operation in self.operations:
            operation.end(self)
        if self.loud:
            print()
            print(model.throughput_line(done, wall, throughput, comm.size))
            print(format_timers(timer_summary, wall))
            monitor.print_table()
            for line in model.result_lines(diagnostics):
                print(line)
            print(f"checksum {checksum}", flush=True)
        if comm.rank == 0 and self.options.summary:
            write_json(self.options.summary, summary)
        if self.loud:
            for line in model.closing_lines():
                print(line)
            saved = self.control.last_saved_step is not None and self.control.last_saved_step > self.first_step
            for line in files_written(self.output, self.options.summary, self.control.manager.directory, saved):
                print(line)
        return summary

    @property
    def graph_used(self) -> bool:
        """True when steps were replayed as CUDA graphs."""
        return self.graph is not None

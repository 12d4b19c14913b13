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
from hpcgpu.app.checkpointing import RESTART_INDEPENDENT_OPTIONS, RunControl
from hpcgpu.app.environment import files_written, write_environment
from hpcgpu.app.graph import StepGraph
from hpcgpu.app.plausibility import check_throughput
from hpcgpu.app.progress import Progress, steps_text
from hpcgpu.app.summary import make_summary, write_json
from hpcgpu.app.timers import PhaseTimers, format_timers
from hpcgpu.checkpoint import EXIT_REQUEUE
from hpcgpu.errors import ConfigurationError
from hpcgpu.health.run_health import RunHealth
from hpcgpu.observe.monitor import GpuMonitor
from hpcgpu.runtime.fault_injection import maybe_fail
from hpcgpu.simulation.operations import Checkpoint, ModelOutput, NanCheck, ProgressReport, check_finite
from hpcgpu.transport.selection import select_transport, transport_choice

#: The shortest CUDA graph the driver replays, in steps; every graph length is even, so that ping-pong
#: buffers are back in place after each replay. Before step 2 the steps run eagerly (the first halo
#: exchange connects the peers and compiles its kernels outside any capture).
MIN_GRAPH_STEPS = 2

#: The longest CUDA graph, in steps. Graphs are powers of two from :data:`MIN_GRAPH_STEPS` up to this,
#: each captured the first time a window of its length comes up (inside the timed loop: a capture costs
#: about what running its steps eagerly costs): at most 5 graphs of together at most 62 steps of nodes.
#: Longer graphs would save little: a NaN check every 100 steps is 32 + 32 + 32 + 4 steps, 4 launches,
#: where graphs up to 64 steps would need 3 launches but 102 captured steps instead of 38. A stop
#: request (signal, wall-time limit) waits at most one graph.
MAX_GRAPH_STEPS = 32


def graph_window(step: int, horizon: int, capturable_fn, longest: int = MAX_GRAPH_STEPS) -> int:
    """The number of steps to replay as one CUDA graph from ``step``; 0: the next step runs eagerly.

    The longest power of two from :data:`MIN_GRAPH_STEPS` up to ``longest`` steps that ends no later than
    ``horizon`` (the next step at which the host has work: an operation that must see that step, a
    checkpoint, the final step) and that ``capturable_fn(n_steps)`` (:meth:`Model.capturable`) allows.
    A horizon 98 steps ahead, for instance, is reached in windows of 32, 32, 32 and 2 steps.
    """
    room = horizon - step
    n_steps = MIN_GRAPH_STEPS
    while n_steps * 2 <= longest:
        n_steps *= 2
    while n_steps >= MIN_GRAPH_STEPS:
        if n_steps <= room and capturable_fn(n_steps):
            return n_steps
        n_steps //= 2
    return 0


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


#: Transports whose halo messages a CUDA graph can hold: NCCL's calls are stream operations. ``mpi-cuda``
#: and ``mpi-staged`` synchronise the stream and call MPI on the host, which a graph would not replay: a
#: captured step would skip its messages (stale ghosts) or the capture fails.
CAPTURABLE_TRANSPORTS = ("nccl",)


def graph_blocker(arch, model, transport: str | None = None, n_ranks: int = 1) -> str | None:
    """Why the model's steps can never be replayed as CUDA graphs in this job, or None.

    ``model.graph_unsupported``, else, on several ranks of a GPU job whose steps exchange through the
    job's transport (:attr:`Model.steps_use_job_transport`), a ``transport`` outside
    :data:`CAPTURABLE_TRANSPORTS`. The same on every rank: the transport is agreed by all ranks.
    """
    if model.graph_unsupported is not None:
        return model.graph_unsupported
    if arch.is_gpu and n_ranks > 1 and model.steps_use_job_transport and transport is not None \
            and transport not in CAPTURABLE_TRANSPORTS:
        return (f"its halo exchanges between ranks go through the {transport} transport (MPI called on the host), "
                "which a CUDA graph cannot hold; graphs need the nccl transport")
    return None


def use_graphs(graph: bool | None, arch, model, transport: str | None = None, n_ranks: int = 1) -> bool:
    """Whether the driver replays the model's steps as CUDA graphs.

    Parameters
    ----------
    graph : bool or None
        True (``--graph``): on, refused where the steps can never be captured (:func:`graph_blocker`);
        False (``--no-graph``): eager; None (default): on where they can be captured.
    arch : hpcgpu.arch.CPU or GPU
        On a CPU there are no graphs (always False).
    model : Model
        ``model.graph_unsupported`` says why it can never be captured (None: it can).
    transport : str or None
        The job's transport name (``transport_choice(comm, arch).name``); None: not known (not checked).
    n_ranks : int
        Ranks of the job: one rank exchanges nothing between ranks.

    Raises
    ------
    ConfigurationError
        ``graph`` is True on a GPU where the steps cannot be captured (the same on every rank).
    """
    if not arch.is_gpu or graph is False:
        return False
    blocker = graph_blocker(arch, model, transport, n_ranks)
    if graph and blocker is not None:
        raise ConfigurationError(f"--graph does not apply to {model.name}: {blocker}. Run without --graph.")
    return blocker is None


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
        except the restart-independent ones: the common ones and the model's
        :attr:`~hpcgpu.simulation.Model.restart_independent_options`).
    progress_note_fn : callable
        ``note_fn(simulation) -> str`` for the progress line (default: ``model.progress_note()``).
    plot : bool
        Passed to :meth:`Model.finish` (``--no-plot`` gives False).
    """

    #: What captures ``n_steps`` steps: ``graph_class(arch, model, n_steps)`` with ``launch(timers)``.
    graph_class = StepGraph

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
        self.control = self.progress = None
        self.graphs = {}   # captured CUDA graphs by (number of steps, model.graph_key())
        self.max_graph_steps = MAX_GRAPH_STEPS
        self._due = [None] * len(self.operations)   # each operation's next step (its trigger's next_step)
        self.restarted = False
        self.first_step = 0
        self.health = None   # the watchdog and straggler detector (hpcgpu.health), made by run()

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
            operations' begin (initial output; the NaN check compiles its reductions)
            -> model.prepare() -> barrier; the clock starts
            repeat until final_step:
                advance: one eager step, or, on a GPU from step 2 on, a CUDA graph replay of the
                   steps up to the next event (2, 4, ..., 32 steps; graph_window, next_event)
                -> NaN check (its trigger) -> model.after_step (output) -> app operations
                -> progress -> checkpoint every --checkpoint-every steps; on SIGTERM/SIGUSR1 or
                   near the wall-time limit: final checkpoint, then the operations whose trigger fires
                   at the end of a run (AtEnd) act at this step and every operation's end runs,
                   exit 75 (requeue; no summary)
            final checkpoint (with --checkpoint-every) -> model.settle() -> the clock stops
            monitor -> NaN check -> diagnostics -> checksum -> plausibility -> summary
            -> model.finish (files, plots) -> operations' end -> table, JSON summary (rank 0)

        Each operation acts after the advance that reaches the step its trigger names
        (``trigger.next_step``: the triggers are asked when they fire next, not at every step). An
        event -- the final step, a periodic checkpoint, a step that an operation with
        :attr:`~Operation.exact_steps` (NaN check, app operations) must see -- ends a graph replay, and
        the model's :meth:`~Model.capturable` keeps its own (snapshots, norms) out of them too: those
        operations see exactly the steps they see without graphs, so the results are bitwise the same.
        The others (the model's output call, progress, checkpointing's stop check) act at the end of
        the replay that passes their step: a stop request waits at most one replay
        (:data:`MAX_GRAPH_STEPS`).
        """
        comm, arch, model, options = self.comm, self.arch, self.model, self.options
        model.set_final_step(self.final_step)
        monitor = None
        try:
            monitor = GpuMonitor.from_options(comm, arch, options)  # --monitor: NVML sampling thread
            # Collective: the hang watchdog (phase start-up from here on) and the straggler detector.
            self.health = RunHealth.from_options(comm, arch, options, self.output, loud=not options.quiet,
                                                 checkpoint_types=(Checkpoint,))
            version = model.version
            self._print(f"{self.app} {version} (hpcgpu {hpcgpu.__version__}): {model.describe()}" if version
                        else f"{self.app} {hpcgpu.__version__}: {model.describe()}")
            for line in model.header_lines(comm, arch):
                self._print(line)
            if arch.is_gpu and comm.size > 1:
                select_transport(comm, arch)   # agreed by every rank (stored by setup_architecture: no message)
            transport = transport_choice(comm, arch)
            self._print(f"transport: {transport.describe()}")
            if self.graph_requested and not arch.is_gpu:
                self._print("note: --graph has no effect on the CPU")
            graphs = use_graphs(self.graph_requested, arch, model, transport.name, comm.size)
            blocker = graph_blocker(arch, model, transport.name, comm.size)
            if arch.is_gpu and self.graph_requested is None and blocker is not None \
                    and model.graph_unsupported is None:
                self._print(f"note: steps run eagerly (no CUDA graphs): {blocker}")
            self.control = RunControl(comm, options, app=self.app, output=self.output, quiet=options.quiet,
                                      stop_check_every=model.stop_check_every, config=self.fingerprint,
                                      excluded_options=RESTART_INDEPENDENT_OPTIONS | model.restart_independent_options,
                                      unset_values=model.unset_option_values)
            self.restarted = model.load_checkpoint(self.control) is not None
            self.first_step = model.step_index   # 0, or the checkpoint's step
            self._print(f"steps: {steps_text(self.first_step, self.final_step)}", flush=True)
            self.progress = Progress(comm, self.final_step, enabled=not options.quiet, first=self.first_step)
            wall = self._timed_loop(graphs)
        except BaseException as error:   # an error, or SystemExit(75) after a stop request's checkpoint
            if isinstance(error, SystemExit) and error.code == EXIT_REQUEUE:
                self._end_on_stop()
            if monitor is not None:
                monitor.stop()
            if self.health is not None:
                self.health.stop(error)
            model.close()
            raise
        finally:
            if self.control is not None:
                self.control.close()   # after an error too: no writer thread or signal handler left
        try:
            monitor_extra = monitor.finish(comm)  # collective; {} without --monitor
            monitor_extra.update(self.health.finish())   # collective: {"health": {watchdog, stragglers}}
            return self._report(wall, monitor, monitor_extra)
        finally:
            model.close()

    def _timed_loop(self, graphs: bool) -> float:
        comm, arch, model, timers = self.comm, self.arch, self.model, self.timers
        operations = self.operations
        for operation in operations:
            operation.begin(self)   # the NaN check compiles its reductions here
        # Every refusal (paths, restart, existing output files) is behind us: only now record the run.
        write_environment(comm, arch, self.options, self.output)
        model.prepare()   # compile kernels, make connections: outside the timed loop
        comm.barrier()
        arch.synchronize()
        timers.reset()    # initial output and set-up are not phases of the timed loop
        started = time.perf_counter()
        final = self.final_step
        due = self._due = [operation.trigger.next_step(model.step_index, final) for operation in operations]
        maybe_fail("start", comm.rank)
        while model.step_index < final:
            self._advance(graphs)
            step = model.step_index
            maybe_fail("step", comm.rank, step)
            self.health.step_done(step, timers)   # watchdog mark; every N steps the straggler comparison
            for index, next_step in enumerate(due):
                # An operation acts at the step its trigger names (the windows end there when it has
                # exact_steps), the others at the first step the loop reaches from there.
                if next_step is not None and next_step <= step:
                    self.health.act(operations[index], self)   # checkpoints in the watchdog's checkpoint phase
                    due[index] = operations[index].trigger.next_step(step, final)
        finishing = time.perf_counter()
        with self.health.phase("checkpoint"):
            self.control.finish(model.step_index, model.checkpoint_state)   # the end of a run is a checkpoint too
        timers.add("io", time.perf_counter() - finishing)
        model.settle(timers)
        arch.synchronize()
        return time.perf_counter() - started

    def _end_on_stop(self) -> None:
        """Collective, after a stop request's checkpoint (every rank stops at the same step): the job
        ends here, so operations whose trigger fires at the end of a run (:class:`AtEnd`) act now, as
        if the run had been asked to end at this step, unless they already acted at it; then every
        operation's ``end`` runs (files closed). The summary, the model's ``finish`` and the final
        NaN check do not run: the run continues with ``--restart latest``."""
        step = self.model.step_index
        for operation in self.operations:
            if isinstance(operation, (Checkpoint, ProgressReport, ModelOutput)):
                continue
            trigger = operation.trigger
            if trigger(step, step) and not trigger(step, self.final_step):
                operation.act(self)
        for operation in self.operations:
            operation.end(self)

    def next_event(self) -> int:
        """The next step at which the host has work between steps: the final step, a periodic checkpoint,
        or the next firing of an operation with :attr:`~Operation.exact_steps` (a NaN check every 25
        steps still runs at step 25, not only at 50). No CUDA graph is replayed across it."""
        step = self.model.step_index
        events = [self.final_step, self.control.next_save(step)]
        events += [next_step for operation, next_step in zip(self.operations, self._due) if operation.exact_steps]
        return min(event for event in events if event is not None)

    def _advance(self, graphs: bool) -> None:
        """The steps up to the next event (:meth:`next_event`) as one CUDA graph where the model allows
        it (:func:`graph_window`), else one eager step."""
        model, timers = self.model, self.timers
        step = model.step_index
        n_steps = 0
        if graphs and step >= MIN_GRAPH_STEPS:
            n_steps = graph_window(step, self.next_event(), model.capturable, self.max_graph_steps)
        with timers.range(f"steps {step + 1}-{step + n_steps}" if n_steps else f"step {step + 1}"):
            if n_steps:
                key = (n_steps, model.graph_key())   # a graph replays only the buffers it captured
                graph = self.graphs.get(key)
                if graph is None:
                    graph = self.graphs[key] = self.graph_class(self.arch, model, n_steps)
                graph.launch(timers)
            else:
                model.step(timers)

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
            extra={"app_version": model.version, "first_step": self.first_step, "final_step": model.step_index,
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
        return bool(self.graphs)

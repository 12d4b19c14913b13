"""Checkpoint, restart and preemption for the run loop (``--checkpoint-every``, ``--restart`` ...).

The simulation driver (:class:`hpcgpu.simulation.Simulation`) uses it like this::

    control = RunControl(comm, options, app="apps.stencil", output=output)
    restored = control.restore(fields)                  # None for a fresh start (model.load_checkpoint)
    while step < steps:
        step = model.step()
        control.after_step(step, state_fn)              # periodic save; stop on signal / time limit
    control.finish(step, state_fn)

``state_fn()`` returns ``{"fields": {...}, "particles": {...}, "replicated": {...}, "metadata": {...}}``
(any subset) for
:meth:`hpcgpu.checkpoint.CheckpointManager.save`. A stop request (SIGTERM/SIGUSR1, the wall-time
limit) writes a final checkpoint and ends every rank with :data:`EXIT_REQUEUE` (75), which the job
scripts use to requeue; ``--restart latest`` then continues. ``--restart latest`` with no checkpoint at
all is a fresh start (the first job of a chain).

Run identity (``docs/checkpoint.md``, "Runs"): the checkpoints record the run id and a fingerprint of
the options that define the model (every option except :data:`RESTART_INDEPENDENT_OPTIONS`). A fresh
run (no ``--restart``) refuses to start in a checkpoint directory that holds another run's
checkpoints unless ``--share-checkpoint-dir`` is given; ``--restart latest`` continues the newest run
whose fingerprint matches.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path

from hpcgpu.checkpoint import EXIT_REQUEUE, CheckpointManager, Preemption, identity
from hpcgpu.errors import ConfigurationError

#: How often (in steps) the ranks agree on whether to stop; one small allreduce each time.
STOP_CHECK_EVERY = 10

#: Options (``argparse`` destinations) left out of the configuration fingerprint: they may change
#: between a run and its restart without changing the model or the layout of its state.
RESTART_INDEPENDENT_OPTIONS = frozenset({
    # how long, where, how loud, on what hardware
    "config", "backend", "steps", "days", "quiet", "bind_cpus", "output", "summary", "wait_for_lock",
    # checkpointing itself
    "checkpoint_every", "checkpoint_dir", "restart", "keep", "async_checkpoint", "wall_time_limit",
    "share_checkpoint_dir",
    # monitoring and profiling; hang and straggler detection (hpcgpu.health.options.OPTION_NAMES)
    "monitor", "monitor_interval", "profile", "watchdog", "watchdog_startup", "watchdog_step", "watchdog_checkpoint",
    "watchdog_factor", "straggler_every", "straggler_margin", "straggler_windows",
    # decomposition, transport and performance tuning (checkpoints restart on any rank count)
    "dims", "graph", "nccl_channels", "no_overlap", "peer_halo", "exchange", "resident", "allreduce",
    "bucket_mb", "zero", "recompute", "blas_threads", "rebuild_every", "check_interval", "no_check", "sort_every",
    # output and diagnostics cadence
    "no_plot", "snapshot_every", "norm_every", "nan_check_every", "dump_every", "thermo_every", "eval_every",
    "json", "write_data",
})


def fingerprinted_options(options, excluded=RESTART_INDEPENDENT_OPTIONS) -> dict:
    """The options of ``options`` that define the run's configuration, keyed by their flag
    (``{"--nx": 36}``, so that a refusal names the flags that differ).

    Parameters
    ----------
    options : argparse.Namespace, FrozenOptions or mapping of destinations to values
    excluded : collection of str
        Destinations left out: options a restart may change. A model adds its own through
        :attr:`hpcgpu.simulation.Model.restart_independent_options`, which the driver joins to
        :data:`RESTART_INDEPENDENT_OPTIONS`.
    """
    if isinstance(options, Mapping):
        values = options
    elif hasattr(options, "as_dict"):   # FrozenOptions (read-only, no __dict__)
        values = options.as_dict()
    else:
        values = vars(options)
    return {"--" + key.replace("_", "-"): value for key, value in sorted(values.items()) if key not in excluded}


def resolve_unset_options(fingerprint: dict | None, unset_values) -> dict | None:
    """``fingerprint`` (flag -> value) with each option of ``unset_values`` that is ``None`` replaced by
    the value used then (see :attr:`hpcgpu.simulation.Model.unset_option_values`); a new dict.

    Applied to a run's options and to those a checkpoint recorded (a checkpoint written before the
    model declared an option recorded ``None`` for it), so restart checks compare resolved values.
    """
    if fingerprint is None:
        return None
    resolved = dict(fingerprint)
    for destination, value in unset_values.items():
        flag = "--" + destination.replace("_", "-")
        if flag in resolved and resolved[flag] is None:
            resolved[flag] = value(fingerprint) if callable(value) else value
    return resolved


class RunControl:
    """Checkpointing and stop requests of one run, configured from the common flags."""

    def __init__(self, comm, options, app: str, output, quiet: bool = False,
                 stop_check_every: int = STOP_CHECK_EVERY, config: dict | None = None,
                 excluded_options=RESTART_INDEPENDENT_OPTIONS, unset_values=None):
        """``stop_check_every``: steps between the ranks' agreement on stopping (one small allreduce);
        an app whose steps are long (training) checks every step.

        ``config``: the options that define the run's configuration (fingerprinted, see
        :mod:`hpcgpu.checkpoint.identity`); by default every option of ``options`` except
        ``excluded_options``.

        ``unset_values``: the model's :attr:`~hpcgpu.simulation.Model.unset_option_values`; ``config``
        and the checkpoints' recorded options are compared with them resolved
        (:func:`resolve_unset_options`).

        Raises
        ------
        ConfigurationError
            A fresh run (no ``--restart``) in a checkpoint directory holding another run's
            checkpoints, without ``--share-checkpoint-dir`` (the same on every rank).
        """
        self.comm, self.options, self.app = comm, options, app
        self.every = options.checkpoint_every
        self.loud = comm.rank == 0 and not quiet
        directory = Path(options.checkpoint_dir) if options.checkpoint_dir else Path(output) / "checkpoints"
        if config is None:
            config = fingerprinted_options(options, excluded_options)
        unset_values = dict(unset_values or {})
        self.manager = CheckpointManager(comm, directory, app=app, keep=options.keep,
                                         asynchronous=options.async_checkpoint,
                                         config=resolve_unset_options(config, unset_values),
                                         resolve_fn=lambda saved: resolve_unset_options(saved, unset_values))
        try:
            self._check_fresh_start()
        except BaseException:
            self.manager.close()
            raise
        if options.wall_time_limit is not None and options.wall_time_limit <= 0:
            raise ConfigurationError(f"--wall-time-limit must be positive seconds, got {options.wall_time_limit}")
        self.preemption = Preemption(comm, wall_time_limit=options.wall_time_limit)
        self.exit_code = EXIT_REQUEUE
        self.last_saved_step = None
        self.stop_check_every = max(1, int(stop_check_every))
        self._closed = False
        self._next_stop_check = self.stop_check_every

    def _check_fresh_start(self) -> None:
        """Collective: refuse a fresh run in a directory that holds another run's checkpoints."""
        if self.options.restart is not None:
            return  # a restart continues a run (or, for latest with no checkpoint, finds none to clash with)
        others = self.manager.foreign_checkpoints()
        if not others:
            return
        if getattr(self.options, "share_checkpoint_dir", False):
            if self.loud:
                print(f"note: {self.manager.directory} also holds {identity.summarize(others)}; this new run "
                      f"({self.manager.run_id}) leaves them untouched (--share-checkpoint-dir)")
            clashes = sorted(o.step for o in others if self.every and o.step % self.every == 0)
            if clashes and self.comm.rank == 0:  # even with --quiet: the run would fail later
                print(f"warning: this run cannot save a checkpoint at step(s) {', '.join(map(str, clashes))}, "
                      "which the other run holds, and would stop there with an error; choose another "
                      "--checkpoint-every or --checkpoint-dir", file=sys.stderr, flush=True)
            return
        raise ConfigurationError(
            f"checkpoint directory {self.manager.directory} already holds checkpoints of another run: "
            f"{identity.summarize(others)}; a new run there would mix its checkpoints with them. To continue "
            "that run, add --restart latest; to start a new run, give it its own --checkpoint-dir (or --output), "
            "or add --share-checkpoint-dir to start it beside the other run (whose checkpoints it then never "
            "prunes or overwrites)")

    def restart_requested(self) -> bool:
        """True if ``--restart`` names a checkpoint to continue from.

        ``--restart latest`` with no checkpoint yet is a fresh start (the first job of a chain): it
        says so once and returns False.
        """
        which = self.options.restart
        if which is None:
            return False
        if which == "latest" and not self.manager.checkpoints():
            if self.loud:
                print(f"--restart latest: no checkpoint in {self.manager.directory}; starting from the beginning")
            return False
        return True

    def restore(self, fields=None, particles: bool = False, select_fn=None):
        """Load ``--restart`` into ``fields`` (filled in place); returns the RestoredState or None."""
        if not self.restart_requested():
            return None
        restored = self.manager.load(self.options.restart, fields=fields, particles=particles,
                                     particle_select_fn=select_fn)
        self.last_saved_step = restored.step
        if self.loud:
            print(f"restarted from {restored.info.path} (step {restored.step}, written by {restored.info.n_ranks} "
                  f"ranks, run {self.manager.run_id})")
        self._print_restart_note()
        return restored

    def _print_restart_note(self) -> None:
        if self.loud and self.manager.restart_note:
            print(f"note: {self.manager.restart_note}", flush=True)

    def restore_with(self, load_fn):
        """:meth:`restore` for apps that read their own checkpoint contents.

        ``load_fn(manager, which)`` loads ``--restart`` into the app's state and returns the step it
        continues from; returns that step, or None for a fresh start.
        """
        if not self.restart_requested():
            return None
        step = load_fn(self.manager, self.options.restart)
        self.last_saved_step = step
        self._print_restart_note()
        return step

    def save(self, step: int, state_fn) -> None:
        if self.last_saved_step == step:
            return
        state = state_fn()
        self.manager.save(step, fields=state.get("fields"), particles=state.get("particles"),
                          replicated=state.get("replicated"), metadata=state.get("metadata"),
                          units=state.get("units"))
        self.preemption.record_checkpoint_seconds(self.manager.last_save_seconds + self.manager.last_write_seconds)
        self.last_saved_step = step

    def wants_save(self, step: int) -> bool:
        """True if a periodic checkpoint falls on ``step``."""
        return bool(self.every) and step % self.every == 0

    def next_save(self, after: int) -> int | None:
        """The first step after ``after`` on which a periodic checkpoint falls (None: no periodic
        checkpoints). The driver ends its CUDA graph replays there; stop requests (signal, wall-time
        limit) are honoured wherever the replays end (:meth:`after_step`)."""
        return (after // self.every + 1) * self.every if self.every else None

    def after_step(self, step: int, state_fn, timers=None) -> None:
        """Commit finished background writes, save every ``--checkpoint-every`` steps, honour stops."""
        phase = timers.phase("io") if timers is not None else contextlib.nullcontext()
        with phase:
            if self.manager.asynchronous:
                self.manager.poll()
            if self.every and step % self.every == 0:
                self.save(step, state_fn)
        # Steps may advance by more than one (CUDA graphs replay several): check by threshold.
        if step < self._next_stop_check:
            return
        self._next_stop_check = step + self.stop_check_every
        if self.preemption.should_stop(step):
            self.save(step, state_fn)
            self.manager.wait()
            if self.loud:
                print(f"stopping: {self.preemption.reason}; checkpoint of step {step} written to "
                      f"{self.manager.directory}; exit code {self.exit_code} (requeue and run with --restart latest)",
                      flush=True)
            self.close()
            raise SystemExit(self.exit_code)

    def finish(self, step: int, state_fn) -> None:
        """Write the final checkpoint when periodic checkpoints were asked for, and wait for writes."""
        if self.every:
            self.save(step, state_fn)
        self.manager.wait()
        self.close()

    def close(self) -> None:
        """Wait for writes, stop the writer and restore the signal handlers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.manager.close()
        self.preemption.close()

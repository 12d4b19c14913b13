"""What the simulation driver calls: the watchdog and the straggler detector of one run.

The driver's hooks, in order (:class:`hpcgpu.simulation.Simulation`)::

    health = RunHealth.from_options(comm, arch, options, output)   # collective; starts the watchdog
    ... after each advance:        health.step_done(step, timers)   # collective every N steps
    ... each operation:            health.act(operation, simulation)
    ... the final checkpoint:      with health.phase("checkpoint"): ...
    ... end of the run:            extra = health.finish()          # collective; {"health": {...}}
    ... on an error:               health.stop(error)
"""

from __future__ import annotations

import contextlib

from hpcgpu.health.options import settings_from_options
from hpcgpu.health.stragglers import StragglerDetector
from hpcgpu.health.watchdog import Watchdog


def _gpu_reading_fn(arch):
    """Reads this rank's GPU through NVML when asked (None on a CPU)."""
    if not getattr(arch, "is_gpu", False):
        return None

    def read():
        from hpcgpu.health.readings import NvmlSource, normalise_bus_id

        source = NvmlSource()
        if not source.available:
            return {"error": source.reason}
        try:
            reading = source.read(normalise_bus_id(arch.identity.pci_bus_id))
        finally:
            source.close()
        keys = ("sm_clock_mhz", "max_sm_clock_mhz", "temperature_c", "throttle_reasons", "power_w", "power_limit_w")
        return {key: reading[key] for key in keys if key in reading}

    return read


class RunHealth:
    """The watchdog (or None with ``--no-watchdog``) and straggler detector of a run."""

    def __init__(self, watchdog: Watchdog | None, stragglers: StragglerDetector, checkpoint_types=()):
        self.watchdog, self.stragglers = watchdog, stragglers
        self.checkpoint_types = tuple(checkpoint_types)

    @classmethod
    def from_options(cls, comm, arch, options, output=None, loud: bool = True, checkpoint_types=()) -> RunHealth:
        """Collective: build both from the apps' flags (:mod:`hpcgpu.health.options`) and start the watchdog.

        ``checkpoint_types``: the operation classes that write checkpoints (the driver's ``Checkpoint``),
        run in the watchdog's ``checkpoint`` phase."""
        watchdog = None
        if getattr(options, "watchdog", True):
            watchdog = Watchdog(comm, settings_from_options(options), output=output).start()
        hosts = watchdog.hosts if watchdog is not None else None
        emit = None if loud else (lambda line: None)
        stragglers = StragglerDetector(comm, getattr(options, "straggler_every", 100),
                                       getattr(options, "straggler_margin", 0.2),
                                       getattr(options, "straggler_windows", 3), hosts=hosts,
                                       gpu_reading_fn=_gpu_reading_fn(arch), emit_fn=emit)
        return cls(watchdog, stragglers, checkpoint_types)

    def step_done(self, step: int, timers) -> None:
        if self.watchdog is not None:
            self.watchdog.step_done(step)
        self.stragglers.step_done(step, timers)

    def act(self, operation, simulation) -> None:
        """Run ``operation.act``; checkpoints (and stop requests) in the watchdog's ``checkpoint`` phase."""
        if self.watchdog is not None and isinstance(operation, self.checkpoint_types):
            with self.watchdog.phase("checkpoint"):
                operation.act(simulation)
        else:
            operation.act(simulation)

    def phase(self, name: str):
        return self.watchdog.phase(name) if self.watchdog is not None else contextlib.nullcontext()

    def stop(self, error: BaseException | None = None) -> None:
        """Stop the watchdog after an error: politely when every rank stops alike (a replicated error,
        SystemExit such as the checkpointed stop), else at once (the job is being aborted)."""
        if self.watchdog is not None:
            graceful = error is None or isinstance(error, SystemExit) or getattr(error, "replicated", False)
            self.watchdog.stop(graceful=graceful)

    def finish(self) -> dict:
        """Collective: stop the watchdog; ``{"health": {"watchdog": ..., "stragglers": ...}}`` for the summary."""
        watchdog = {"enabled": False}
        if self.watchdog is not None:
            self.watchdog.stop(graceful=True)
            watchdog = self.watchdog.summary()
        return {"health": {"watchdog": watchdog, "stragglers": self.stragglers.summary()}}

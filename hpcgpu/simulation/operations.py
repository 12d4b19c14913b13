"""Operations: work the driver runs between steps, each when its trigger fires.

The driver keeps an ordered list: the NaN check first, then the model's own output
(:meth:`Model.after_step`), the app's operations (thermo lines, trajectory frames, evaluations),
the progress line and, last, checkpointing and stop requests -- so that a checkpoint always holds a
state that passed the check and whose output was written. An operation has three hooks:

``begin(simulation)``
    once before the timed loop (initial output: the thermo line of step 0, a first frame);
``act(simulation)``
    after a step when ``trigger(step, final_step)`` is true;
``end(simulation)``
    once after the run, before the summary is written (close files).
"""

from __future__ import annotations

import math
import time

from hpcgpu.errors import NumericalError
from hpcgpu.simulation.triggers import Always, Trigger


class Operation:
    """Base class: an action with a :class:`~hpcgpu.simulation.triggers.Trigger`.

    Parameters
    ----------
    trigger : Trigger
        When :meth:`act` runs (default: after every step).
    """

    #: True when the operation must see the exact step its trigger names: the driver then never replays a
    #: CUDA graph across that step. False for operations that any later step serves as well, such as
    #: the progress line, or that make their own arrangements (model output: :meth:`Model.capturable`;
    #: checkpoints: :meth:`RunControl.next_save`): they act after the replay that passes their step.
    exact_steps = True

    def __init__(self, trigger: Trigger | None = None):
        self.trigger = trigger if trigger is not None else Always()

    def begin(self, simulation) -> None:
        """Before the timed loop (default: nothing)."""

    def act(self, simulation) -> None:
        """After a step at which the trigger fires."""

    def end(self, simulation) -> None:
        """After the run, before the summary is written (default: nothing)."""


def _finite(value, xp) -> bool:
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    return bool(xp.isfinite(value).all())


def check_finite(comm, arch, model) -> None:
    """Collective: raise :class:`NumericalError` on every rank if any rank's state is not finite.

    The arrays come from ``model.finite_arrays()``; the message from ``model.nan_message(step,
    ranks)``. Every rank raises the same error (``replicated``), so the job ends with one message and
    exit code 2 instead of one traceback per rank.
    """
    local_ok = all(_finite(value, arch.xp) for value in model.finite_arrays())
    if comm.allreduce(int(local_ok), "min"):
        return
    flags = comm.mpi.allgather(local_ok)
    error = NumericalError(model.nan_message(model.step_index, [rank for rank, ok in enumerate(flags) if not ok]))
    error.replicated = True   # agreed through the allreduce: the same text on every rank
    raise error


def warm_up_check_finite(arch, model) -> None:
    """Run this rank's part of :func:`check_finite` once and drop the answer (no collective, no error).

    On a GPU the first check compiles CuPy's ``isfinite`` and reduction kernels; done before the timed
    loop, that cost stays out of the timings. The state is not changed.
    """
    for value in model.finite_arrays():
        _finite(value, arch.xp)


class NanCheck(Operation):
    """Stop the run with one clear error when the state holds NaN or Inf (:func:`check_finite`)."""

    def begin(self, simulation) -> None:
        warm_up_check_finite(simulation.arch, simulation.model)

    def act(self, simulation) -> None:
        simulation.check_finite()


class ModelOutput(Operation):
    """The model's own output (:meth:`Model.after_step`): after every step, and for the initial state
    of a fresh run."""

    exact_steps = False

    def begin(self, simulation) -> None:
        if not simulation.restarted:
            self.act(simulation)

    def act(self, simulation) -> None:
        simulation.model.after_step(simulation.timers, simulation.output, simulation.final_step)


def model_note(simulation) -> str:
    """The default progress note: :meth:`Model.progress_note`."""
    return simulation.model.progress_note()


class ProgressReport(Operation):
    """The progress line on rank 0 (:class:`hpcgpu.app.progress.Progress`).

    Parameters
    ----------
    note_fn : callable, optional
        ``note_fn(simulation) -> str``: text after the rate (default :func:`model_note`).
    """

    exact_steps = False

    def __init__(self, note_fn=model_note, trigger: Trigger | None = None):
        super().__init__(trigger)
        self.note_fn = note_fn

    def act(self, simulation) -> None:
        simulation.progress.update(simulation.model.step_index, self.note_fn(simulation))


class Checkpoint(Operation):
    """Periodic checkpoints and stop requests (:meth:`RunControl.after_step`); may end the job with
    exit code 75 after writing a final checkpoint."""

    exact_steps = False

    def act(self, simulation) -> None:
        simulation.control.after_step(simulation.model.step_index, simulation.model.checkpoint_state,
                                      simulation.timers)


def rate_note(samples_per_step: float):
    """A ``note_fn`` for :class:`ProgressReport`: samples/s measured like the progress line's steps/s.

    Returns
    -------
    callable
        ``note_fn(simulation) -> "{model note}  {rate} samples/s"`` (``-`` until timed).
    """
    def note(simulation) -> str:
        steps_per_second = simulation.progress.rate(simulation.model.step_index, time.perf_counter())
        rate = f"{samples_per_step * steps_per_second:,.0f}" if steps_per_second else "-"
        return f"{simulation.model.progress_note()}  {rate} samples/s"
    return note

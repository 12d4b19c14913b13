"""Triggers: *when* an operation acts, as a function of the step just completed.

A trigger is called with the absolute step the model has just reached and the step the run ends
at, and answers whether its operation acts now (as in HOOMD-blue, where every writer and updater
carries a trigger)::

    Periodic(100)(200, 1000)            -> True      every 100 steps
    AtEnd()(1000, 1000)                 -> True      the last step of the run
    (Periodic(50) | AtEnd())(130, 130)  -> True      thermo lines: every 50 steps and the last one
    (Periodic(10) & ~AtEnd())(100, 100) -> False     evaluations: every 10 steps except the last

``Periodic(0)`` never fires: a period of 0 is how the apps' ``--*-every 0`` options say "never".
"""

from __future__ import annotations


class Trigger:
    """Base class: ``trigger(step, final_step) -> bool``; ``|``, ``&`` and ``~`` combine triggers."""

    def __call__(self, step: int, final_step: int) -> bool:
        raise NotImplementedError

    def __or__(self, other: Trigger) -> Trigger:
        return AnyOf(self, other)

    def __and__(self, other: Trigger) -> Trigger:
        return AllOf(self, other)

    def __invert__(self) -> Trigger:
        return Not(self)


class Periodic(Trigger):
    """Fires at every step divisible by ``period`` (never when ``period`` is 0).

    Parameters
    ----------
    period : int
        Steps between two firings, >= 0.
    """

    def __init__(self, period: int):
        if period < 0:
            raise ValueError(f"a trigger period must be >= 0, found {period}")
        self.period = int(period)

    def __call__(self, step: int, final_step: int) -> bool:
        return self.period > 0 and step % self.period == 0

    def __repr__(self) -> str:
        return f"Periodic({self.period})"


class AtEnd(Trigger):
    """Fires at the step the run ends at (``step == final_step``)."""

    def __call__(self, step: int, final_step: int) -> bool:
        return step == final_step

    def __repr__(self) -> str:
        return "AtEnd()"


class Always(Trigger):
    """Fires after every step."""

    def __call__(self, step: int, final_step: int) -> bool:
        return True

    def __repr__(self) -> str:
        return "Always()"


class AnyOf(Trigger):
    """Fires when any of ``triggers`` fires."""

    def __init__(self, *triggers: Trigger):
        self.triggers = triggers

    def __call__(self, step: int, final_step: int) -> bool:
        return any(trigger(step, final_step) for trigger in self.triggers)

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.triggers))


class AllOf(Trigger):
    """Fires when all of ``triggers`` fire."""

    def __init__(self, *triggers: Trigger):
        self.triggers = triggers

    def __call__(self, step: int, final_step: int) -> bool:
        return all(trigger(step, final_step) for trigger in self.triggers)

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.triggers))


class Not(Trigger):
    """Fires when ``trigger`` does not."""

    def __init__(self, trigger: Trigger):
        self.trigger = trigger

    def __call__(self, step: int, final_step: int) -> bool:
        return not self.trigger(step, final_step)

    def __repr__(self) -> str:
        return f"~{self.trigger!r}"

"""Triggers: *when* an operation acts, as a function of the step just completed.

A trigger is called with the absolute step the model has just reached and the step the run ends
at, and answers whether its operation acts now (as in HOOMD-blue, where every writer and updater
carries a trigger)::

    Periodic(100)(200, 1000)            -> True      every 100 steps
    AtEnd()(1000, 1000)                 -> True      the last step of the run
    (Periodic(50) | AtEnd())(130, 130)  -> True      thermo lines: every 50 steps and the last one
    (Periodic(10) & ~AtEnd())(100, 100) -> False     evaluations: every 10 steps except the last

``Periodic(0)`` never fires: a period of 0 is how the apps' ``--*-every 0`` options say "never".

``trigger.next_step(after, final_step)`` answers the driver's other question, *when next*: the first
step after ``after`` (up to ``final_step``) at which the trigger fires, or None. The built-in triggers
compute it arithmetically, so the driver can replay the steps up to there as CUDA graphs without
asking every step in between::

    Periodic(25).next_step(30, 1000)             -> 50
    (Periodic(25) | AtEnd()).next_step(990, 1000) -> 1000
    Periodic(25).next_step(990, 1000)            -> None
"""

from __future__ import annotations


class Trigger:
    """Base class: ``trigger(step, final_step) -> bool``; ``|``, ``&`` and ``~`` combine triggers."""

    def __call__(self, step: int, final_step: int) -> bool:
        raise NotImplementedError

    def next_step(self, after: int, final_step: int) -> int | None:
        """The first step ``s`` with ``after < s <= final_step`` at which the trigger fires (None: none).

        This default asks ``self(s, final_step)`` step by step, which is right for any trigger; the
        built-in ones override it with arithmetic.
        """
        for step in range(after + 1, final_step + 1):
            if self(step, final_step):
                return step
        return None

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

    def next_step(self, after: int, final_step: int) -> int | None:
        if self.period == 0:
            return None
        step = (after // self.period + 1) * self.period
        return step if step <= final_step else None

    def __repr__(self) -> str:
        return f"Periodic({self.period})"


class AtEnd(Trigger):
    """Fires at the step the run ends at (``step == final_step``)."""

    def __call__(self, step: int, final_step: int) -> bool:
        return step == final_step

    def next_step(self, after: int, final_step: int) -> int | None:
        return final_step if after < final_step else None

    def __repr__(self) -> str:
        return "AtEnd()"


class Always(Trigger):
    """Fires after every step."""

    def __call__(self, step: int, final_step: int) -> bool:
        return True

    def next_step(self, after: int, final_step: int) -> int | None:
        return after + 1 if after < final_step else None

    def __repr__(self) -> str:
        return "Always()"


class AnyOf(Trigger):
    """Fires when any of ``triggers`` fires."""

    def __init__(self, *triggers: Trigger):
        self.triggers = triggers

    def __call__(self, step: int, final_step: int) -> bool:
        return any(trigger(step, final_step) for trigger in self.triggers)

    def next_step(self, after: int, final_step: int) -> int | None:
        steps = [s for s in (trigger.next_step(after, final_step) for trigger in self.triggers) if s is not None]
        return min(steps) if steps else None

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.triggers))


class AllOf(Trigger):
    """Fires when all of ``triggers`` fire."""

    def __init__(self, *triggers: Trigger):
        self.triggers = triggers

    def __call__(self, step: int, final_step: int) -> bool:
        return all(trigger(step, final_step) for trigger in self.triggers)

    def next_step(self, after: int, final_step: int) -> int | None:
        # No step before the latest of the triggers' next firings can have all of them fire: jump
        # there, and again from there, until they agree.
        while True:
            steps = [trigger.next_step(after, final_step) for trigger in self.triggers]
            if not steps:
                return after + 1 if after < final_step else None   # all() of nothing fires
            if None in steps:
                return None
            latest = max(steps)
            if all(step == latest for step in steps):
                return latest
            after = latest - 1

    def __repr__(self) -> str:
        return " & ".join(map(repr, self.triggers))


class Not(Trigger):
    """Fires when ``trigger`` does not."""

    def __init__(self, trigger: Trigger):
        self.trigger = trigger

    def __call__(self, step: int, final_step: int) -> bool:
        return not self.trigger(step, final_step)

    def next_step(self, after: int, final_step: int) -> int | None:
        # The first step at which the inner trigger does not fire: skip its consecutive firings.
        step = after + 1
        while step <= final_step:
            if self.trigger.next_step(step - 1, final_step) != step:
                return step
            step += 1
        return None

    def __repr__(self) -> str:
        return f"~{self.trigger!r}"

"""Test hook: raise an exception on one rank at a named phase of a run, to prove the job still ends.

``HPCGPU_INJECT_FAULT=PHASE:RANK`` (or ``PHASE`` alone: every rank) makes :func:`maybe_fail` raise
:class:`InjectedFault` there. The phases an app passes through, in order::

    parse     after the command line is parsed      (a rank-local ConfigurationError, as a --config
                                                    file missing on one node would give)
    setup     before the model is built
    output    when the output directory is prepared
    start     before the first step
    step      after a step (``step@N`` for step N; default the first)
    write     before a record of an output file is written

Used by the fault-injection tests and ``benchmarks/fault_campaign.py``; unset, it costs one
dictionary lookup per call.
"""

from __future__ import annotations

import os

from hpcgpu.errors import ConfigurationError

FAULT_VARIABLE = "HPCGPU_INJECT_FAULT"
PHASES = ("parse", "setup", "output", "start", "step", "write")


class InjectedFault(RuntimeError):
    """The exception :func:`maybe_fail` raises (an unexpected error, as a bug or a failing device would be)."""


def _requested(phase: str, rank: int, step: int | None) -> bool:
    request = os.environ.get(FAULT_VARIABLE)
    if not request:
        return False
    where, _, which = request.partition(":")
    name, _, at_step = where.partition("@")
    if name != phase or (which and int(which) != rank):
        return False
    if phase == "step":
        return step == (int(at_step) if at_step else 1)
    return True


def maybe_fail(phase: str, rank: int, step: int | None = None) -> None:
    """Raise :class:`InjectedFault` (``parse``: ConfigurationError) if ``$HPCGPU_INJECT_FAULT`` names this phase and rank."""
    if _requested(phase, rank, step):
        if phase == "parse":
            raise ConfigurationError(f"injected fault at phase parse on rank {rank} ({FAULT_VARIABLE})")
        raise InjectedFault(f"injected fault at phase {phase} on rank {rank} ({FAULT_VARIABLE})")

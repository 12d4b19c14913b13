"""Test hook: raise an exception on one rank at a named phase of a run, to prove the job still ends.

``HPCGPU_INJECT_FAULT=PHASE:RANK`` (or ``PHASE`` alone: every rank) makes :func:`maybe_fail` raise
:class:`InjectedFault` there. The phases an app passes through, in order::

    parse     after the command line is parsed      (a rank-local ConfigurationError, as a --config
                                                    file missing on one node would give)
    setup     before the model is built
    output    when the output directory is prepared
    start     before the first step
    step      after a step (``step@N`` for step N; default the first)
    write     before a record of an output file is written (rank 0 only: it writes every output
              file, so ``write`` means ``write:0``)

:func:`check_request` refuses a request that can never fire (an unknown phase, a rank the job does
not have, ``write`` on a rank other than 0), with one line, before the run starts. Used by the
fault-injection tests and ``benchmarks/fault_campaign.py``; unset, it costs one dictionary lookup per
call.
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


def check_request(n_ranks: int) -> None:
    """Raise ConfigurationError (the same on every rank) if ``$HPCGPU_INJECT_FAULT`` can never fire in a job
    of ``n_ranks`` ranks; nothing when it is unset."""
    request = os.environ.get(FAULT_VARIABLE)
    if not request:
        return
    where, colon, which = request.partition(":")
    name, at, at_step = where.partition("@")
    problem = None
    if name not in PHASES:
        problem = f"unknown phase {name!r}"
    elif at and (name != "step" or not at_step.isdigit()):
        problem = "only step takes @N, a step number"
    elif colon and not (which.isdigit() and int(which) < n_ranks):
        problem = f"rank {which!r} is not one of this job's ranks 0..{n_ranks - 1}"
    elif name == "write" and colon and int(which) != 0:
        problem = "output files are written by rank 0 only, so a write fault on another rank never fires"
    if problem is not None:
        raise ConfigurationError(
            f"{FAULT_VARIABLE}={request}: {problem}; expected PHASE[:RANK] with PHASE one of parse, setup, output, "
            f"start, step[@N], write (rank 0 only) and RANK in 0..{n_ranks - 1}, or unset it")


def maybe_fail(phase: str, rank: int, step: int | None = None) -> None:
    """Raise :class:`InjectedFault` (``parse``: ConfigurationError) if ``$HPCGPU_INJECT_FAULT`` names this phase and rank."""
    if _requested(phase, rank, step):
        if phase == "parse":
            raise ConfigurationError(f"injected fault at phase parse on rank {rank} ({FAULT_VARIABLE})")
        raise InjectedFault(f"injected fault at phase {phase} on rank {rank} ({FAULT_VARIABLE})")

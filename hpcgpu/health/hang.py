"""Naming the stuck rank of a hung job, from what each rank's watchdog last said.

Every rank's watchdog publishes a heartbeat: the last step it completed, its phase, how long it has
been in it, and whether its main thread is *waiting in communication* (an MPI or NCCL call, a halo
exchange) or not. In a job where one rank stopped making progress, the others soon wait for it in their
next collective or exchange, so:

1. a rank whose heartbeats stopped is named first: its process is gone, or it holds the Python
   interpreter lock in compiled code (the watchdog thread cannot run);
2. else, among the ranks with the fewest completed steps, those *not* waiting in communication;
3. else (every such rank waits: a lost message, a dead link), all ranks with the fewest steps.

:func:`name_stuck_ranks` is that rule; :func:`hang_summary` the one line a user reads.
"""

from __future__ import annotations

import sys
import traceback

#: Where a main thread that waits for other ranks is: the communication layer's modules and the
#: collectives the driver's hooks call. A frame from any of them in the stack means "waiting".
COMMUNICATION_CODE = ("/hpcgpu/transport/", "/hpcgpu/halo/", "/hpcgpu/runtime/communicator.py",
                      "/hpcgpu/particles/migration.py", "/hpcgpu/particles/ghosts.py",
                      "/hpcgpu/particles/device_ghosts.py", "/hpcgpu/health/stragglers.py",
                      "/hpcgpu/checkpoint/preemption.py", "/mpi4py/", "/cupy/cuda/nccl")


def main_thread_frame():
    """The current frame of the process's main thread (None if it has ended)."""
    import threading

    return sys._current_frames().get(threading.main_thread().ident)


def waiting_in_communication(frame) -> bool:
    """True when a frame of the stack from ``frame`` outwards is in :data:`COMMUNICATION_CODE`."""
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if any(marker in name for marker in COMMUNICATION_CODE):
            return True
        frame = frame.f_back
    return False


def format_stack(frame, limit: int = 40) -> str:
    """The stack from ``frame`` outwards, innermost last, as ``traceback`` prints it."""
    return "".join(traceback.format_stack(frame, limit=limit)) if frame is not None else "(no main thread)\n"


def name_stuck_ranks(states: dict[int, dict], n_ranks: int) -> tuple[list[int], str]:
    """The stuck rank(s) and why, from the ranks' last heartbeats.

    Parameters
    ----------
    states : dict of int -> dict
        Per rank that was heard from recently: ``step`` (last completed), ``waiting`` (bool). Ranks
        missing from it are unresponsive.
    n_ranks : int

    Returns
    -------
    (ranks, reason)
    """
    silent = [rank for rank in range(n_ranks) if rank not in states]
    if silent:
        return silent, ("no heartbeat: the process is gone, or holds the Python interpreter lock in compiled "
                        "code so its watchdog thread cannot run")
    fewest = min(state["step"] for state in states.values())
    behind = sorted(rank for rank, state in states.items() if state["step"] == fewest)
    busy = [rank for rank in behind if not states[rank]["waiting"]]
    if busy and len(busy) < n_ranks:
        return busy, f"stopped after step {fewest} outside communication while the other ranks wait for it"
    if busy:
        return busy, f"every rank stopped after step {fewest}, none in communication"
    if len(behind) < n_ranks:
        return behind, f"fewest steps completed ({fewest}); every rank waits in communication"
    return behind, f"every rank waits in communication after step {fewest} (a lost message or a dead link?)"


def hang_summary(ranks: list[int], reason: str, hosts: list[str], states: dict[int, dict], n_ranks: int) -> str:
    """One line: ``hang: rank 2/4 on node gpu07 stuck in phase step after step 41 (...)``."""
    names = ", ".join(f"rank {rank}/{n_ranks} on node {hosts[rank]}" for rank in ranks[:8])
    if len(ranks) > 8:
        names += f" and {len(ranks) - 8} more"
    first = states.get(ranks[0]) if ranks else None
    where = ""
    if first is not None and first.get("silent_s") is not None:
        where = (f" (silent for {first['silent_s']:.0f} s; last heard in phase {first['phase']}, last completed "
                 f"step {first['step']})")
    elif first is not None:
        where = (f" in phase {first['phase']} after step {first['step']} ({first['elapsed']:.0f} s, timeout "
                 f"{first['timeout']:.0f} s)")
    return f"hang: {names} stuck{where}: {reason}"

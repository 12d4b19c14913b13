"""Stopping cleanly before a wall-time limit or a preemption, with one reduction per step.

Slurm warns a job before it ends it: ``SIGTERM`` at preemption or ``scancel`` (``SIGKILL`` follows
after ``KillWait``, 30 s by default) and, with ``#SBATCH --signal=USR1@180``, ``SIGUSR1`` 180 s before
the time limit. A signal handler may run between any two bytecodes, so it only sets a flag; at the
next step boundary :meth:`Preemption.should_stop` combines every rank's flag in one allreduce, so
all ranks stop at the same step, write a final checkpoint together, and exit with
:data:`EXIT_REQUEUE`, which job scripts turn into ``scontrol requeue``.

A wall-time limit (``--wall-time-limit SECONDS``, or the Slurm job's end time when none is given)
works the same way from inside: a rank whose clock says the next step and the final checkpoint
would not fit raises its flag.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

#: Exit code of a run that stopped early to be continued (``EX_TEMPFAIL`` from ``sysexits.h``).
#: Job scripts requeue on it: ``[ $? -eq 75 ] && scontrol requeue $SLURM_JOB_ID``.
EXIT_REQUEUE = 75

_NO_STOP, _SIGNAL, _TIME = 0, 1, 2


def parse_slurm_duration(text: str) -> float | None:
    """Seconds in a Slurm duration (``[days-]hours:minutes:seconds``, ``minutes:seconds``); None if unlimited."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "NOT_SET", "INVALID", "N/A"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return (int(days) if days else 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def slurm_seconds_left() -> float | None:
    """Seconds until this Slurm job's end time, or None outside Slurm / without a limit.

    Uses ``$SLURM_JOB_END_TIME`` (a Unix time, set by recent Slurm) and otherwise asks
    ``squeue -h -j $SLURM_JOB_ID -o %L`` (time left). Call on one rank and broadcast.
    """
    end_time = os.environ.get("SLURM_JOB_END_TIME")
    if end_time:
        try:
            return float(end_time) - time.time()
        except ValueError:
            pass
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return parse_slurm_duration(out.stdout)
    except ValueError:
        return None


class Preemption:
    """Signal flags and a wall-time limit, agreed across ranks at step boundaries.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    wall_time_limit : float, optional
        Seconds from now after which the run must have stopped (its final checkpoint written). None:
        the Slurm job's remaining time when running under Slurm, else no limit.
    margin_seconds : float, optional
        Stop when less than this remains. Default: twice the longest step seen so far plus twice the
        longest checkpoint reported through :meth:`record_checkpoint_seconds` (plus 30 s under Slurm,
        for the final write and the launcher's teardown).
    signals : tuple of signal numbers
        Signals that request a stop (default SIGTERM and SIGUSR1). Handlers are installed only in the
        main thread and restored by :meth:`close`.

    Examples
    --------
    >>> pre = Preemption(comm, wall_time_limit=options.wall_time_limit)      # doctest: +SKIP
    >>> while step < n_steps:                                                 # doctest: +SKIP
    ...     step = model.step()
    ...     if pre.should_stop(step):
    ...         ckpt.save(step, fields=...); ckpt.wait()
    ...         raise SystemExit(EXIT_REQUEUE)
    """

    def __init__(self, comm, wall_time_limit: float | None = None, margin_seconds: float | None = None,
                 signals=(signal.SIGTERM, signal.SIGUSR1)):
        self.comm = comm
        self.started = time.monotonic()
        from_slurm = False
        if wall_time_limit is None:
            left = slurm_seconds_left() if comm.rank == 0 else None
            wall_time_limit = comm.broadcast(left, root=0)
            from_slurm = wall_time_limit is not None
        self.wall_time_limit = wall_time_limit
        self.deadline = None if wall_time_limit is None else self.started + float(wall_time_limit)
        self.margin_seconds = margin_seconds
        self._base_margin = 30.0 if from_slurm else 0.0
        self._longest_step = 0.0
        self._longest_checkpoint = 0.0
        self._last_check = None
        self.received_signal = None
        self.reason = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for number in signals:
                self._previous[number] = signal.signal(number, self._on_signal)

    def _on_signal(self, number, frame) -> None:
        # Only a flag: MPI, HDF5 and CUDA calls are not safe inside a signal handler.
        self.received_signal = number

    def record_checkpoint_seconds(self, seconds: float) -> None:
        """Tell the time-limit check how long a checkpoint took, so the final one still fits."""
        self._longest_checkpoint = max(self._longest_checkpoint, float(seconds))

    @property
    def margin(self) -> float:
        if self.margin_seconds is not None:
            return float(self.margin_seconds)
        return self._base_margin + 2.0 * self._longest_step + 2.0 * self._longest_checkpoint

    def seconds_left(self) -> float | None:
        """Seconds until the wall-time limit (None without one)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def should_stop(self, step: int | None = None) -> bool:
        """Collective (one allreduce): True on every rank together once any rank must stop.

        Call it at every step boundary on every rank. ``reason`` then says why.
        """
        now = time.monotonic()
        if self._last_check is not None:
            self._longest_step = max(self._longest_step, now - self._last_check)
        self._last_check = now
        local = _NO_STOP
        if self.received_signal is not None:
            local = _SIGNAL
        elif self.deadline is not None and now + self.margin >= self.deadline:
            local = _TIME
        agreed = self.comm.allreduce(local, op="max")
        if agreed == _NO_STOP:
            return False
        where = "" if step is None else f" at step {step}"
        if agreed == _SIGNAL:
            self.reason = f"a stop signal (SIGTERM/SIGUSR1) reached a rank{where}"
        else:
            self.reason = (f"the wall-time limit of {self.wall_time_limit:g} s is near{where} "
                           f"(margin {self.margin:.1f} s)")
        return True

    def close(self) -> None:
        """Restore the signal handlers that were installed before."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

"""Hang detection: a watchdog thread on every rank, with a timeout per phase of the run.

The driver tells the watchdog where the run is (three attribute writes per step, no message):
``start-up`` until the first step completes (restart, compilation, connections), ``step`` between
steps, ``checkpoint`` while a checkpoint is written and ``finish`` after the loop. Each phase has a
timeout: ``start-up`` a fixed one; ``step`` and ``checkpoint`` the larger of a floor and ``factor`` x the
longest such phase measured so far in this run, so a healthy slow start (compilation, the first
checkpoint) never counts against the steps, and a run whose steps take minutes is judged by its own
pace (:class:`WatchdogSettings`).

When a rank's phase outlives its timeout, its watchdog thread prints where the main thread is (phase,
last completed step, Python stack) and sends the same to rank 0. The watchdog threads talk only among
themselves, on a communicator of their own (a duplicate of the job's), with non-blocking messages: every
``interval`` each rank sends rank 0 a heartbeat (last step, phase, time in it, whether it waits in
communication: :mod:`hpcgpu.health.hang`). Rank 0's watchdog, once any rank expired (or went silent
past its deadline), waits a short grace for the others' reports, names the stuck rank and node in one
line, writes ``OUTPUT/hang.json`` and ends the job with ``MPI_Abort`` and :data:`EXIT_HANG`. If rank 0
itself cannot act, the other ranks end the job after a longer grace, and they write ``hang.json``
naming rank 0, so the verdict exists whichever rank is stuck. Stacks of a rank whose Python
cannot run at all (compiled code holding the interpreter lock) come from :mod:`faulthandler`, armed by
the watchdog thread just beyond the current deadline.

This needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it; MPICH and Open MPI provide it). Without it each
rank reports and ends the job by itself, without naming the others.

Test-only switch: ``HPCGPU_WATCHDOG_TEST=hang:RANK:STEP`` (sleep forever after completing STEP),
``hold-gil:RANK:STEP`` (the same holding the interpreter lock) or ``slow:RANK:SECONDS`` (sleep that long
after every step) on rank RANK. Read once, when the watchdog is made.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from hpcgpu.errors import rank_prefix
from hpcgpu.health.hang import format_stack, hang_summary, main_thread_frame, name_stuck_ranks, waiting_in_communication

#: Exit code of a job ended by the watchdog (docs/health.md); 75 is a checkpointed stop, 2 bad input.
EXIT_HANG = 76
PHASES = ("start-up", "step", "checkpoint", "finish")
TEST_VARIABLE = "HPCGPU_WATCHDOG_TEST"
_HEARTBEAT, _REPORT, _VERDICT = 4311, 4312, 4313
#: Heartbeat fields (float64): sequence, last step, phase, seconds in phase, timeout, waiting, expired, done.
_FIELDS = 8


@dataclass
class WatchdogSettings:
    """Timeouts of the phases, in seconds.

    Attributes
    ----------
    startup_s : float
        From the start of the run to the end of the first step [1800].
    step_s : float
        Floor of the step timeout [300]; the timeout is ``max(step_s, factor x longest step so far)``.
    checkpoint_s : float
        Floor of the checkpoint (and finish) timeout [600], likewise.
    factor : float
        How many times the longest measured step (checkpoint) a phase may take [10].
    interval_s : float or None
        Seconds between the watchdog's looks (None: a fifth of the shortest floor, at most 5 s).
    """

    startup_s: float = 1800.0
    step_s: float = 300.0
    checkpoint_s: float = 600.0
    factor: float = 10.0
    interval_s: float | None = None

    @property
    def interval(self) -> float:
        if self.interval_s is not None:
            return self.interval_s
        return min(5.0, max(0.05, min(self.startup_s, self.step_s, self.checkpoint_s) / 5))

    @property
    def grace(self) -> float:
        """Seconds rank 0 waits, after the first expiry, for the other ranks' reports."""
        return max(1.0, 2 * self.interval)


def parse_test_action(text: str | None) -> tuple[str, int, float] | None:
    """``("hang", rank, step)`` etc. from :data:`TEST_VARIABLE`'s value (None when unset or empty)."""
    if not text:
        return None
    try:
        kind, rank, value = text.split(":")
        if kind not in ("hang", "hold-gil", "slow"):
            raise ValueError
        return kind, int(rank), float(value)
    except ValueError:
        raise ValueError(f"{TEST_VARIABLE}={text!r}: expected hang:RANK:STEP, hold-gil:RANK:STEP or "
                         "slow:RANK:SECONDS") from None


def _hold_the_interpreter_lock(seconds: float) -> None:
    import ctypes
    import ctypes.util

    # PyDLL keeps the GIL during the call, like compiled code that never releases it.
    ctypes.PyDLL(ctypes.util.find_library("c")).sleep(int(seconds))


class Watchdog:
    """The hang detector of one rank (collective to make: every rank of ``comm`` makes one).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    settings : WatchdogSettings
    output : path-like, optional
        Where the rank that ends a hung job writes ``hang.json`` (rank 0, or another one if rank 0 is stuck).
    emit_fn : callable, optional
        Prints one block of text (default: to stderr, flushed).
    abort_fn : callable, optional
        ``abort_fn(code)`` ends the job (default: ``MPI_Abort`` on the job's communicator); tests pass
        their own.
    """

    def __init__(self, comm, settings: WatchdogSettings | None = None, output=None, emit_fn=None, abort_fn=None):
        from mpi4py import MPI

        self.comm, self.settings, self.output = comm, settings or WatchdogSettings(), output
        self.rank, self.size = comm.rank, comm.size
        self.prefix = rank_prefix(self.rank, self.size)
        self.emit_fn = emit_fn or (lambda text: print(text, file=sys.stderr, flush=True))
        self.abort_fn = abort_fn or comm.mpi.Abort
        self.hosts = comm.mpi.allgather(comm.hostname)
        self.threaded = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        self.channel = comm.mpi.Dup() if self.threaded and self.size > 1 else None
        self.test_action = parse_test_action(os.environ.get(TEST_VARIABLE))
        # Written by the main thread, read by the watchdog thread (single attribute writes).
        self.phase_name, self.mark, self.last_step = "start-up", time.monotonic(), -1
        self.longest = {"step": 0.0, "checkpoint": 0.0}
        self.expired_at = None
        self.verdict = None
        self._thread = None
        self._stop = threading.Event()
        self._sequence = 0
        self._send_buffer = np.zeros(_FIELDS)
        self._send_request = self._report_request = None
        self._states: dict[int, dict] = {}
        self._reports: dict[int, dict] = {}
        self._receives = {}
        self._triggered_at = None
        if self.channel is not None and self.rank == 0:
            for source in range(1, self.size):
                self._post_receive(source)

    # -- the main thread's hooks (cheap: no message, no lock) ----------------------------------------

    def start(self) -> Watchdog:
        self.mark = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="hpcgpu-watchdog", daemon=True)
        self._thread.start()
        return self

    def step_done(self, step: int) -> None:
        """The main thread completed ``step`` (absolute): the ``step`` phase starts again."""
        now = time.monotonic()
        if self.phase_name == "step" and now - self.mark > self.longest["step"]:
            self.longest["step"] = now - self.mark
        self.phase_name, self.mark, self.last_step = "step", now, step
        if self.test_action is not None:
            self._test_hook(step)

    @contextlib.contextmanager
    def phase(self, name: str):
        """The block is phase ``name`` (``checkpoint``, ``finish``); afterwards the previous phase goes on."""
        previous, self.phase_name, self.mark = self.phase_name, name, time.monotonic()
        try:
            yield
        finally:
            now = time.monotonic()
            if name in self.longest and now - self.mark > self.longest[name]:
                self.longest[name] = now - self.mark
            self.phase_name, self.mark = previous, now

    def timeout_for(self, phase: str) -> float:
        s = self.settings
        if phase == "start-up":
            return s.startup_s
        if phase == "step":
            return max(s.step_s, s.factor * self.longest["step"])
        return max(s.checkpoint_s, s.factor * self.longest["checkpoint"])

    def _test_hook(self, step: int) -> None:
        kind, rank, value = self.test_action
        if rank != self.rank:
            return
        if kind == "slow":
            time.sleep(value)
        elif step == int(value):
            if kind == "hang":
                while True:
                    time.sleep(3600)
            _hold_the_interpreter_lock(3600)

    # -- the watchdog thread -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.interval):
            try:
                self._tick(time.monotonic())
            except Exception as exc:   # never let the watchdog itself take the job down
                self.emit_fn(f"{self.prefix} watchdog: internal error {type(exc).__name__}: {exc}; watchdog off")
                return

    def _state(self, now: float) -> dict:
        phase, mark, step = self.phase_name, self.mark, self.last_step
        return {"step": step, "phase": phase, "elapsed": now - mark, "timeout": self.timeout_for(phase),
                "waiting": waiting_in_communication(main_thread_frame()), "expired": self.expired_at is not None}

    def _tick(self, now: float) -> None:
        state = self._state(now)
        if self.expired_at is None and state["elapsed"] > state["timeout"]:
            self._expire(now, state)
            state["expired"] = True
        if self.channel is None:
            if self.expired_at is not None and now - self.expired_at > self.settings.grace:
                self._end([self.rank], "no progress" if self.size == 1 else
                          "no progress (ranks not compared: MPI without MPI_THREAD_MULTIPLE)", {self.rank: state})
        elif self.rank == 0:
            self._states[0] = {**state, "received": now}
            self._receive(now)
            self._judge(now)
        else:
            if self.channel.iprobe(source=0, tag=_VERDICT):
                self._exit_on_verdict()
            self._publish(state)
            if self.expired_at is not None and now - self.expired_at > 3 * self.settings.grace + 5:
                self._end([0], "rank 0 gave no verdict (its watchdog cannot run)", {self.rank: state})
        if self.expired_at is None:
            self._arm_faulthandler(state["timeout"] - state["elapsed"])

    def _arm_faulthandler(self, remaining: float) -> None:
        # A C thread that dumps every thread's stack if this Python thread stops re-arming it (the main
        # thread holds the interpreter lock): the only stack a GIL-bound hang can give.
        try:
            faulthandler.dump_traceback_later(max(1.0, remaining) + 2 * self.settings.grace, repeat=False,
                                              file=sys.stderr)
        except Exception:
            pass

    def _expire(self, now: float, state: dict) -> None:
        self.expired_at = now
        with contextlib.suppress(Exception):
            faulthandler.cancel_dump_traceback_later()   # this thread can still report: no C-level dump
        frame = main_thread_frame()
        stack = format_stack(frame)
        waiting = "waiting in communication" if state["waiting"] else "not in communication"
        text = (f"{self.prefix} watchdog: no progress for {state['elapsed']:.1f} s in phase {state['phase']} "
                f"(timeout {state['timeout']:.1f} s), last completed step {state['step']}, on node "
                f"{self.hosts[self.rank]}, {waiting}; main thread:\n{stack.rstrip()}")
        self.emit_fn(text)
        report = {**state, "rank": self.rank, "host": self.hosts[self.rank], "stack": stack}
        if self.channel is None or self.rank == 0:
            self._reports[self.rank] = report
        else:
            self._report_request = self.channel.isend(report, dest=0, tag=_REPORT)

    def _publish(self, state: dict, done: bool = False) -> None:
        if self._send_request is not None and not self._send_request.Test():
            return   # rank 0 has not taken the last one yet: never queue heartbeats up
        self._sequence += 1
        self._send_buffer[:] = (self._sequence, state["step"], PHASES.index(state["phase"]), state["elapsed"],
                                state["timeout"], state["waiting"], state["expired"], done)
        self._send_request = self.channel.Isend(self._send_buffer, dest=0, tag=_HEARTBEAT)

    def _post_receive(self, source: int) -> None:
        buffer = np.zeros(_FIELDS)
        self._receives[source] = (self.channel.Irecv(buffer, source=source, tag=_HEARTBEAT), buffer)

    def _receive(self, now: float) -> set:
        """Take every heartbeat that arrived; returns the ranks whose last one said they are done."""
        done = set()
        for source in list(self._receives):
            request, buffer = self._receives[source]
            while request.Test():
                values = buffer.copy()
                self._states[source] = {"step": int(values[1]), "phase": PHASES[int(values[2])],
                                        "elapsed": values[3], "timeout": values[4], "waiting": bool(values[5]),
                                        "expired": bool(values[6]), "received": now}
                if values[7]:
                    done.add(source)
                    del self._receives[source]
                    break
                self._post_receive(source)
                request, buffer = self._receives[source]
        while self.channel.iprobe(tag=_REPORT):
            report = self.channel.recv(tag=_REPORT)
            self._reports[report["rank"]] = report
        return done

    def _judge(self, now: float) -> None:
        grace = self.settings.grace
        if self._triggered_at is None:
            expired = any(state["expired"] for state in self._states.values())
            # A rank that should have expired by now but says nothing: its watchdog thread cannot run.
            overdue = [rank for rank, state in self._states.items()
                       if now - state["received"] > state["timeout"] - state["elapsed"] + 2 * grace]
            if expired or overdue:
                self._triggered_at = now
            return
        if now - self._triggered_at < grace:
            return
        live = {rank: state for rank, state in self._states.items()
                if now - state["received"] <= max(4 * self.settings.interval, 2.0)}
        ranks, reason = name_stuck_ranks(live, self.size)
        shown = {rank: {**self._states[rank], "silent_s": None if rank in live else now - self._states[rank]["received"]}
                 for rank in ranks if rank in self._states}
        self._end(ranks, reason, shown)

    def _end(self, ranks: list[int], reason: str, states: dict) -> None:
        """Print the one-line summary, write ``hang.json`` and end the job with :data:`EXIT_HANG`."""
        line = hang_summary(ranks, reason, self.hosts, states, self.size)
        self.verdict = {"stuck_ranks": ranks, "stuck_nodes": sorted({self.hosts[r] for r in ranks}), "reason": reason,
                        "summary": line, "exclude_nodes": sorted({self.hosts[r] for r in ranks}),
                        "exit_code": EXIT_HANG, "reported_by": self.rank, "settings": asdict(self.settings),
                        "ranks": {str(r): {k: v for k, v in s.items() if k != "received"}
                                  for r, s in self._states.items()},
                        "reports": {str(r): report for r, report in self._reports.items()}}
        self.emit_fn(f"{self.prefix} watchdog: {line}; ending the job (exit {EXIT_HANG})")
        if self.output is not None:
            self._write_verdict()
        self._stop.set()
        if self.channel is not None and self.rank == 0:
            # Every rank that can still act aborts with EXIT_HANG itself, so the launcher reports that code
            # (after one MPI_Abort it may report the signal that killed another rank); then this rank's
            # abort ends those that cannot act.
            requests = [self.channel.isend(EXIT_HANG, dest=rank, tag=_VERDICT) for rank in range(1, self.size)]
            deadline = time.monotonic() + 2 * self.settings.interval + 0.5
            while time.monotonic() < deadline:
                time.sleep(0.05)
            del requests
        self.abort_fn(EXIT_HANG)

    def _write_verdict(self) -> None:
        """Write ``hang.json`` from this rank, whole or not at all.

        Whichever rank ends the job writes it: rank 0 normally; every other rank when rank 0 itself is
        stuck (then each names rank 0), or without ``MPI_THREAD_MULTIPLE``. Each writes a file of its own
        and renames it over ``hang.json``, so concurrent writers leave one complete verdict (the last).
        """
        path = os.path.join(str(self.output), "hang.json")
        partial = f"{path}.rank{self.rank}.tmp"
        try:
            with open(partial, "w") as handle:
                json.dump(self.verdict, handle, indent=2, default=str)
            os.replace(partial, path)
        except OSError as exc:
            self.emit_fn(f"{self.prefix} watchdog: could not write the hang report {path}: {exc}")

    def _exit_on_verdict(self) -> None:
        """Rank 0 ended the job: abort from this rank too, with :data:`EXIT_HANG`."""
        self.channel.recv(source=0, tag=_VERDICT)
        self.emit_fn(f"{self.prefix} watchdog: rank 0 ended the hung job (exit {EXIT_HANG})")
        self._stop.set()
        self.abort_fn(EXIT_HANG)

    # -- the end of a run -----------------------------------------------------------------------------------

    def stop(self, graceful: bool = True, timeout: float = 10.0) -> None:
        """Stop the thread. ``graceful`` (every rank stops together): the ranks tell rank 0 they are done
        and rank 0 takes every message still on the way, so no request is left open at ``MPI_Finalize``."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.settings.interval))
        self._thread = None
        with contextlib.suppress(Exception):
            faulthandler.cancel_dump_traceback_later()
        if not graceful or self.channel is None:
            return
        deadline = time.monotonic() + timeout
        if self.rank != 0:
            while self._send_request is not None and not self._send_request.Test() and time.monotonic() < deadline:
                time.sleep(0.001)
            self._send_request = None
            self._publish({"step": self.last_step, "phase": "finish", "elapsed": 0.0, "timeout": 0.0,
                           "waiting": False, "expired": False}, done=True)
            while not self._send_request.Test() and time.monotonic() < deadline:
                time.sleep(0.001)
        else:
            while self._receives and time.monotonic() < deadline:
                self._receive(time.monotonic())
                time.sleep(0.001)
            for request, _ in self._receives.values():   # a rank that never said goodbye (timed out)
                with contextlib.suppress(Exception):
                    request.Cancel()
            self._receives.clear()

    def summary(self) -> dict:
        """This rank's settings and measured phases, for the run's JSON summary."""
        return {"enabled": True, "settings": asdict(self.settings), "interval_s": self.settings.interval,
                "longest_step_s": self.longest["step"], "longest_checkpoint_s": self.longest["checkpoint"],
                "step_timeout_s": self.timeout_for("step"), "checkpoint_timeout_s": self.timeout_for("checkpoint"),
                "cross_rank": self.channel is not None or self.size == 1}

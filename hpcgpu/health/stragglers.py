"""Straggler detection: a rank that is persistently slower than the others, named while the run goes on.

In a job whose ranks step together, a slow rank does not show in the step rate of any one rank: all
ranks wait for it. What differs is where the time goes. Each rank's *own time* per step is its wall
time minus the time it spent in the ``communication`` phase (:class:`hpcgpu.app.timers.PhaseTimers`):
the fast ranks wait there for the slow one, the slow one hardly waits. Every ``every`` steps the ranks
gather their own time per step (one ``allgather`` of one number: negligible next to the steps it
covers); a rank above the median by more than ``margin`` (a fraction) in ``windows`` consecutive
comparisons is a straggler. It is named once in the progress output (rank 0), with its GPU's clocks,
temperature and throttle reasons when NVML can read them, and in the run's summary.
"""

from __future__ import annotations

import statistics
import time

#: Own time per step below this difference from the median is noise, whatever the ratio (seconds).
MIN_DIFFERENCE_S = 20e-6


class StragglerDetector:
    """Compares the ranks' own time per step every ``every`` steps (collective at those steps).

    Parameters
    ----------
    comm : hpcgpu.Communicator
    every : int
        Steps per comparison (0: off).
    margin : float
        A rank is slow in a comparison when its own time per step exceeds the median by this fraction.
    windows : int
        Consecutive slow comparisons that make a straggler.
    gpu_reading_fn : callable, optional
        ``gpu_reading_fn() -> dict`` of this rank's GPU (clocks, temperature, throttle reasons), asked on
        the straggler's rank when it is named; None without a GPU or NVML.
    emit_fn : callable, optional
        Prints a line on rank 0 (default: stdout, flushed).
    """

    def __init__(self, comm, every: int = 100, margin: float = 0.2, windows: int = 3, hosts=None,
                 gpu_reading_fn=None, emit_fn=None):
        self.comm, self.every, self.margin, self.windows = comm, int(every), float(margin), int(windows)
        self.hosts = hosts if hosts is not None else comm.mpi.allgather(comm.hostname)
        self.gpu_reading_fn = gpu_reading_fn
        self.emit_fn = emit_fn or (lambda line: print(line, flush=True))
        self.counts = [0] * comm.size
        self.named: dict[int, dict] = {}
        self.comparisons = 0
        self.last_values: list[float] | None = None
        self._mark = None   # (step, wall seconds, communication seconds) at the last comparison
        self._next = None

    @property
    def enabled(self) -> bool:
        return self.every > 0 and self.comm.size > 1

    def step_done(self, step: int, timers) -> None:
        """After a step (or a CUDA graph's steps) reaching ``step``: compare when a multiple of ``every``
        was passed (the same steps on every rank, so the gather is collective)."""
        if not self.enabled:
            return
        if self._next is None:
            self._next = (step // self.every + 1) * self.every
            self._mark = (step, time.perf_counter(), _waiting_seconds(timers))
            return   # the first window starts after the first step (compilation is not a step)
        if step < self._next:
            return
        self._next = (step // self.every + 1) * self.every
        now, communication = time.perf_counter(), _waiting_seconds(timers)
        steps = step - self._mark[0]
        own = ((now - self._mark[1]) - (communication - self._mark[2])) / max(1, steps)
        self._mark = (step, now, communication)
        self.compare(self.comm.mpi.allgather(own), step)

    def compare(self, values: list[float], step: int) -> list[int]:
        """Fold one comparison of own times per step (seconds, by rank) in; returns newly named ranks.

        Collective when a rank is newly named (its GPU reading is broadcast from it)."""
        self.comparisons += 1
        self.last_values = list(values)
        median = statistics.median(values)
        for rank, value in enumerate(values):
            slow = value > median * (1 + self.margin) and value - median > MIN_DIFFERENCE_S
            self.counts[rank] = self.counts[rank] + 1 if slow else 0
        new = [rank for rank, count in enumerate(self.counts) if count >= self.windows and rank not in self.named]
        for rank in new:
            reading = None
            if self.comm.size > 1:
                mine = self._reading() if self.comm.rank == rank else None
                reading = self.comm.mpi.bcast(mine, root=rank)
            else:
                reading = self._reading()
            record = {"rank": rank, "host": self.hosts[rank], "step": step,
                      "own_seconds_per_step": values[rank], "median_seconds_per_step": median,
                      "slower_by": values[rank] / median - 1 if median > 0 else None, "gpu": reading}
            self.named[rank] = record
            if self.comm.rank == 0:
                self.emit_fn(straggler_line(record, self.windows, self.every))
        return new

    def _reading(self):
        if self.gpu_reading_fn is None:
            return None
        try:
            return self.gpu_reading_fn()
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def summary(self) -> dict:
        return {"every_steps": self.every, "margin": self.margin, "windows": self.windows,
                "comparisons": self.comparisons, "stragglers": list(self.named.values()),
                "last_own_seconds_per_step": self.last_values}


def _waiting_seconds(timers) -> float:
    """Seconds this rank spent so far in phases that are not its own work: communication and I/O."""
    return timers.totals.get("communication", 0.0) + timers.totals.get("io", 0.0)


def straggler_line(record: dict, windows: int, every: int) -> str:
    """``straggler: rank 3 on node gpu07: 41% slower than the median ...; GPU: SM 1410 MHz, 83 °C, ...``."""
    slower = record["slower_by"]
    text = (f"straggler: rank {record['rank']} on node {record['host']}: "
            + (f"{100 * slower:.0f}% slower than the median rank" if slower is not None else "slower")
            + f" ({1e3 * record['own_seconds_per_step']:.3f} ms of its own per step against "
            f"{1e3 * record['median_seconds_per_step']:.3f} ms) in {windows} comparisons of {every} steps, "
            f"up to step {record['step']}")
    gpu = record.get("gpu")
    if gpu:
        parts = []
        if "sm_clock_mhz" in gpu:
            parts.append(f"SM {gpu['sm_clock_mhz']:.0f} MHz")
        if "temperature_c" in gpu:
            parts.append(f"{gpu['temperature_c']:.0f} °C")
        if gpu.get("throttle_reasons"):
            parts.append("clock reasons " + ", ".join(gpu["throttle_reasons"]))
        if "error" in gpu:
            parts.append(f"NVML: {gpu['error']}")
        text += "; GPU: " + ("; ".join(parts) or "no readings")
    return text

"""Per-phase timers: where the time of a run goes (compute, communication, I/O, host overhead).

On a GPU a phase is timed with CUDA events recorded on the compute stream around the work it
enqueues, so the number is device time, not the (asynchronous) host time to launch it. Events are
resolved in batches, so timing does not force a synchronisation every step. On the CPU the host
clock is used. Each phase is also an NVTX range when NVTX is available, so Nsight Systems timelines
carry the same names.

Across ranks :meth:`PhaseTimers.summary` reports min / mean / max of every phase and the
imbalance ``max / mean - 1``.
"""

from __future__ import annotations

import contextlib
import time

_RESOLVE_EVERY = 256


def _nvtx():
    try:
        from cupy.cuda import nvtx

        return nvtx.RangePush, nvtx.RangePop
    except Exception:
        return None


class PhaseTimers:
    """Accumulated seconds per named phase on this rank.

    Parameters
    ----------
    arch : hpcgpu.arch.CPU or GPU
    """

    def __init__(self, arch):
        self.arch = arch
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._pending: list[tuple[str, object, object]] = []
        self._free_events: list = []
        self._nvtx = _nvtx() if arch.is_gpu else None
        self.wall_started = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str, stream=None):
        """Time the work enqueued inside the block as phase ``name``.

        ``stream``: the CUDA stream the work goes to (default: the compute stream).
        """
        self.counts[name] = self.counts.get(name, 0) + 1
        if self._nvtx:
            self._nvtx[0](name)
        if self.arch.is_gpu:
            import cupy

            stream = stream or self.arch.compute_stream
            start = self._event(cupy)
            start.record(stream)
            try:
                yield
            finally:
                stop = self._event(cupy)
                stop.record(stream)
                self._pending.append((name, start, stop))
                if len(self._pending) >= _RESOLVE_EVERY:
                    self.resolve()
                if self._nvtx:
                    self._nvtx[1]()
        else:
            started = time.perf_counter()
            try:
                yield
            finally:
                self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - started

    @contextlib.contextmanager
    def range(self, name: str):
        """An NVTX range only (no timing): marks a whole step in Nsight Systems timelines."""
        if self._nvtx:
            self._nvtx[0](name)
        try:
            yield
        finally:
            if self._nvtx:
                self._nvtx[1]()

    def _event(self, cupy):
        # Creating a CUDA event costs microseconds; resolved events are reused.
        return self._free_events.pop() if self._free_events else cupy.cuda.Event()

    def reset(self) -> None:
        """Forget everything timed so far (work before the timed loop: set-up, initial output).

        Call it where the run's wall clock starts, so that the phases and the wall time cover the same
        interval and the shares of wall time add up to 100%.
        """
        self.resolve()
        self.totals.clear()
        self.counts.clear()
        self.wall_started = time.perf_counter()

    def add(self, name: str, seconds: float) -> None:
        """Add host-measured seconds to a phase (for work timed elsewhere)."""
        self.totals[name] = self.totals.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + 1

    def resolve(self) -> None:
        """Turn recorded event pairs into seconds (waits for the last one)."""
        if not self._pending:
            return
        import cupy

        self._pending[-1][2].synchronize()
        for name, start, stop in self._pending:
            self.totals[name] = self.totals.get(name, 0.0) + cupy.cuda.get_elapsed_time(start, stop) / 1e3
            self._free_events += (start, stop)
        self._pending.clear()

    def local(self, wall_seconds: float | None = None) -> dict[str, float]:
        """Seconds per phase on this rank, with ``host overhead`` = wall time not in any phase.

        ``wall_seconds``: the run's wall time (default: since the timers were created).
        """
        self.resolve()
        result = dict(self.totals)
        wall = time.perf_counter() - self.wall_started if wall_seconds is None else wall_seconds
        result["host overhead"] = max(0.0, wall - sum(self.totals.values()))
        return result

    def summary(self, comm, wall_seconds: float | None = None) -> dict[str, dict[str, float]]:
        """Collective: ``{phase: {min, mean, max, imbalance}}`` in seconds over all ranks."""
        everyone = comm.mpi.allgather(self.local(wall_seconds))
        names = sorted({name for timings in everyone for name in timings})
        result = {}
        for name in names:
            values = [timings.get(name, 0.0) for timings in everyone]
            mean = sum(values) / len(values)
            result[name] = {
                "min": min(values), "mean": mean, "max": max(values),
                "imbalance": (max(values) / mean - 1.0) if mean > 0 else 0.0,
            }
        return result


def format_timers(summary: dict[str, dict[str, float]], wall_seconds: float) -> str:
    """A small table: phase, min/mean/max seconds, share of wall time, imbalance.

    The phases must not overlap and must be timed inside the ``wall_seconds`` interval (see
    :meth:`PhaseTimers.reset`); then the shares (``host overhead`` included) add up to 100%.
    """
    lines = [f"{'phase':<16} {'min s':>9} {'mean s':>9} {'max s':>9} {'% wall':>7} {'imbal.':>7}"]
    for name, row in summary.items():
        share = 100 * row["mean"] / wall_seconds if wall_seconds > 0 else 0.0
        lines.append(f"{name:<16} {row['min']:>9.3f} {row['mean']:>9.3f} {row['max']:>9.3f} {share:>6.1f}% {100 * row['imbalance']:>6.1f}%")
    return "\n".join(lines)

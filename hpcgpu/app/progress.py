"""A progress line on rank 0: step, percentage, rate, time left.

On a terminal the line is redrawn in place (at most ~4 times a second); in a log file (Slurm output)
a new line is printed about every 10% or every 30 s, whichever comes first.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """Progress of ``total`` units (steps) on rank 0.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    total : int
    unit : str
        Name of one unit in the rate ("steps").
    enabled : bool
        False prints nothing (``--quiet``).
    first : int
        Units already done (a restart).
    """

    def __init__(self, comm, total: int, unit: str = "steps", enabled: bool = True, first: int = 0, stream=None):
        self.enabled = enabled and comm.rank == 0 and total > 0
        self.total, self.unit, self.first = total, unit, first
        self.stream = stream or sys.stdout
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self._last_print, self._last_fraction = 0.0, -1.0

    def update(self, done: int, extra: str = "") -> None:
        """Report that ``done`` units are complete (absolute count)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        fraction = done / self.total
        if self.interactive:
            if now - self._last_print < 0.25 and done < self.total:
                return
        elif not (done >= self.total or fraction - self._last_fraction >= 0.1 or now - self._last_print >= 30):
            return
        self._last_print, self._last_fraction = now, fraction
        elapsed = now - self.started
        rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / rate if rate > 0 else float("nan")
        width = 24
        bar = "#" * int(width * fraction) + "." * (width - int(width * fraction))
        text = f"[{bar}] {done}/{self.total} {self.unit} {100 * fraction:5.1f}%  {rate:,.1f} {self.unit}/s  left {_duration(left)}"
        if extra:
            text += f"  {extra}"
        if self.interactive:
            self.stream.write("\r" + text + ("\n" if done >= self.total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

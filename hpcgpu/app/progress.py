"""A progress line on rank 0: step, percentage, rate, time left.

On a terminal the line is redrawn in place (at most ~4 times a second); in a log file (Slurm output)
a new line is printed about every 10% or every 30 s, whichever comes first.

The rate and the time left are measured from the end of the first reported step on: the first step
pays for kernel compilation, NCCL set-up and caches, and an estimate from it alone would promise hours
for a run of seconds. Until :data:`MIN_TIMED_STEPS` steps or :data:`MIN_TIMED_SECONDS` seconds have
been timed after it, the line says ``left ?`` (warming up).

Rates are printed with an SI prefix chosen from the value (:func:`format_rate`): ``1.65 k steps/s``,
``3.47 M cell-updates/s``, ``13.6 G cell-updates/s``, so a small run never reads ``0.000 G...``.
"""

from __future__ import annotations

import sys
import time

#: Steps timed after the first one before a rate and time left are shown ...
MIN_TIMED_STEPS = 3
#: ... or seconds timed after the first step (with at least one step), for slow steps.
MIN_TIMED_SECONDS = 2.0


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
        self._mark = None   # (time, done) at the end of the first reported step: the warm-up

    def rate(self, done: int, now: float) -> float | None:
        """Units per second since the warm-up step, or None while too little has been timed."""
        if self._mark is None:
            return None
        timed_steps, timed_seconds = done - self._mark[1], now - self._mark[0]
        if timed_seconds <= 0 or timed_steps < 1:
            return None
        if timed_steps < MIN_TIMED_STEPS and timed_seconds < MIN_TIMED_SECONDS:
            return None
        return timed_steps / timed_seconds

    def update(self, done: int, extra: str = "") -> None:
        """Report that ``done`` units are complete (absolute count)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._mark is None:
            self._mark = (now, done)
        fraction = done / self.total
        if self.interactive:
            if now - self._last_print < 0.25 and done < self.total:
                return
        elif not (done >= self.total or fraction - self._last_fraction >= 0.1 or now - self._last_print >= 30):
            return
        self._last_print, self._last_fraction = now, fraction
        rate = self.rate(done, now)
        if rate is None and done >= self.total:
            elapsed = now - self.started   # a run too short to time: the average over all of it
            rate = (done - self.first) / elapsed if elapsed > 0 and done > self.first else None
        left = 0.0 if done >= self.total else ((self.total - done) / rate if rate else float("nan"))
        width = 24
        bar = "#" * int(width * fraction) + "." * (width - int(width * fraction))
        rate_text = format_rate(rate, f"{self.unit}/s") if rate else f"- {self.unit}/s (warming up)"
        text = f"[{bar}] {done}/{self.total} {self.unit} {100 * fraction:5.1f}%  {rate_text}  left {_duration(left)}"
        if extra:
            text += f"  {extra}"
        if self.interactive:
            self.stream.write("\r" + text + ("\n" if done >= self.total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


#: SI prefixes for :func:`format_rate`, largest first.
_SI_PREFIXES = (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def format_rate(value: float, unit: str, digits: int = 3) -> str:
    """A rate with an SI prefix chosen from its size, to ``digits`` significant digits.

    Parameters
    ----------
    value : float
        The rate, in ``unit`` (for example cell updates per second).
    unit : str
        The unit, written after the prefix and a space: ``"cell-updates/s"``.
    digits : int
        Significant digits (at least 1).

    Returns
    -------
    str
        The value scaled into [1, 1000) with its prefix (k, M, G, T, P); values below 1000 get none.

    Examples
    --------
    >>> format_rate(3.4712e6, "cell-updates/s")
    '3.47 M cell-updates/s'
    >>> format_rate(1.3612e10, "cell-updates/s")
    '13.6 G cell-updates/s'
    >>> format_rate(812.4, "steps/s")
    '812 steps/s'
    >>> format_rate(0.25, "steps/s")
    '0.250 steps/s'
    """
    digits = max(1, digits)
    if value != value or abs(value) == float("inf"):
        return f"{value} {unit}"
    rounded = abs(float(f"{value:.{digits}g}"))   # round first: 999,960 is "1 M", not "1e+03 k"
    prefix, scale = "", 1.0
    for candidate, candidate_scale in _SI_PREFIXES:
        if rounded >= candidate_scale:
            prefix, scale = f"{candidate} ", candidate_scale
            break
    text = f"{value / scale:#.{digits}g}".rstrip(".")   # '#': keep trailing zeros, "2.00", "1.90 k"
    if "e" in text:   # beyond the largest prefix: a plain exponent, all digits kept
        text = f"{value / scale:.{digits - 1}e}"
    return f"{text} {prefix}{unit}"


def steps_text(first_step: int, final_step: int) -> str:
    """A header's step count: the steps this job will run, and their absolute range after a restart."""
    if first_step == 0:
        return f"{final_step}"
    return f"{max(0, final_step - first_step)} (continuing from step {first_step} to step {final_step})"


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

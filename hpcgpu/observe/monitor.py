"""Watching the GPUs while a run steps (``--monitor``) and capturing a timeline (``--profile``).

A slow multi-GPU run is not always slow because of the code: a GPU that runs hot lowers its clocks,
one that hits its power limit does too, and a rank whose GPU is idle half the time waits for the
others. :class:`GpuMonitor` starts a daemon thread on each rank that asks NVML, every ``interval``
seconds, about *this rank's own* GPU (found by PCI bus id, which names a device uniquely whatever
``CUDA_VISIBLE_DEVICES`` says): utilisation, memory, temperature, power, clocks and the reasons the
clocks are held down. It prints one rank-prefixed warning when a condition starts (hotter than
85 °C, a thermal or power throttle) and keeps running min / mean / max of every metric, so memory
stays constant however long the run. The thread never calls MPI (MPI is not guaranteed to be
thread-safe here); :meth:`GpuMonitor.summary` is the collective that gathers the ranks' records
after the thread has stopped.

Without a GPU, or without NVML (``pip install nvidia-ml-py``), the monitor is a no-op whose summary
says why.

``--profile`` (:mod:`hpcgpu.observe.profiling`) prints the exact Nsight Systems command that records a
timeline of the same run (CUDA API and kernels, NVTX ranges named after the phases of
:mod:`hpcgpu.app.timers`, MPI calls), one report per rank, and exits. See ``docs/profiling.md``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from hpcgpu.observe.nvml_sample import HARMFUL_THROTTLE_REASONS, METRICS, read_sample

DEFAULT_TEMPERATURE_LIMIT = 85.0
#: A condition that comes and goes (power capping under a bursty load) is printed this many times,
#: then only counted (``onsets`` in the summary).
PRINTED_ONSETS = 3


class _RunningStats:
    """min / mean / max of a stream of numbers without keeping them."""

    def __init__(self):
        self.minimum, self.maximum, self.total, self.count = float("inf"), float("-inf"), 0.0, 0

    def add(self, value: float) -> None:
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.total += value
        self.count += 1

    def as_dict(self) -> dict:
        return {"min": self.minimum, "mean": self.total / self.count, "max": self.maximum}


def _import_pynvml():
    import pynvml

    return pynvml


class GpuMonitor:
    """Background NVML sampling of this rank's GPU, with warnings and an end-of-run summary.

    Use as a context manager or with :meth:`start` / :meth:`stop`; :meth:`summary` is collective.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        Only ``comm.prefix`` is used at construction (the thread never touches the communicator).
    arch : hpcgpu.arch.CPU or GPU
        ``arch.is_gpu`` and, on a GPU, ``arch.identity.pci_bus_id`` select the device.
    interval : float
        Seconds between samples.
    enabled : bool
        False gives the no-op monitor (``reason`` says the monitor was not asked for).
    nvml : module-like, optional
        An object with pynvml's functions (tests inject a fake); default: ``import pynvml``.
    temperature_limit : float
        Warn when the GPU is hotter than this (°C).
    emit_fn : callable, optional
        Called with each warning line (default: print to stderr, flushed).

    Attributes
    ----------
    active : bool
        Whether this rank samples a GPU; when False, ``reason`` says why.
    """

    def __init__(self, comm, arch, interval: float = 1.0, *, enabled: bool = True, nvml=None,
                 temperature_limit: float = DEFAULT_TEMPERATURE_LIMIT, emit_fn=None):
        if not interval > 0:
            raise ValueError(f"GpuMonitor interval: expected seconds > 0, found {interval}")
        self.prefix = getattr(comm, "prefix", "")
        self.interval = float(interval)
        self.requested = enabled
        self.temperature_limit = float(temperature_limit)
        self.emit_fn = emit_fn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.active, self.reason, self.device = False, None, None
        self._nvml = self._handle = self._thread = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats = {name: _RunningStats() for name in METRICS}
        self._reason_counts: dict[str, int] = {}
        self._conditions: set[str] = set()
        self.onsets: dict[str, int] = {}
        self.warnings: list[str] = []
        self.n_samples = self.n_errors = 0
        self._started = time.monotonic()
        self.last_summary = None
        if not enabled:
            self.reason = "not requested (run with --monitor)"
        elif not getattr(arch, "is_gpu", False):
            self.reason = "no GPU (the CPU backend is in use)"
        else:
            self._open(arch, nvml)

    def _open(self, arch, nvml) -> None:
        try:
            nvml = nvml if nvml is not None else _import_pynvml()
        except Exception as exc:
            self.reason = f"NVML not available ({type(exc).__name__}: {exc}; pip install nvidia-ml-py)"
            return
        self.device = arch.identity.pci_bus_id
        try:
            nvml.nvmlInit()
            self._handle = nvml.nvmlDeviceGetHandleByPciBusId(self.device)
        except Exception as exc:
            self.reason = f"NVML not available ({type(exc).__name__}: {exc})"
            return
        self._nvml, self.active = nvml, True

    @classmethod
    def from_options(cls, comm, arch, options) -> GpuMonitor:
        """The monitor an app asked for with ``--monitor`` / ``--monitor-interval``, already started."""
        return cls(comm, arch, interval=getattr(options, "monitor_interval", 1.0),
                   enabled=bool(getattr(options, "monitor", False))).start()

    # -- the sampling thread -------------------------------------------------------------------------

    def start(self) -> GpuMonitor:
        """Start sampling (a no-op when inactive or already running); returns self."""
        if self.active and self._handle is not None and self._thread is None:
            self._stop.clear()
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._loop, name="hpcgpu-gpu-monitor", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        # A daemon thread: it must never block the process from exiting, and never call MPI.
        while True:
            self.sample_once()
            if self._stop.wait(self.interval):
                return

    def sample_once(self) -> dict | None:
        """Take one sample now, fold it into the statistics and warn on new conditions.

        Returns the sample, or None when it could not be read (counted in ``n_errors``).
        """
        if not self.active or self._handle is None:
            return None
        try:
            sample = read_sample(self._nvml, self._handle)
        except Exception:
            sample = {}
        with self._lock:
            if not sample:
                self.n_errors += 1
                return None
            self.n_samples += 1
            for name, stats in self._stats.items():
                if name in sample:
                    stats.add(sample[name])
            for reason in sample.get("throttle_reasons", ()):
                self._reason_counts[reason] = self._reason_counts.get(reason, 0) + 1
            self._check_conditions(sample)
        return sample

    def _check_conditions(self, sample: dict) -> None:
        """Warn once at the onset of each condition (it may warn again after it cleared)."""
        elapsed = time.monotonic() - self._started
        current, messages = set(), {}
        temperature = sample.get("temperature_c")
        if temperature is not None and temperature > self.temperature_limit:
            current.add("hot")
            messages["hot"] = f"at {temperature:.0f} °C, above {self.temperature_limit:.0f} °C"
        for reason in sample.get("throttle_reasons", ()):
            if reason in HARMFUL_THROTTLE_REASONS:
                current.add(reason)
                messages[reason] = f"clocks throttled: {reason} ({HARMFUL_THROTTLE_REASONS[reason]})"
        for condition in sorted(current - self._conditions):
            self.onsets[condition] = count = self.onsets.get(condition, 0) + 1
            if count > PRINTED_ONSETS:
                continue
            line = f"{self.prefix} warning: GPU {self.device} {messages[condition]} at t = {elapsed:.0f} s".lstrip()
            if count == PRINTED_ONSETS:
                line += " (further onsets of this condition are counted, not printed)"
            self.warnings.append(line)
            self.emit_fn(line)
        self._conditions = current

    def stop(self) -> None:
        """Stop the thread (returns within about one NVML query, not one interval) and release NVML."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(5.0, 2 * self.interval))
            self._thread = None
        if self._nvml is not None and self._handle is not None:
            self._handle = None
            try:
                self._nvml.nvmlShutdown()   # NVML counts nvmlInit calls; this undoes ours only
            except Exception:
                pass

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> GpuMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- results ----------------------------------------------------------------------------------------

    def local_summary(self) -> dict:
        """This rank's record: device, sample counts, ``{metric: {min, mean, max}}``, throttling, warnings."""
        with self._lock:
            return {
                "active": self.active,
                "reason": self.reason,
                "device": self.device,
                "n_samples": self.n_samples,
                "n_errors": self.n_errors,
                "metrics": {name: s.as_dict() for name, s in self._stats.items() if s.count},
                "throttle_reasons": {name: count / self.n_samples for name, count in sorted(self._reason_counts.items())},
                "warnings": list(self.warnings),
                "onsets": dict(self.onsets),
            }

    def summary(self, comm) -> dict:
        """Collective: every rank's record and the min / mean / max over ranks (call after :meth:`stop`).

        Returns
        -------
        dict
            ``enabled`` (any rank sampled), ``reason`` (why not, when none did), ``interval_s``,
            ``temperature_limit_c``, ``ranks`` (one record per rank, see :meth:`local_summary`),
            ``overall`` (``{metric: {min, mean, max}}`` over ranks) and ``warnings`` (all ranks).
        """
        ranks = comm.mpi.allgather(self.local_summary())
        for rank, record in enumerate(ranks):
            record["rank"] = rank
        sampled = [r for r in ranks if r["active"] and r["metrics"]]
        overall = {}
        for name in METRICS:
            rows = [r["metrics"][name] for r in sampled if name in r["metrics"]]
            if rows:
                overall[name] = {"min": min(r["min"] for r in rows), "mean": sum(r["mean"] for r in rows) / len(rows),
                                 "max": max(r["max"] for r in rows)}
        reason = None
        if not sampled:
            reasons = sorted({r["reason"] or "no samples taken (run shorter than one NVML query?)" for r in ranks})
            reason = "; ".join(reasons)
        return {
            "enabled": bool(sampled), "reason": reason, "interval_s": self.interval,
            "temperature_limit_c": self.temperature_limit, "ranks": ranks, "overall": overall,
            "warnings": [line for r in ranks for line in r["warnings"]],
        }

    def finish(self, comm) -> dict:
        """Collective: stop and return ``{"gpu_monitor": summary}`` for the JSON summary (``{}`` if not requested)."""
        self.stop()
        if not self.requested:
            return {}
        self.last_summary = self.summary(comm)
        return {"gpu_monitor": self.last_summary}

    def print_table(self) -> None:
        """Print the table of the last :meth:`finish` (call on rank 0); nothing when not requested."""
        if self.last_summary is not None:
            print(format_monitor(self.last_summary))


def _cell(metrics: dict, name: str, field: str, fmt: str) -> str:
    return format(metrics[name][field], fmt) if name in metrics else "-"


def format_monitor(summary: dict) -> str:
    """A short per-rank table of a :meth:`GpuMonitor.summary` (utilisation, memory, heat, power, clocks)."""
    if not summary["enabled"]:
        return f"GPU monitor off: {summary['reason']}"
    lines = [f"GPU monitor (every {summary['interval_s']:g} s; mean/max, memory max/total, SM clock mean/min):",
             f"{'rank':>4} {'GPU':<16} {'samples':>7} {'util %':>9} {'mem GiB':>13} {'temp °C':>9} "
             f"{'power W (limit)':>17} {'SM MHz':>11}  throttled (share of samples)"]
    for record in summary["ranks"]:
        m = record["metrics"]
        if not record["active"]:
            lines.append(f"{record['rank']:>4} off: {record['reason']}")
            continue
        throttled = ", ".join(f"{name} {100 * share:.0f}%" for name, share in record["throttle_reasons"].items()
                              if name in HARMFUL_THROTTLE_REASONS) or "no"
        lines.append(
            f"{record['rank']:>4} {str(record['device']):<16} {record['n_samples']:>7} "
            f"{_cell(m, 'utilization_gpu_percent', 'mean', '.0f'):>4}/{_cell(m, 'utilization_gpu_percent', 'max', '.0f'):<4} "
            f"{_cell(m, 'memory_used_gib', 'max', '.1f'):>6}/{_cell(m, 'memory_total_gib', 'max', '.1f'):<6} "
            f"{_cell(m, 'temperature_c', 'mean', '.0f'):>4}/{_cell(m, 'temperature_c', 'max', '.0f'):<4} "
            f"{_cell(m, 'power_w', 'mean', '.0f'):>5}/{_cell(m, 'power_w', 'max', '.0f'):<4}"
            f"({_cell(m, 'power_limit_w', 'max', '.0f'):>4}) "
            f"{_cell(m, 'sm_clock_mhz', 'mean', '.0f'):>5}/{_cell(m, 'sm_clock_mhz', 'min', '.0f'):<5}  {throttled}"
        )
    count = len(summary["warnings"])
    lines.append(f"warnings: {count} (printed as they happened)" if count else "warnings: none")
    return "\n".join(lines)


# -- command-line wiring shared by the apps --------------------------------------------------------------


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def add_monitor_arguments(parser) -> None:
    """Add ``--monitor``, ``--monitor-interval`` and ``--profile`` to an app's parser."""
    group = parser.add_argument_group("monitoring and profiling (docs/profiling.md)")
    group.add_argument("--monitor", action="store_true",
                       help="sample each rank's GPU with NVML (utilisation, memory, temperature, power, clocks, "
                            "throttling); warn when hot (> 85 C) or throttled; table and JSON at the end")
    group.add_argument("--monitor-interval", type=_positive_seconds, default=1.0, metavar="SECONDS",
                       help="seconds between GPU monitor samples [1]")
    group.add_argument("--profile", action="store_true",
                       help="print the Nsight Systems command (nsys profile -t cuda,nvtx,mpi ...) that records a "
                            "timeline of this run, one report per rank, and exit (under nsys: just run)")

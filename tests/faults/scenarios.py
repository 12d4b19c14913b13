"""Runs whose files a kill must not destroy: one per app and output kind (the tests and the campaign share them).

Each scenario is a command that appends records often and checkpoints now and then, started with
``--restart latest`` as every job of a chain is, so the same command continues after a kill. The
uninterrupted run of the same command is the reference: after a kill the file must hold a prefix of
its records, and after the restart all of them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcgpu.jobs.launch import run_mpi
from hpcgpu.testing import faults

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Scenario:
    """An app run that writes one appendable file.

    ``args`` run under mpiexec (``{out}`` is the output directory); ``file`` is the appended file,
    ``kind`` ``"netcdf"`` or ``"h5md"``; ``records`` the variables (netCDF) or series (H5MD) compared.
    """

    name: str
    args: list[str]
    file: str
    kind: str
    records: list[str]
    n_ranks: int = 2
    env: dict = field(default_factory=dict)

    def command(self, out: Path) -> list[str]:
        return [sys.executable, *[a.replace("{out}", str(out)) for a in self.args]]

    def environment(self) -> dict:
        return dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT), **self.env)

    def run(self, out: Path, timeout: float = 300):
        """Run to the end; returns the launcher's RunResult."""
        return run_mpi(self.n_ranks, self.command(out), timeout=timeout, env=self.environment(), cwd=str(ROOT))

    def read(self, out: Path) -> dict:
        """What the file holds, read with the users' library (raises if it cannot be read)."""
        path = out / self.file
        return faults.netcdf_records(path) if self.kind == "netcdf" else faults.h5md_frames(path)

    def count(self, contents: dict) -> int:
        return faults.record_count(contents, self.records[0])


_CHAIN = ["--restart", "latest", "--quiet", "--output", "{out}", "--checkpoint-dir", "{out}/checkpoints"]

SCENARIOS = {
    "stencil-channel": Scenario(
        "stencil-channel", ["-m", "apps.stencil", "--nx", "96", "--ny", "48", "--steps", "600", "--snapshot-every",
                            "10", "--checkpoint-every", "100", "--no-plot", *_CHAIN],
        "swe.nc", "netcdf", ["time", "h", "u", "v", "zeta"]),
    "stencil-latlon": Scenario(
        "stencil-latlon", ["-m", "apps.stencil", "--grid", "latlon", "--nx", "48", "--ny", "24", "--steps", "400",
                           "--snapshot-every", "10", "--checkpoint-every", "100", "--no-plot", *_CHAIN],
        "latlon.nc", "netcdf", ["time", "h", "u", "v", "zeta"]),
    "md-h5md": Scenario(
        "md-h5md", ["-m", "apps.md", "--cells", "4", "--backend", "numpy", "--thermostat", "langevin", "--steps", "300",
                    "--dump-every", "5", "--checkpoint-every", "50", "--no-plot", *_CHAIN],
        "trajectory.h5md", "h5md", ["particles/all/position/value", "particles/all/velocity/value",
                                    "particles/all/position/step", "observables/total_energy/value"]),
    "user-model": Scenario(
        "user-model", ["examples/gray_scott.py", "--n", "64", "--steps", "800", "--output-every", "10",
                       "--checkpoint-every", "100", *_CHAIN],
        "gray_scott.nc", "netcdf", ["step", "u", "v"]),
}


def header_count(path: Path) -> int:
    """Records a netCDF classic file counts (bytes 4-7 of its header); 0 if it is not there yet."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return 0
    return int.from_bytes(head[4:8], "big") if len(head) == 8 else 0


@dataclass
class KillResult:
    """One kill: how many records the file had, whether they were readable and equal the reference's,
    and whether the restarted job ended with the reference's file."""

    scenario: str
    target: str
    delay: float
    records_after_kill: int | None
    readable: bool
    prefix_equal: bool
    restart_equal: bool
    detail: str = ""

    @property
    def survived(self) -> bool:
        return self.readable and self.prefix_equal

    def as_dict(self) -> dict:
        return {**self.__dict__, "survived": self.survived}


def kill_and_restart(scenario: Scenario, out: Path, reference: dict, delay: float, target="all",
                     after_records: int = 0, log: Path | None = None, sig=signal.SIGKILL) -> KillResult:
    """Start the scenario, kill ``target`` ranks ``delay`` s after its file counts ``after_records``
    records (0: after the ranks have started), check the file, restart, compare with ``reference``.
    ``sig``: SIGKILL (default), or SIGTERM/SIGUSR1 (a stop request: checkpoint, exit 75)."""
    job = faults.start_job(scenario.n_ranks, scenario.command(out), env=scenario.environment(), cwd=str(ROOT),
                           log=log)
    faults.wait_for_ranks(job, scenario.n_ranks)
    if after_records and scenario.kind == "netcdf":
        deadline = time.monotonic() + 120
        while header_count(out / scenario.file) < after_records and job.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
    time.sleep(delay)
    faults.kill_ranks(job, target, sig)
    stopped = faults.finish(job)
    count, readable, prefix, detail = None, True, True, ""
    if (out / scenario.file).exists():
        try:
            contents = scenario.read(out)
            count = scenario.count(contents)
            prefix = faults.is_prefix(contents, reference, scenario.records)
            if not prefix:
                detail = "records differ from the uninterrupted run's"
        except Exception as exc:  # noqa: BLE001 - what a user would see: the file does not open
            readable, prefix, detail = False, False, f"{type(exc).__name__}: {exc}"
    result = scenario.run(out)
    restart_equal = result.returncode == 0
    if not restart_equal:
        detail += f" restart exit {result.returncode}: {result.output[-400:]}"
    else:
        final = scenario.read(out)
        restart_equal = (scenario.count(final) == scenario.count(reference)
                         and faults.is_prefix(final, reference, scenario.records))
        if not restart_equal:
            detail += " the restarted file differs from the uninterrupted run's"
    if sig != signal.SIGKILL and stopped not in (75, 0):
        detail += f" the stop request ended the job with exit {stopped}, not 75"
        readable = False
    return KillResult(scenario.name, str(target), delay, count, readable, prefix, restart_equal, detail.strip())


def reference_contents(scenario: Scenario, out: Path) -> dict:
    result = scenario.run(out)
    if result.returncode != 0:
        raise RuntimeError(f"{scenario.name}: the uninterrupted run failed: {result.output[-2000:]}")
    return scenario.read(out)


__all__ = ["SCENARIOS", "KillResult", "Scenario", "header_count", "kill_and_restart", "reference_contents"]

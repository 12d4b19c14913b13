"""Start a command on N ranks with the local MPI launcher, under a timeout.

Used by the test suite (every multi-rank test runs through :func:`run_mpi`) and by benchmark series.
A run that exceeds its timeout is killed with its whole process group, so a deadlock costs seconds,
not the CI budget.

The launcher is, in order: ``$HPCGPU_MPIEXEC``; the ``mpiexec`` next to the running Python (a venv with
the ``mpich`` extra); ``mpiexec`` on ``PATH``. Extra flags come from ``$HPCGPU_MPIEXEC_FLAGS``; Open MPI
additionally gets ``--oversubscribe`` so more ranks than cores can run (CI has 2 cores).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcgpu.errors import ConfigurationError


@functools.cache
def mpiexec_path() -> str:
    """Path of the MPI launcher to use."""
    explicit = os.environ.get("HPCGPU_MPIEXEC")
    if explicit:
        return explicit
    beside_python = Path(sys.executable).parent / "mpiexec"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise ConfigurationError(
            "no MPI launcher found: expected mpiexec beside Python or on PATH. Install one "
            "(pip install 'hpcgpu[mpich]', or your system's Open MPI / MPICH), or set HPCGPU_MPIEXEC."
        )
    return found


@functools.cache
def _is_open_mpi(launcher: str) -> bool:
    # Launcher flags differ between implementations; asking the launcher is the only portable way.
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out or "OpenRTE" in out


def mpiexec_command(n_ranks: int, args: list[str]) -> list[str]:
    """The full command line that starts ``args`` on ``n_ranks`` ranks."""
    launcher = mpiexec_path()
    flags = shlex.split(os.environ.get("HPCGPU_MPIEXEC_FLAGS", ""))
    if _is_open_mpi(launcher):
        flags = ["--oversubscribe", "--bind-to", "none"] + flags
    return [launcher, "-n", str(n_ranks), *flags, *args]


@dataclass
class RunResult:
    returncode: int
    output: str
    timed_out: bool


def run_command(command: list[str], timeout: float, env: dict | None = None, cwd=None,
                label: str = "hpcgpu.jobs.launch") -> RunResult:
    """Run ``command`` in a new process group; kill the whole group after ``timeout`` seconds (a
    launcher's ranks or a tool's children too), and say so at the end of its output as ``[label]``.

    ``env`` is added to this process's environment.

    Returns
    -------
    RunResult
        Exit code (-9 after a timeout), combined stdout+stderr, and whether the timeout hit.
    """
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
        cwd=cwd, start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return RunResult(process.returncode, output, False)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return RunResult(-9, output + f"\n[{label}] killed after {timeout:.0f} s timeout", True)


def run_mpi(n_ranks: int, args: list[str], timeout: float, env: dict | None = None, cwd=None) -> RunResult:
    """Run ``args`` on ``n_ranks`` ranks; kill the whole process group after ``timeout`` seconds.

    Returns
    -------
    RunResult
        Exit code (-9 after a timeout), combined stdout+stderr, and whether the timeout hit.
    """
    root_flags = {key: "1" for key in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
                  if key not in os.environ}
    return run_command(mpiexec_command(n_ranks, args), timeout, env={**root_flags, **(env or {})}, cwd=cwd)

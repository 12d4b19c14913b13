"""Fault injection for whole jobs: kill ranks at chosen moments, fill the disk, then check what survived.

Used by ``tests/faults`` (a few seeded cases in CI) and ``benchmarks/fault_campaign.py`` (many):

- :func:`start_job` launches ``mpiexec -n N ...`` in its own process group; :func:`rank_processes`
  finds its rank processes (by the launcher's ``PMI_RANK``/``OMPI_COMM_WORLD_RANK`` in their
  environment); :func:`kill_ranks` sends them a signal (``SIGKILL`` by default: a node failure, the
  OOM killer, a time limit past its grace period);
- :func:`in_full_filesystem` runs a command with a small tmpfs mounted at a path, inside a private
  mount namespace (``unshare --user --map-root-user --mount``), so the machine is not changed;
- :func:`netcdf_records` and :func:`h5md_frames` read what a file holds with the tools users read it
  with (netCDF4, h5py); :func:`is_prefix` compares with an uninterrupted run's.

Linux only (``/proc``, ``unshare``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

_RANK_VARIABLES = (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=")


def start_job(n_ranks: int, args: list[str], env: dict | None = None, cwd=None, log=None) -> subprocess.Popen:
    """Launch ``mpiexec -n N ARGS`` in a new session; stdout and stderr go to ``log`` (a path) or are dropped."""
    from hpcgpu.jobs.launch import mpiexec_command

    output = open(log, "wb") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(mpiexec_command(n_ranks, args), env=env, cwd=cwd, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log is not None:
            output.close()


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def rank_processes(root_pid: int) -> dict[int, int]:
    """``{rank: pid}`` of the MPI ranks below process ``root_pid`` (those that have started so far)."""
    children, found, stack = _children(), {}, [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environment = handle.read().split(b"\0")
        except OSError:
            continue
        for item in environment:
            for prefix in _RANK_VARIABLES:
                if item.startswith(prefix) and item[len(prefix):].isdigit():
                    found.setdefault(int(item[len(prefix):]), pid)
    # A rank's own children (compilers, helper processes) inherit its variables: keep the topmost.
    return found


def kill_ranks(job: subprocess.Popen, which="all", sig=signal.SIGKILL) -> list[int]:
    """Send ``sig`` to the job's ranks (``"all"``, or one rank number); returns the ranks signalled."""
    ranks = rank_processes(job.pid)
    chosen = sorted(ranks) if which == "all" else [which] if which in ranks else []
    for rank in chosen:
        try:
            os.kill(ranks[rank], sig)
        except ProcessLookupError:
            pass
    return chosen


def finish(job: subprocess.Popen, timeout: float = 60.0) -> int:
    """Wait for the job to end (its launcher tears the rest down); kill the process group after ``timeout``."""
    try:
        return job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        return job.wait()


def wait_for_ranks(job: subprocess.Popen, n_ranks: int, timeout: float = 30.0) -> bool:
    """True once all ``n_ranks`` rank processes exist (False if the job ended or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        if len(rank_processes(job.pid)) >= n_ranks:
            return True
        time.sleep(0.02)
    return False


# ---------------------------------------------------------------------------------- a full disk
def unshare_available() -> str | None:
    """Why :func:`in_full_filesystem` cannot work here (None: it can)."""
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return f"unprivileged user and mount namespaces are not available ({probe.stderr.strip()})"
    return None


def in_full_filesystem(mount_point, size: str, args: list[str], env=None, cwd=None, timeout: float = 180.0):
    """Run ``args`` with a ``size`` tmpfs (e.g. ``"200k"``) at ``mount_point``, in a private mount namespace.

    ``mount_point`` must exist (an empty directory); the tmpfs and what is written there vanish when
    the command ends, so the command should report what it needs (the tests run a checker inside).
    Returns the CompletedProcess (stdout and stderr together as text).
    """
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", size,
                           str(mount_point), *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------- what survived
def netcdf_records(path) -> dict:
    """``{variable: array}`` of a netCDF file as netCDF4-python reads it (raises if it cannot)."""
    import netCDF4

    with netCDF4.Dataset(path) as dataset:
        dataset.set_auto_mask(False)
        return {name: np.array(variable[:]) for name, variable in dataset.variables.items()}


def h5md_frames(path) -> dict:
    """``{series path: array}`` of every step/time/value dataset of an H5MD file (raises if it cannot)."""
    import h5py

    frames = {}
    with h5py.File(path, "r") as handle:
        def visit(name, item):
            if isinstance(item, h5py.Dataset) and name.rsplit("/", 1)[-1] in ("step", "time", "value"):
                frames[name] = item[()]
        handle.visititems(visit)
    return frames


def record_count(contents: dict, record_variable: str) -> int:
    return int(np.asarray(contents[record_variable]).shape[0])


def is_prefix(found: dict, reference: dict, record_names) -> bool:
    """True if every array of ``record_names`` in ``found`` equals the first records of ``reference``'s."""
    for name in record_names:
        got, want = np.asarray(found[name]), np.asarray(reference[name])
        if got.shape[1:] != want.shape[1:] or got.shape[0] > want.shape[0]:
            return False
        if not np.array_equal(got, want[:got.shape[0]], equal_nan=got.dtype.kind == "f"):
            return False
    return True


def python() -> str:
    """The interpreter to run ranks with (this one)."""
    return sys.executable

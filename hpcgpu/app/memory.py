"""Refusing a run that cannot fit in memory, before it allocates anything.

An impossible size (``--nx 10000000 --ny 10000000``) would otherwise end every rank with an
out-of-memory traceback from deep inside NumPy or CuPy. An app instead estimates the bytes each rank
needs, where its state lives (host memory on CPUs, GPU memory on GPUs), and calls
:func:`refuse_if_too_large` before it builds its state: every rank compares the estimate with what its
node has, the ranks agree (one ``allgather``), and every rank raises the same
:class:`~hpcgpu.errors.ConfigurationError` (exit 2, one line naming what is needed and what there is).

The estimates are *lower bounds* (the arrays the state certainly holds): a refused run could never
have fitted; a run that passes may still be too large by the few arrays not counted.

What a node has:

* host: ``MemAvailable`` of ``/proc/meminfo`` (or, elsewhere, the physical memory), capped by the
  cgroup's limit where the job runs in one (Slurm does), shared by the ranks of the node;
* GPU: the device's free memory (``cudaMemGetInfo``) of this rank's GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcgpu.errors import ConfigurationError, rank_prefix, replicated


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank needs, and how they were counted.

    Attributes
    ----------
    bytes_per_rank : float
        At least this many bytes are allocated by the rank that holds the most.
    where : str
        ``"host"`` or ``"gpu"``: the memory the bytes live in.
    reckoning : str
        How the number came about, for the message (``"6 arrays x 8 bytes x 5.0e13 cells per rank"``).
    """

    bytes_per_rank: float
    where: str
    reckoning: str


def format_bytes(count: float) -> str:
    """``1.5 GiB``, ``364 TiB``: binary units, three significant digits."""
    value, unit = float(count), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    return f"{value:.3g} {unit}" if unit != "bytes" else f"{int(value)} bytes"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_headroom() -> int | None:
    """Bytes this process's cgroup may still allocate (v2, then v1); None where there is no limit."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        base = None
        if controllers == "":                            # cgroup v2
            base, limit_name, usage_name = "/sys/fs/cgroup" + path, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):         # cgroup v1
            base, limit_name, usage_name = ("/sys/fs/cgroup/memory" + path, "memory.limit_in_bytes",
                                            "memory.usage_in_bytes")
        if base is None:
            continue
        limit, usage = _read_int(os.path.join(base, limit_name)), _read_int(os.path.join(base, usage_name))
        if limit is not None and usage is not None and limit < 1 << 60:   # v1 says "no limit" with a huge number
            return max(0, limit - usage)
    return None


def available_host_bytes() -> int:
    """Bytes of host memory this node can still give (all its ranks together)."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    headroom = _cgroup_headroom()
    return available if headroom is None else min(available, headroom)


def available_gpu_bytes() -> int:
    """Free bytes of the current GPU (CuPy's current device)."""
    import cupy

    free, _total = cupy.cuda.runtime.memGetInfo()
    return int(free)


def _verdict(comm, app: str, estimate: MemoryEstimate, fix: str) -> str | None:
    """This rank's complaint, or None when the estimate fits."""
    if estimate.where == "gpu":
        have = available_gpu_bytes()
        there = f"its GPU has {format_bytes(have)} free"
    else:
        node_bytes = available_host_bytes()
        have = node_bytes / max(1, comm.local_size)
        there = (f"node {comm.hostname} has {format_bytes(node_bytes)} available"
                 + (f" for its {comm.local_size} ranks ({format_bytes(have)} each)" if comm.local_size > 1 else ""))
    if estimate.bytes_per_rank <= have:
        return None
    memory = "GPU memory" if estimate.where == "gpu" else "host memory"
    return (f"{app}: this run needs at least {format_bytes(estimate.bytes_per_rank)} of {memory} per rank "
            f"({estimate.reckoning}), but {there}; {fix}")


def refuse_if_too_large(comm, app: str, estimate: MemoryEstimate, fix: str) -> None:
    """Collective: raise the same ConfigurationError on every rank if any rank lacks the memory of ``estimate``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    app : str
        The app's name, first word of the message.
    estimate : MemoryEstimate
        This rank's need (the largest rank's, for a balanced decomposition).
    fix : str
        What the user can do (``"use a smaller grid or more ranks"``).

    Raises
    ------
    ConfigurationError
        Replicated (every rank raises it; exit 2), naming the first rank that lacks memory.
    """
    complaint = _verdict(comm, app, estimate, fix)
    verdicts = comm.mpi.allgather(complaint)
    failed = [(rank, text) for rank, text in enumerate(verdicts) if text is not None]
    if not failed:
        return
    rank, text = failed[0]
    if len(failed) < comm.size:   # only some nodes are short: say which rank spoke
        text = f"{rank_prefix(rank, comm.size)} {text}"
    raise replicated(ConfigurationError(text))

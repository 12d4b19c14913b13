"""CPU affinity: which CPUs a rank may run on, which CPUs are near its GPU, and binding to them.

NVML reports, for each GPU, the CPUs attached to the same socket / NUMA node
(``nvmlDeviceGetCpuAffinity``). :func:`bind_near_gpu` restricts a rank to those CPUs, split evenly
between the ranks of the node whose GPUs share that set (so two ranks next to one socket do not
fight over the same cores). It runs only when asked (``--bind-cpus``):
launchers and Slurm often bind already, and their binding should win by default.
"""

from __future__ import annotations

import os


def current_cpus() -> list[int]:
    """CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0))


def format_cpus(cpus) -> str:
    """Compact list: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    cpus = sorted(cpus)
    if not cpus:
        return "-"
    parts, start, previous = [], cpus[0], cpus[0]
    for cpu in cpus[1:] + [None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        parts.append(f"{start}-{previous}" if previous > start else str(start))
        if cpu is not None:
            start = previous = cpu
    return ",".join(parts)


def cpus_near_gpu(pci_bus_id: str) -> list[int] | None:
    """CPUs NVML reports as close to the GPU at ``pci_bus_id``; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        n_words = (os.cpu_count() + 63) // 64
        words = pynvml.nvmlDeviceGetCpuAffinity(handle, n_words)
    except Exception:
        return None
    cpus = [64 * w + bit for w, word in enumerate(words) for bit in range(64) if (word >> bit) & 1]
    return cpus or None


def bind_near_gpu(comm, pci_bus_id: str) -> tuple[list[int], str]:
    """Collective over the node: bind this rank to its share of the CPUs near its GPU.

    Returns
    -------
    cpus : list of int
        The CPUs this rank now runs on.
    report : str
        One line describing what was done (or why nothing was).
    """
    near = cpus_near_gpu(pci_bus_id)
    allowed = set(current_cpus())
    candidates = sorted(set(near) & allowed) if near else []
    groups = comm.node.allgather(tuple(candidates))
    if not candidates:
        return current_cpus(), "not bound: NVML gave no CPU set near this GPU (or none is allowed here)"
    sharing = [r for r, group in enumerate(groups) if group == tuple(candidates)]
    index, n_sharing = sharing.index(comm.local_rank), len(sharing)
    per_rank = max(1, len(candidates) // n_sharing)
    chunk = candidates[index * per_rank : (index + 1) * per_rank] or candidates
    os.sched_setaffinity(0, chunk)
    os.environ.setdefault("OMP_NUM_THREADS", str(len(chunk)))
    return chunk, f"bound to CPUs {format_cpus(chunk)} (near GPU {pci_bus_id}, shared by {n_sharing} local rank(s))"

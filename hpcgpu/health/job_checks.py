"""Checks that compare ranks and nodes: software versions, clocks, free space, link bandwidth, and what a
container hides of its node.

Collective functions gather what they need; the ``judge_*`` functions only look at gathered values
and are what the tests call directly.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

from hpcgpu.health.findings import FAIL, OK, SKIP, WARN, Finding
from hpcgpu.health.thresholds import Thresholds, format_bytes
from hpcgpu.runtime import container

#: The versions every rank must share, in report order.
VERSION_KEYS = ("python", "mpi", "nccl", "cuda", "hpcgpu")


def local_versions() -> dict:
    """This rank's Python, MPI library, NCCL, CUDA (CuPy's runtime; None without CuPy) and hpcgpu
    (version and git commit). Imports CuPy only when it is installed."""
    import importlib.util

    from mpi4py import MPI

    import hpcgpu
    from hpcgpu.provenance import git_commit
    from hpcgpu.transport.nccl import nccl_version

    cuda = None
    if importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            runtime = cupy.cuda.runtime.runtimeGetVersion()
            cuda = f"{runtime // 1000}.{runtime % 1000 // 10}"
        except Exception as exc:
            cuda = f"unusable ({type(exc).__name__})"
    library = " ".join(MPI.Get_library_version().replace("\x00", "").split("\n")[0].split())
    commit = git_commit()
    return {"python": platform.python_version(), "mpi": library, "nccl": nccl_version(), "cuda": cuda,
            "hpcgpu": hpcgpu.__version__ + (f" ({commit})" if commit else "")}


def judge_versions(versions_by_rank: list[dict], hosts: list[str]) -> list[Finding]:
    """``ok`` (one finding) when every rank has the same versions; else, per differing key, ``fail`` for
    each node whose ranks differ from the most common value (every node when none has a strict majority)."""
    found = []
    agreed = {}
    for key in VERSION_KEYS:
        values = [str(v.get(key)) for v in versions_by_rank]
        counts = Counter(values)
        if len(counts) == 1:
            agreed[key] = values[0]
            continue
        common, count = counts.most_common(1)[0]
        majority = common if count * 2 > len(values) else None
        odd_hosts = sorted({host for host, value in zip(hosts, values) if value != majority})
        for host in odd_hosts:
            mine = sorted({value for h, value in zip(hosts, values) if h == host})
            found.append(Finding("versions", FAIL, f"{key} {', '.join(mine)} here, "
                                 + (f"{majority} on most ranks" if majority else f"ranks disagree: {dict(counts)}"),
                                 host, scope="node", values={key: mine, "others": majority}))
    if agreed:
        text = ", ".join(f"{key} {'-' if value == 'None' else value}" for key, value in agreed.items())
        found.insert(0, Finding("versions", OK, f"the same on every rank: {text}", scope="node", values=agreed))
    return found


def clock_offsets(comm, samples: int = 5) -> dict[str, dict]:
    """Collective: each node's wall clock minus rank 0's, by host, measured by ping-pong with rank 0.

    One rank per node (its lowest) answers ``samples`` pings; the sample with the shortest round trip
    is kept, so the error is at most half that round trip (``uncertainty_s``).
    """
    from hpcgpu.transport import collectives

    movers = collectives(comm, on_device=False)
    leaders = [rank for rank, local in enumerate(comm.mpi.allgather(comm.local_rank)) if local == 0]
    hosts = comm.mpi.allgather(comm.hostname)
    result = {}
    tag = 7431
    ping, clock = np.zeros(1), np.zeros(1)
    if comm.rank == 0:
        result[comm.hostname] = {"offset_s": 0.0, "uncertainty_s": 0.0}
        for leader in leaders:
            if leader == 0:
                continue
            best = None
            for _ in range(samples):
                sent = time.time()
                movers.send_receive(sends=[(ping, leader)], receives=[(clock, leader)], tag=tag)
                received = time.time()
                round_trip = received - sent
                if best is None or round_trip < best[0]:
                    best = (round_trip, float(clock[0]) - (sent + received) / 2)
            result[hosts[leader]] = {"offset_s": best[1], "uncertainty_s": best[0] / 2}
    elif comm.rank in leaders:
        for _ in range(samples):
            movers.send_receive(receives=[(ping, 0)], tag=tag)
            clock[0] = time.time()
            movers.send_receive(sends=[(clock, 0)], tag=tag)
    return comm.mpi.bcast(result, root=0)


def judge_clock_offsets(offsets: dict[str, dict], thresholds: Thresholds) -> list[Finding]:
    """Per node: its clock's offset from rank 0's node against the warn and fail limits."""
    found = []
    if len(offsets) < 2:
        return [Finding("clock skew", SKIP, "one node: nothing to compare", scope="node")]
    for host, entry in offsets.items():
        offset = entry["offset_s"]
        status = FAIL if abs(offset) > thresholds.clock_skew_fail_s else WARN if abs(offset) > thresholds.clock_skew_warn_s else OK
        found.append(Finding("clock skew", status, f"{offset:+.3f} s from rank 0's node (±{entry['uncertainty_s']:.3f} s)",
                             host, scope="node", values=dict(entry)))
    return found


def free_space(directory: str | os.PathLike) -> dict:
    """Free bytes and writability where ``directory`` is, or would be created (its nearest existing parent)."""
    path = Path(directory).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    return {"directory": str(path), "measured_at": str(existing), "free_bytes": usage.free,
            "total_bytes": usage.total, "writable": os.access(existing, os.W_OK | os.X_OK)}


def judge_container(view: dict, host: str) -> Finding:
    """What a container (or a cgroup) hides of this node (:func:`hpcgpu.runtime.container.mismatches`).

    Fails when the job asked Slurm for GPUs and cannot see them (it would run on the CPU); any other
    mismatch (InfiniBand devices, driver libraries, CPUs) is a warning: the job runs, slower.
    """
    seen = container.ContainerView(**view)
    where = f"{seen.runtime} container" if seen.in_container else "no container detected"
    problems = container.mismatches(seen)
    if not problems:
        return Finding("container", OK, f"{where}; sees all of the node's GPUs ({len(seen.host_gpus)}), InfiniBand "
                       f"adapters ({len(seen.host_hcas)}) and CPUs ({seen.node_cpus})", host,
                       scope="node", values=view)
    kinds = {kind for kind, _ in problems}
    status = FAIL if "gpus" in kinds and seen.requested_gpus else WARN
    return Finding("container", status, f"{where}: " + "; ".join(message for _, message in problems), host,
                   scope="node", values=view)


def judge_free_space(entry: dict, thresholds: Thresholds, host: str) -> Finding:
    """Free space at the checkpoint directory against ``thresholds.free_space_bytes`` (``--need``)."""
    free, need = entry["free_bytes"], thresholds.free_space_bytes
    where = entry["directory"] + ("" if entry["measured_at"] == entry["directory"] else
                                  f" (not there yet; measured at {entry['measured_at']})")
    if not entry["writable"]:
        return Finding("free space", FAIL, f"{where} is not writable", host, scope="node", values=entry)
    if free < need:
        return Finding("free space", FAIL, f"{format_bytes(free)} free at {where}, {format_bytes(need)} needed",
                       host, scope="node", values={**entry, "need_bytes": need})
    needed = f", {format_bytes(need)} needed" if need else " (pass --need SIZE to check it against the checkpoints)"
    return Finding("free space", OK, f"{format_bytes(free)} free at {where}{needed}", host, scope="node",
                   values={**entry, "need_bytes": need})


def judge_links(pairs: list[dict], hosts: list[str], transport: str, thresholds: Thresholds) -> list[Finding]:
    """The ring pairs' bandwidths (:func:`hpcgpu.health.probes.link_bandwidths`): the slowest pair named,
    compared with the median pair of its kind (same node, across nodes) and with ``min_link_gbps``."""
    if not pairs:
        return [Finding("link bandwidth", SKIP, "one rank: no pairs to measure", scope="job")]
    by_kind: dict[str, list[float]] = {}
    for pair in pairs:
        low, high = pair["ranks"]
        pair["kind"] = "same node" if hosts[low] == hosts[high] else "across nodes"
        pair["hosts"] = (hosts[low], hosts[high])
        by_kind.setdefault(pair["kind"], []).append(pair["bytes_per_second"])
    found = []
    for kind, rates in by_kind.items():
        median = statistics.median(rates)
        of_kind = [p for p in pairs if p["kind"] == kind]
        slowest = min(of_kind, key=lambda p: p["bytes_per_second"])
        rate = slowest["bytes_per_second"]
        low, high = slowest["ranks"]
        name = f"ranks {low}-{high}" + (f" ({hosts[low]})" if kind == "same node" else f" ({hosts[low]}-{hosts[high]})")
        text = (f"{transport}, {kind}: slowest {name} {rate / 1e9:.2f} GB/s each way, median of "
                f"{len(rates)} pair(s) {median / 1e9:.2f} GB/s")
        status = OK
        if thresholds.min_link_gbps is not None and rate < thresholds.min_link_gbps * 1e9:
            status, text = FAIL, text + f" (below the minimum {thresholds.min_link_gbps:g} GB/s)"
        elif len(rates) > 2 and rate < thresholds.link_warn_fraction * median:
            status, text = WARN, text + f" (below {thresholds.link_warn_fraction:g} x the median)"
        found.append(Finding("link bandwidth", status, text, scope="job",
                             values={"kind": kind, "slowest": {"ranks": [low, high], "hosts": [hosts[low], hosts[high]],
                                                               "bytes_per_second": rate},
                                     "median_bytes_per_second": median, "pairs": [
                                         {"ranks": list(p["ranks"]), "bytes_per_second": p["bytes_per_second"]}
                                         for p in of_kind]}))
    return found


def judge_allreduce(result: dict, n_bytes: int, transport: str, thresholds: Thresholds) -> Finding:
    """The allreduce's bus bandwidth, against ``min_allreduce_gbps`` when given."""
    bus = result["bus_bytes_per_second"]
    if bus is None:
        return Finding("allreduce", SKIP, "one rank: nothing to reduce", scope="job")
    text = f"{transport}, {format_bytes(n_bytes)}: {result['seconds'] * 1e3:.2f} ms, bus bandwidth {bus / 1e9:.2f} GB/s"
    status = OK
    if thresholds.min_allreduce_gbps is not None and bus < thresholds.min_allreduce_gbps * 1e9:
        status, text = FAIL, text + f" (below the minimum {thresholds.min_allreduce_gbps:g} GB/s)"
    return Finding("allreduce", status, text, scope="job", values={**result, "bytes": n_bytes})

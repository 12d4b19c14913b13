"""``python -m hpcgpu info``: what this job runs on, as the first line of any job.

Prints the MPI library and whether it is CUDA-aware, ranks and nodes, and one row per rank: node,
local rank, GPU (name, UUID, PCI bus id), CPU affinity and whether those CPUs are near the GPU; the
NVLink / PCIe matrix between the GPUs of each node; the NCCL version and the backend ``auto`` picks.
Warns when a rank's CPUs are far from its GPU or when ranks share a GPU. Runs under mpiexec/srun
(one row per rank) or alone.
"""

from __future__ import annotations

import json
import platform

from hpcgpu.runtime.affinity import cpus_near_gpu, current_cpus, format_cpus

_TOPOLOGY_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def link_matrix(bus_ids: list[str]) -> list[list[str]] | None:
    """Link type between every pair of GPUs of this node (``NV<links>``, ``PIX``, ``PHB``, ``SYS`` ...).

    Uses NVML; returns None without it. Names follow ``nvidia-smi topo -m``.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByPciBusId(b) for b in bus_ids]
    except Exception:
        return None
    active_links = []
    for handle in handles:
        count = 0
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                count += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except Exception:
                break
        active_links.append(count)
    matrix = []
    for i, handle in enumerate(handles):
        # Remote PCI info of NVLinks is not reliable inside VMs; the P2P status over NVLink is.
        links_to = [0] * len(handles)
        for j, other in enumerate(handles):
            if i != j:
                try:
                    status = pynvml.nvmlDeviceGetP2PStatus(handle, other, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                    links_to[j] = active_links[i] or 1 if status == pynvml.NVML_P2P_STATUS_OK else 0
                except Exception:
                    pass
        row = []
        for j, other in enumerate(handles):
            if i == j:
                row.append("X")
            elif links_to[j]:
                row.append(f"NV{links_to[j]}")
            else:
                try:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, other)
                    row.append(_TOPOLOGY_NAMES.get(level, str(level)))
                except Exception:
                    row.append("?")
        matrix.append(row)
    return matrix


def collect(comm, backend: str = "auto") -> dict:
    """Collective: gather the facts of every rank to rank 0 (others get None)."""
    from mpi4py import MPI

    import hpcgpu
    from hpcgpu.transport import auto_transport_name
    from hpcgpu.transport.mpi_device import mpi_is_cuda_aware
    from hpcgpu.transport.nccl import nccl_version

    arch = hpcgpu.arch.auto(comm, backend=backend, allow_sharing=True)
    row = {
        "rank": comm.rank,
        "host": comm.hostname,
        "node_index": comm.node_index,
        "local_rank": comm.local_rank,
        "cpus": format_cpus(current_cpus()),
        "gpu": None,
    }
    if arch.is_gpu:
        ident = arch.identity
        near = cpus_near_gpu(ident.pci_bus_id)
        mine = set(current_cpus())
        row["gpu"] = {"device_id": ident.device_id, "name": ident.name, "uuid": ident.uuid, "pci_bus_id": ident.pci_bus_id}
        row["cpus_near_gpu"] = format_cpus(near) if near else None
        row["cpus_are_near"] = None if not near else mine <= set(near)
    rows = comm.mpi.gather(row, root=0)
    node_bus_ids = comm.node.gather(row["gpu"]["pci_bus_id"] if row["gpu"] else None, root=0)
    matrix = None
    if comm.local_rank == 0 and node_bus_ids and all(node_bus_ids):
        unique = list(dict.fromkeys(node_bus_ids))
        matrix = {"gpus": unique, "links": link_matrix(unique)}
    matrices = comm.mpi.gather((comm.hostname, matrix) if comm.local_rank == 0 else None, root=0)
    if comm.rank != 0:
        return None
    return {
        "mpi_library": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
        "mpi_standard": "%d.%d" % MPI.Get_version(),
        "mpi_cuda_aware": mpi_is_cuda_aware(),
        "n_ranks": comm.size,
        "n_nodes": comm.n_nodes,
        "python": platform.python_version(),
        "hpcgpu": hpcgpu.__version__,
        "backend": arch.name,
        "backend_reason": arch.reason,
        "transport": auto_transport_name(arch),
        "nccl": nccl_version(),
        "ranks": rows,
        "link_matrices": {host: m for host, m in (x for x in matrices if x)},
    }


def warnings_for(report: dict) -> list[str]:
    """Problems worth a warning: CPUs far from the GPU, GPUs shared by several ranks."""
    found = []
    by_uuid = {}
    for row in report["ranks"]:
        gpu = row["gpu"]
        if gpu is None:
            continue
        by_uuid.setdefault(gpu["uuid"], []).append(row["rank"])
        if row.get("cpus_are_near") is False:
            found.append(
                f"rank {row['rank']} runs on CPUs {row['cpus']} but its GPU {gpu['pci_bus_id']} is near CPUs "
                f"{row['cpus_near_gpu']}: bind ranks near their GPUs (--bind-cpus, or your launcher's binding)"
            )
    for uuid, ranks in by_uuid.items():
        if len(ranks) > 1:
            found.append(f"ranks {ranks} share GPU {uuid}: expected one rank per GPU")
    return found


def format_report(report: dict) -> str:
    lines = [
        f"hpcgpu {report['hpcgpu']} on Python {report['python']}",
        f"MPI: {report['mpi_library']} (MPI {report['mpi_standard']}), CUDA-aware: {'yes' if report['mpi_cuda_aware'] else 'no'}",
        f"ranks: {report['n_ranks']} on {report['n_nodes']} node(s); NCCL: {report['nccl'] or 'not available'}",
        f"backend: {report['backend']} ({report['backend_reason']}); halo transport: {report['transport']}",
        "",
        f"{'rank':>4} {'node':<20} {'local':>5}  {'GPU':<28} {'PCI bus':<14} {'CPUs':<12} near GPU",
    ]
    for row in report["ranks"]:
        gpu = row["gpu"]
        name = f"{gpu['device_id']}: {gpu['name']}" if gpu else "-"
        bus = gpu["pci_bus_id"] if gpu else "-"
        near = {True: "yes", False: "NO", None: "-"}[row.get("cpus_are_near")]
        lines.append(f"{row['rank']:>4} {row['host'][:20]:<20} {row['local_rank']:>5}  {name[:28]:<28} {bus:<14} {row['cpus']:<12} {near}")
        if gpu:
            lines.append(f"{'':>4} {'':<20} {'':>5}  uuid {gpu['uuid']}")
    for host, matrix in report["link_matrices"].items():
        if not matrix or not matrix["links"]:
            continue
        lines += ["", f"GPU links on {host} (NV# = NVLink count, PIX/PXB/PHB/NODE/SYS = PCIe path as in nvidia-smi topo -m):"]
        gpus = matrix["gpus"]
        lines.append(" " * 14 + "".join(f"{i:>6}" for i in range(len(gpus))))
        for i, (bus, row) in enumerate(zip(gpus, matrix["links"])):
            lines.append(f"{i:>2} {bus[-11:]:<11}" + "".join(f"{c:>6}" for c in row))
    for warning in warnings_for(report):
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def main(args) -> int:
    import hpcgpu

    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        report = collect(comm, backend=args.backend)
        if comm.rank == 0:
            print(json.dumps(report, indent=2) if args.json else format_report(report), flush=True)
    return 0

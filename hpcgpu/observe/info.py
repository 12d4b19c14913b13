"""``python -m hpcgpu info``: what this job runs on, as the first line of any job.

Prints the MPI library and whether it is CUDA-aware, ranks and nodes, and one row per rank: node,
local rank, GPU (name, UUID, PCI bus id), CPU affinity and whether those CPUs are near the GPU; the
NVLink / PCIe matrix between the GPUs of each node; the NCCL version and the backend ``auto`` picks.
Then, per node (:mod:`hpcgpu.runtime.topology`): each GPU's NUMA node, the network adapters
(InfiniBand HCAs and interfaces) with their PCI distance to each GPU, whether GPUDirect RDMA is
possible, and per local rank the CPUs to bind to and the ``NCCL_IB_HCA`` to use (``--apply`` prints
them as shell lines a job script can eval, ``--apply-to FILE`` writes them to FILE besides the report;
``--nccl-topology`` adds NCCL's own view on a GPU).
It says whether it runs inside a container (:mod:`hpcgpu.runtime.container`) and what of the node
the container hides. Warns when a rank's CPUs are far from its GPU, when ranks share a GPU, and when
GPUs, InfiniBand devices or CPUs of the node are out of reach. Runs under mpiexec/srun (one row per
rank) or alone.
"""

from __future__ import annotations

import json
import platform
import shlex

from hpcgpu.runtime import container, nccl_topology, topology
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


def add_arguments(parser) -> None:
    """The topology flags of ``hpcgpu info`` (``--apply``, ``--nccl-topology``)."""
    parser.add_argument("--apply", action="store_true",
                        help="print only shell lines a job script can eval: per node-local rank, export "
                             "HPCGPU_RECOMMENDED_CPUS and NCCL_IB_HCA")
    parser.add_argument("--apply-to", metavar="FILE", default=None,
                        help="print the report as usual and also write the --apply lines to FILE (the job "
                             "scripts source it in each rank's launch wrapper)")
    parser.add_argument("--nccl-topology", action="store_true",
                        help="on a GPU: start a one-rank NCCL communicator with NCCL_TOPO_DUMP_FILE set and "
                             "summarise the topology NCCL detected")


def collect(comm, backend: str = "auto", nccl_topology: bool = False) -> dict:
    """Collective: gather the facts of every rank to rank 0 (others get None)."""
    from mpi4py import MPI

    import hpcgpu
    from hpcgpu.transport import transport_name
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
        row["gpu"]["numa_node"] = topology.gpu_numa_node(ident.pci_bus_id)
        row["cpus_near_gpu"] = format_cpus(near) if near else None
        row["cpus_are_near"] = None if not near else mine <= set(near)
    rows = comm.mpi.gather(row, root=0)
    node_bus_ids = comm.node.gather(row["gpu"]["pci_bus_id"] if row["gpu"] else None, root=0)
    matrix = None
    if comm.local_rank == 0 and node_bus_ids and all(node_bus_ids):
        unique = list(dict.fromkeys(node_bus_ids))
        matrix = {"gpus": unique, "links": link_matrix(unique)}
    matrices = comm.mpi.gather((comm.hostname, matrix) if comm.local_rank == 0 else None, root=0)
    node_topology = topology.node_report(node_bus_ids) if comm.local_rank == 0 else None
    topologies = comm.mpi.gather((comm.hostname, node_topology) if comm.local_rank == 0 else None, root=0)
    node_view = container.inspect().as_dict() if comm.local_rank == 0 else None
    views = comm.mpi.gather((comm.hostname, node_view) if comm.local_rank == 0 else None, root=0)
    if comm.rank != 0:
        return None
    nccl_view = None
    if nccl_topology:
        if not arch.is_gpu or nccl_version() is None:
            nccl_view = {"message": "--nccl-topology: does not apply here (needs a GPU and NCCL; this rank runs on "
                                    f"{arch.name})", "summary": []}
        else:
            xml, message = nccl_topology.nccl_topology_dump()
            nccl_view = {"message": message, "summary": nccl_topology.summarise_nccl_topology(xml) if xml else []}
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
        "transport": transport_name(comm, arch),
        "nccl": nccl_version(),
        "ranks": rows,
        "link_matrices": {host: m for host, m in (x for x in matrices if x)},
        "topologies": {host: t for host, t in (x for x in topologies if x)},
        "containers": {host: v for host, v in (x for x in views if x)},
        "nccl_topology": nccl_view,
    }


def warnings_for(report: dict) -> list[str]:
    """Problems worth a warning: CPUs far from the GPU, GPUs shared by several ranks, and what a container
    (or a cgroup) hides of its node (:func:`hpcgpu.runtime.container.mismatches`)."""
    found = []
    for host, view in report.get("containers", {}).items():
        found += [f"{host}: {problem}" for _, problem in container.mismatches(container.ContainerView(**view))]
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
            numa = gpu.get("numa_node")
            numa = "unknown" if numa is None else numa
            lines.append(f"{'':>4} {'':<20} {'':>5}  uuid {gpu['uuid']}, NUMA node {numa}")
    for host, matrix in report["link_matrices"].items():
        if not matrix or not matrix["links"]:
            continue
        lines += ["", f"GPU links on {host} (NV# = NVLink count, PIX/PXB/PHB/NODE/SYS = PCIe path as in nvidia-smi topo -m):"]
        gpus = matrix["gpus"]
        lines.append(" " * 14 + "".join(f"{i:>6}" for i in range(len(gpus))))
        for i, (bus, row) in enumerate(zip(gpus, matrix["links"])):
            lines.append(f"{i:>2} {bus[-11:]:<11}" + "".join(f"{c:>6}" for c in row))
    lines += format_containers(report.get("containers", {}))
    lines += format_topologies(report.get("topologies", {}))
    nccl_view = report.get("nccl_topology")
    if nccl_view:
        lines += ["", nccl_view["message"] + (":" if nccl_view["summary"] else "")]
        lines += [f"  {line}" for line in nccl_view["summary"]]
    for warning in warnings_for(report):
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def format_containers(views: dict) -> list[str]:
    """One line per distinct view: container or not, GPUs / InfiniBand / CPUs seen against the node's."""
    groups: dict[str, list[str]] = {}
    for host, view in views.items():
        groups.setdefault(container.describe(container.ContainerView(**view)), []).append(host)
    lines = []
    for text, hosts in groups.items():
        more = f" (and {len(hosts) - 1} more node(s) alike)" if len(hosts) > 1 else ""
        lines += ["", f"Container on {hosts[0]}{more}: {text}"]
    return lines


def _adapter_line(adapter: dict) -> str:
    numa = "NUMA ?" if adapter["numa_node"] is None else f"NUMA {adapter['numa_node']}"
    if adapter["kind"] == "infiniband":
        ports = "; ".join(f"port {p['number']} {p['state'] or '?'} {p['rate'] or 'rate ?'}" for p in adapter["ports"])
        state = ports or "no ports"
    else:
        speed = f"{adapter['speed_mbps']} Mb/s" if adapter["speed_mbps"] else "speed ?"
        state = f"{adapter['operstate'] or '?'} {speed}"
    return f"  {adapter['name']:<12} {adapter['kind']:<10} {state}, {numa}, PCI {adapter['pci_path'] or '?'}"


def format_topologies(topologies: dict) -> list[str]:
    """The network section: one block per distinct node topology (nodes of one type print once)."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    for host, node in topologies.items():
        groups.setdefault(json.dumps(node, sort_keys=True), (node, []))[1].append(host)
    lines = []
    for node, hosts in groups.values():
        more = f" (and {len(hosts) - 1} more node(s) alike)" if len(hosts) > 1 else ""
        lines += ["", f"Network on {hosts[0]}{more}:"]
        if not node["infiniband_present"]:
            lines.append("  InfiniBand: /sys/class/infiniband absent (no HCA, or no RDMA driver loaded)")
        elif not any(a["kind"] == "infiniband" for a in node["adapters"]):
            lines.append("  InfiniBand: no HCA listed in /sys/class/infiniband")
        physical = [a for a in node["adapters"] if a["physical"]]
        virtual = [a["name"] for a in node["adapters"] if not a["physical"]]
        lines += [_adapter_line(a) for a in physical]
        if virtual:
            lines.append(f"  virtual interfaces (no PCI device): {', '.join(virtual)}")
        if not physical:
            lines.append("  no physical network adapter in /sys/class/infiniband or /sys/class/net")
        for gpu in node["gpus"]:
            numa = "?" if gpu["numa_node"] is None else gpu["numa_node"]
            to = node["distances"].get(gpu["pci_bus_id"], {})
            path = ", ".join(f"{name} {d}" for name, d in to.items()) or "no physical NIC"
            lines.append(f"  GPU {gpu['pci_bus_id']} (NUMA {numa}) to NICs: {path}")
        if physical and node["gpus"]:
            lines.append("  (PIX/PXB = same PCIe switch, PHB = same root complex, NODE = same NUMA node, "
                         "SYS = across sockets)")
        lines.append(f"  {node['gpudirect']}")
        lines.append(f"  {nccl_topology.NCCL_HINT}; hpcgpu info --nccl-topology does it on a GPU")
        if node["recommendations"]:
            lines.append("  recommended per local rank (hpcgpu info --apply prints them for a job script):")
        else:
            lines.append("  recommendations: none (no GPU on this node's ranks: CPU binding and NCCL_IB_HCA "
                         "do not apply)")
        for rec in node["recommendations"]:
            cpus = format_cpus(rec["cpus"]) if rec["cpus"] else "unknown (no NUMA information)"
            hca = f"NCCL_IB_HCA={rec['exports']['NCCL_IB_HCA']} ({rec['distance']})" if rec["ib_hcas"] else "no IB HCA"
            lines.append(f"    local {rec['local_rank']}: GPU {rec['pci_bus_id']}: CPUs {cpus}; {hca}")
    return lines


_LOCAL_RANK = ("${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${PMI_LOCAL_RANK:-${PALS_LOCAL_RANKID:-"
               "${SLURM_LOCALID:-0}}}}}")


def format_exports(report: dict) -> str:
    """Shell lines for ``eval``: per node-local rank, export the recommended CPUs and NCCL_IB_HCA.

    Computed on the first node; nodes of the same type share it. The local rank comes from the
    launcher's variables, in the order ``jobscripts/mpirun/gpu-per-rank.sh`` reads them.
    """
    if not report.get("topologies"):
        return "# hpcgpu info --apply: no topology gathered: nothing to export"
    host, node = next(iter(report["topologies"].items()))
    recommendations = [r for r in node["recommendations"] if r["exports"]]
    if not recommendations:
        return f"# hpcgpu info --apply: nothing to export on {host} (no GPU, or no NUMA / IB information)"
    lines = [f"# hpcgpu info --apply: computed on {host}; bind with: taskset -c \"$HPCGPU_RECOMMENDED_CPUS\" ...",
             f'case "{_LOCAL_RANK}" in']
    for rec in recommendations:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in rec["exports"].items())
        lines.append(f"  {rec['local_rank']}) export {exports} ;;")
    lines.append("esac")
    return "\n".join(lines)


def main(args) -> int:
    import hpcgpu

    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        report = collect(comm, backend=args.backend, nccl_topology=args.nccl_topology)
        if comm.rank == 0:
            if args.apply:
                text = format_exports(report)
            else:
                text = json.dumps(report, indent=2) if args.json else format_report(report)
            print(text, flush=True)
            if getattr(args, "apply_to", None):
                with open(args.apply_to, "w") as handle:
                    handle.write(format_exports(report) + "\n")
    return 0

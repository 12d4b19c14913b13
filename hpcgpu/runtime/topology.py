"""This node's network and NUMA topology, read from sysfs: which NIC is near which GPU.

A multi-node job is fast when each rank's GPU talks to the network through the InfiniBand adapter
(HCA) on its own PCIe switch, and its CPU threads run on the GPU's NUMA node. Linux describes all of
that in sysfs, without any vendor tool:

- ``/sys/bus/pci/devices/<bus id>/numa_node``: the NUMA node of a PCI device (GPU or NIC);
- ``/sys/class/infiniband/<hca>/ports/<n>/{state,rate}`` and ``device`` (a link to the PCI device);
- ``/sys/class/net/<if>/{operstate,speed}`` and ``device`` (absent for ``lo``, veth, bridges);
- ``/sys/devices/pci<domain>:<bus>/...``: the resolved PCI path. Two devices whose paths share a PCI
  bridge below the root complex sit on the same PCIe switch (``PIX``/``PXB`` in ``nvidia-smi topo
  -m``); sharing only ``pciDDDD:BB`` is the same root complex (``PHB``); sharing nothing is the same
  NUMA node (``NODE``) or across sockets (``SYS``);
- ``/sys/module/nvidia_peermem`` (or ``nv_peer_mem``): GPUDirect RDMA, the NIC reading GPU memory.

Every function takes ``root`` (default ``"/"``), so tests can build a fake tree, and never raises on a
missing or unreadable file: the value is None and the report says so.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# Distance classes, nearest first, with the names nvidia-smi topo -m and NCCL use.
DISTANCE_NAMES = {
    "PIX": "same PCIe switch",
    "PXB": "same PCIe switch tree",
    "PHB": "same root complex",
    "NODE": "same NUMA node",
    "SYS": "across sockets",
}


def _sys(root: str, *parts: str) -> str:
    return os.path.join(root, "sys", *parts)


def read_text(path: str) -> str | None:
    """Content of a sysfs file, stripped; None when absent or unreadable (EINVAL for ``speed`` of lo)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _list_dir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def normalise_bus_id(pci_bus_id: str) -> str:
    """``"00000000:3B:00.0"`` (NVML) or ``"0000:3B:00.0"`` (CUDA) -> ``"0000:3b:00.0"`` (sysfs)."""
    bus_slot = pci_bus_id.strip().lower().split(":")
    if len(bus_slot) != 3:
        return pci_bus_id.strip().lower()
    domain, bus, device = bus_slot
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{device}"


def numa_node_of(device_dir: str) -> int | None:
    """NUMA node in ``device_dir/numa_node``; None when absent or -1 (no NUMA information)."""
    text = read_text(os.path.join(device_dir, "numa_node"))
    try:
        node = int(text)
    except (TypeError, ValueError):
        return None
    return node if node >= 0 else None


def pci_path(device_link: str, root: str = "/") -> str | None:
    """Resolved ``/sys/devices/...`` path of the PCI device behind ``device_link``, relative to ``root``.

    Walks up from a non-PCI device (``virtio0``) to its PCI parent. None when the link is absent
    (virtual interfaces) or leads to no PCI device.
    """
    if not os.path.exists(device_link):
        return None
    parts = os.path.realpath(device_link).split(os.sep)
    while parts and not _PCI_ADDRESS.match(parts[-1]):
        parts.pop()
    if not parts:
        return None
    resolved = os.sep.join(parts)
    prefix = os.path.realpath(_sys(root, "devices"))
    if not resolved.startswith(prefix + os.sep):
        return None
    return "/sys/devices/" + resolved[len(prefix) + 1 :]


def gpu_pci_path(pci_bus_id: str, root: str = "/") -> str | None:
    """Resolved PCI path of the GPU at ``pci_bus_id`` (any spelling); None when sysfs lacks it."""
    return pci_path(_sys(root, "bus", "pci", "devices", normalise_bus_id(pci_bus_id)), root)


def gpu_numa_node(pci_bus_id: str, root: str = "/") -> int | None:
    """NUMA node of the GPU at ``pci_bus_id``; None when unknown."""
    return numa_node_of(_sys(root, "bus", "pci", "devices", normalise_bus_id(pci_bus_id)))


@dataclass(frozen=True)
class IbPort:
    number: int
    state: str | None   # e.g. "ACTIVE" (sysfs says "4: ACTIVE")
    rate: str | None    # e.g. "200 Gb/sec (4X HDR)"


@dataclass(frozen=True)
class NetworkAdapter:
    """One InfiniBand HCA (``kind="infiniband"``) or one network interface (``kind="net"``).

    ``pci_path`` is the resolved ``/sys/devices/...`` path of its PCI device, None for virtual ones.
    """

    name: str
    kind: str
    numa_node: int | None
    pci_path: str | None
    ports: tuple[IbPort, ...] = ()
    operstate: str | None = None
    speed_mbps: int | None = None

    @property
    def physical(self) -> bool:
        return self.pci_path is not None

    @property
    def active(self) -> bool:
        if self.kind == "infiniband":
            return any(p.state == "ACTIVE" for p in self.ports)
        return self.operstate == "up"


def infiniband_adapters(root: str = "/") -> list[NetworkAdapter]:
    """HCAs in ``/sys/class/infiniband`` with their ports' state and rate; empty when none."""
    found = []
    base = _sys(root, "class", "infiniband")
    for name in _list_dir(base):
        ports = []
        for port in _list_dir(os.path.join(base, name, "ports")):
            state = read_text(os.path.join(base, name, "ports", port, "state"))
            if state and ":" in state:
                state = state.split(":", 1)[1].strip()
            try:
                number = int(port)
            except ValueError:
                continue
            ports.append(IbPort(number, state, read_text(os.path.join(base, name, "ports", port, "rate"))))
        device = os.path.join(base, name, "device")
        found.append(NetworkAdapter(name, "infiniband", numa_node_of(device), pci_path(device, root), tuple(ports)))
    return found


def net_adapters(root: str = "/") -> list[NetworkAdapter]:
    """Interfaces in ``/sys/class/net``; ``speed_mbps`` is None where the kernel gives none (lo, veth)."""
    found = []
    base = _sys(root, "class", "net")
    for name in _list_dir(base):
        speed = read_text(os.path.join(base, name, "speed"))
        try:
            speed_mbps = int(speed) if speed is not None and int(speed) > 0 else None
        except ValueError:
            speed_mbps = None
        device = os.path.join(base, name, "device")
        found.append(NetworkAdapter(
            name, "net", numa_node_of(device), pci_path(device, root),
            operstate=read_text(os.path.join(base, name, "operstate")), speed_mbps=speed_mbps,
        ))
    return found


def pci_distance(path_a: str | None, path_b: str | None, numa_a: int | None = None, numa_b: int | None = None):
    """Hops between two PCI devices up to their common ancestor, and the distance class.

    Returns
    -------
    hops : int or None
        Path elements from each device up to the deepest common one, summed (through the CPUs when
        the paths share nothing). None when a path is unknown.
    name : str
        ``PIX`` (one switch between them), ``PXB`` (several bridges), ``PHB`` (same root complex),
        ``NODE`` (same NUMA node), ``SYS`` (across sockets, or NUMA unknown), ``?`` (unknown).
    """
    if not path_a or not path_b:
        return None, "?"
    a = path_a.removeprefix("/sys/devices/").split("/")
    b = path_b.removeprefix("/sys/devices/").split("/")
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    hops = (len(a) - common) + (len(b) - common)
    if common >= 2:
        # a[0] is the root complex (pciDDDD:BB); a shared element below it is a PCIe bridge/switch.
        # A switch shows as its upstream port with one downstream port per device: PIX as in nvidia-smi.
        name = "PIX" if max(len(a), len(b)) - common <= 2 else "PXB"
    elif common == 1:
        name = "PHB"
    elif numa_a is not None and numa_a == numa_b:
        name = "NODE"
    else:
        name = "SYS"
    return hops, name


def _distance_rank(hops: int | None, name: str) -> tuple[int, int]:
    order = list(DISTANCE_NAMES) + ["?"]
    return order.index(name), hops if hops is not None else 10**6


def parse_cpulist(text: str | None) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``; empty for None or garbage."""
    cpus = []
    for part in (text or "").split(","):
        try:
            if "-" in part:
                first, last = part.split("-")
                cpus.extend(range(int(first), int(last) + 1))
            elif part.strip():
                cpus.append(int(part))
        except ValueError:
            return []
    return cpus


def numa_cpus(node: int, root: str = "/") -> list[int]:
    """CPUs of NUMA node ``node`` (``/sys/devices/system/node/node<N>/cpulist``); empty when unknown."""
    return parse_cpulist(read_text(_sys(root, "devices", "system", "node", f"node{node}", "cpulist")))


def single_numa_node(root: str = "/") -> int | None:
    """The NUMA node number when the system has exactly one, else None."""
    nodes = [n for n in _list_dir(_sys(root, "devices", "system", "node")) if re.fullmatch(r"node\d+", n)]
    return int(nodes[0][4:]) if len(nodes) == 1 else None


@dataclass(frozen=True)
class GpuDirectStatus:
    """Whether a NIC can read and write GPU memory directly (GPUDirect RDMA)."""

    driver_loaded: bool       # /sys/module/nvidia present
    peer_module: str | None   # "nvidia_peermem" or "nv_peer_mem" when loaded
    dma_buf: bool             # Linux >= 5.12 and NVIDIA's open kernel module

    @property
    def possible(self) -> bool:
        return self.peer_module is not None or self.dma_buf

    def describe(self) -> str:
        if not self.driver_loaded and not self.peer_module:
            return "GPUDirect RDMA: does not apply (no NVIDIA driver loaded: /sys/module/nvidia absent)"
        if self.peer_module:
            return f"GPUDirect RDMA: possible (kernel module {self.peer_module} loaded)"
        if self.dma_buf:
            return "GPUDirect RDMA: possible through dma-buf (Linux >= 5.12, NVIDIA open kernel module)"
        return ("GPUDirect RDMA: not available: no peer-memory module (/sys/module/nvidia_peermem and "
                "/sys/module/nv_peer_mem absent) and no dma-buf support (needs Linux >= 5.12 and NVIDIA's "
                "open kernel module); inter-node GPU data goes through host memory. Fix: modprobe nvidia_peermem")


def gpudirect_status(root: str = "/") -> GpuDirectStatus:
    """Peer-memory module loaded, or dma-buf possible; read from ``/sys/module`` and ``/proc``."""
    module = next((m for m in ("nvidia_peermem", "nv_peer_mem") if os.path.isdir(_sys(root, "module", m))), None)
    release = read_text(os.path.join(root, "proc", "sys", "kernel", "osrelease")) or ""
    match = re.match(r"(\d+)\.(\d+)", release)
    new_kernel = bool(match) and (int(match.group(1)), int(match.group(2))) >= (5, 12)
    driver = read_text(os.path.join(root, "proc", "driver", "nvidia", "version")) or ""
    driver_loaded = os.path.isdir(_sys(root, "module", "nvidia"))
    return GpuDirectStatus(driver_loaded, module, new_kernel and "Open Kernel Module" in driver)


@dataclass(frozen=True)
class Recommendation:
    """What one node-local rank should bind to: its share of its GPU's NUMA CPUs, and its nearest HCAs."""

    local_rank: int
    pci_bus_id: str
    numa_node: int | None
    cpus: tuple[int, ...]
    ib_hcas: tuple[str, ...]
    distance: str   # distance class from the GPU to those HCAs ("?" when none)

    def exports(self) -> dict[str, str]:
        """Environment a job script can export for this rank (only what is known)."""
        from hpcgpu.runtime.affinity import format_cpus

        env = {}
        if self.cpus:
            env["HPCGPU_RECOMMENDED_CPUS"] = format_cpus(self.cpus)
        if self.ib_hcas:
            # "=" asks for exact names: a plain "mlx5_1" would also match mlx5_10 ... mlx5_17.
            env["NCCL_IB_HCA"] = "=" + ",".join(self.ib_hcas)
        return env


def recommend(gpu_bus_ids: list[str | None], root: str = "/") -> list[Recommendation]:
    """One recommendation per node-local rank that has a GPU.

    Parameters
    ----------
    gpu_bus_ids : list of str or None, length n_local_ranks
        PCI bus id of each node-local rank's GPU, in local-rank order (None: no GPU).
    """
    hcas = infiniband_adapters(root)
    usable = [h for h in hcas if h.active] or hcas
    numa = {rank: gpu_numa_node(bus, root) for rank, bus in enumerate(gpu_bus_ids) if bus}
    found = []
    for rank, bus in enumerate(gpu_bus_ids):
        if not bus:
            continue
        node = numa[rank]
        cpus: list[int] = []
        # numa_node -1 (VMs, single sockets): with one NUMA node in the system its CPUs are the GPU's.
        only_node = single_numa_node(root)
        numa_key = node if node is not None else only_node
        if numa_key is not None:
            node_cpus = numa_cpus(numa_key, root)
            sharing = [r for r in numa if numa[r] == node]   # all GPU ranks when every node is None
            per_rank = max(1, len(node_cpus) // len(sharing))
            index = sharing.index(rank)
            cpus = node_cpus[index * per_rank : (index + 1) * per_rank] or node_cpus
        gpu_path = gpu_pci_path(bus, root)
        scored = [(_distance_rank(*pci_distance(gpu_path, h.pci_path, node, h.numa_node)), h) for h in usable]
        best = min((score for score, _ in scored), default=None)
        nearest = tuple(h.name for score, h in scored if score == best)
        name = "?"
        if nearest:
            nearest_hca = next(h for h in usable if h.name == nearest[0])
            name = pci_distance(gpu_path, nearest_hca.pci_path, node, nearest_hca.numa_node)[1]
        found.append(Recommendation(rank, bus, node, tuple(cpus), nearest, name))
    return found


def node_report(gpu_bus_ids: list[str | None], root: str = "/") -> dict:
    """Everything above for one node, as plain JSON-able data.

    Parameters
    ----------
    gpu_bus_ids : list of str or None
        PCI bus id of each node-local rank's GPU, in local-rank order.
    """
    adapters = infiniband_adapters(root) + net_adapters(root)
    gpus = list(dict.fromkeys(b for b in gpu_bus_ids if b))
    gpu_paths = {b: gpu_pci_path(b, root) for b in gpus}
    gpu_numa = {b: gpu_numa_node(b, root) for b in gpus}
    gpudirect = gpudirect_status(root)
    distances = {
        b: {a.name: pci_distance(gpu_paths[b], a.pci_path, gpu_numa[b], a.numa_node)[1] for a in adapters if a.physical}
        for b in gpus
    }
    report = {
        "infiniband_present": os.path.isdir(_sys(root, "class", "infiniband")),
        "adapters": [dict(asdict(a), physical=a.physical, active=a.active) for a in adapters],
        "gpus": [{"pci_bus_id": b, "numa_node": gpu_numa[b], "pci_path": gpu_paths[b]} for b in gpus],
        "distances": distances,
        "gpudirect": gpudirect.describe(),
        "gpudirect_possible": gpudirect.possible,
        "recommendations": [dict(asdict(r), exports=r.exports()) for r in recommend(gpu_bus_ids, root)],
    }
    return json.loads(json.dumps(report))   # tuples become lists: the same data as read back from --json

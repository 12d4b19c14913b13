"""Network / NUMA topology from sysfs (``hpcgpu.runtime.topology``) and its section of ``hpcgpu info``.

The fake node built by :func:`fake_sysfs` (two sockets, a PCIe switch on each)::

    NUMA 0, CPUs 0-7                                NUMA 1, CPUs 8-15
    pci0000:00                                      pci0000:80
     ├─ 00:01.0 ─ switch 01:00.0                     └─ 80:01.0 ─ switch 81:00.0
     │             ├─ 02:00.0 ─ GPU 03:00.0                       ├─ 82:00.0 ─ GPU 83:00.0
     │             └─ 02:01.0 ─ mlx5_0 04:00.0                    └─ 82:01.0 ─ mlx5_1 84:00.0
     └─ 00:1c.0 ─ eth0 05:00.0
    lo, veth0: no PCI device
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcgpu.observe import info
from hpcgpu.jobs.launch import run_mpi
from hpcgpu.runtime import nccl_topology, topology

GPU0, GPU1 = "0000:03:00.0", "0000:83:00.0"
ROOT = Path(__file__).resolve().parents[2]


def _pci_device(root: Path, path: str, numa: int) -> Path:
    device = root / "sys" / "devices" / path
    device.mkdir(parents=True)
    (device / "numa_node").write_text(f"{numa}\n")
    bus = root / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / device.name).symlink_to(os.path.relpath(device, bus))
    return device


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def fake_sysfs(root: Path) -> Path:
    """Two GPUs and two HCAs (one per socket), an Ethernet NIC, lo and a veth (drawn above)."""
    _pci_device(root, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/" + GPU0, 0)
    _pci_device(root, "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/" + GPU1, 1)
    hcas = {
        "mlx5_0": _pci_device(root, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0),
        "mlx5_1": _pci_device(root, "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:01.0/0000:84:00.0", 1),
    }
    for name, device in hcas.items():
        _link(root / "sys" / "class" / "infiniband" / name / "device", device)
        port = root / "sys" / "class" / "infiniband" / name / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    eth = _pci_device(root, "pci0000:00/0000:00:1c.0/0000:05:00.0", 0)
    net = root / "sys" / "class" / "net"
    _link(net / "eth0" / "device", eth)
    (net / "eth0" / "operstate").write_text("up\n")
    (net / "eth0" / "speed").write_text("25000\n")
    for name in ("lo", "veth0"):
        (net / name).mkdir(parents=True)
        (net / name / "operstate").write_text("unknown\n")
        (net / name / "speed").mkdir()   # reading it fails like the kernel's EINVAL for virtual devices
    for node, cpus in ((0, "0-7"), (1, "8-15")):
        directory = root / "sys" / "devices" / "system" / "node" / f"node{node}"
        directory.mkdir(parents=True)
        (directory / "cpulist").write_text(cpus + "\n")
    (root / "sys" / "module" / "nvidia").mkdir(parents=True)
    return root


@pytest.fixture
def sysfs(tmp_path):
    return str(fake_sysfs(tmp_path))


def test_gpu_numa_node_and_bus_id_spellings(sysfs):
    assert topology.gpu_numa_node(GPU0, sysfs) == 0
    assert topology.gpu_numa_node("00000000:83:00.0", sysfs) == 1   # NVML spelling
    assert topology.gpu_numa_node("0000:83:00.0".upper(), sysfs) == 1   # CUDA spelling
    assert topology.gpu_numa_node("0000:99:00.0", sysfs) is None
    expected = f"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/{GPU0}"
    assert topology.gpu_pci_path(GPU0, sysfs) == expected


def test_adapters_parsed(sysfs):
    hcas = {a.name: a for a in topology.infiniband_adapters(sysfs)}
    assert set(hcas) == {"mlx5_0", "mlx5_1"}
    assert hcas["mlx5_1"].numa_node == 1
    assert hcas["mlx5_0"].ports == (topology.IbPort(1, "ACTIVE", "200 Gb/sec (4X HDR)"),)
    assert hcas["mlx5_0"].physical and hcas["mlx5_0"].active
    net = {a.name: a for a in topology.net_adapters(sysfs)}
    assert set(net) == {"eth0", "lo", "veth0"}
    assert net["eth0"].physical and net["eth0"].speed_mbps == 25000 and net["eth0"].operstate == "up"
    assert net["eth0"].pci_path == "/sys/devices/pci0000:00/0000:00:1c.0/0000:05:00.0"
    for name in ("lo", "veth0"):
        assert not net[name].physical and net[name].speed_mbps is None and net[name].numa_node is None


def test_distances(sysfs):
    hcas = {a.name: a for a in topology.infiniband_adapters(sysfs)}
    eth0 = next(a for a in topology.net_adapters(sysfs) if a.name == "eth0")
    gpu0 = topology.gpu_pci_path(GPU0, sysfs)
    gpu1 = topology.gpu_pci_path(GPU1, sysfs)
    assert topology.pci_distance(gpu0, hcas["mlx5_0"].pci_path, 0, 0) == (4, "PIX")
    assert topology.pci_distance(gpu0, eth0.pci_path, 0, 0) == (6, "PHB")
    assert topology.pci_distance(gpu1, hcas["mlx5_0"].pci_path, 1, 0) == (10, "SYS")
    assert topology.pci_distance(gpu1, hcas["mlx5_0"].pci_path.replace("pci0000:00", "pci0000:40"), 0, 0)[1] == "NODE"
    assert topology.pci_distance(gpu0, None) == (None, "?")


def test_each_gpu_gets_the_hca_of_its_switch_and_its_numa_cpus(sysfs):
    recommendations = topology.recommend([GPU0, GPU1], sysfs)
    assert [(r.local_rank, r.numa_node, r.cpus, r.ib_hcas, r.distance) for r in recommendations] == [
        (0, 0, tuple(range(0, 8)), ("mlx5_0",), "PIX"),
        (1, 1, tuple(range(8, 16)), ("mlx5_1",), "PIX"),
    ]
    assert recommendations[1].exports() == {"HPCGPU_RECOMMENDED_CPUS": "8-15", "NCCL_IB_HCA": "=mlx5_1"}


def test_ranks_sharing_a_numa_node_split_its_cpus(sysfs):
    recommendations = topology.recommend([GPU0, GPU1, GPU0, GPU1, None], sysfs)
    assert [(r.local_rank, r.cpus) for r in recommendations] == [
        (0, (0, 1, 2, 3)), (1, (8, 9, 10, 11)), (2, (4, 5, 6, 7)), (3, (12, 13, 14, 15))]


def test_a_down_hca_is_not_recommended(sysfs):
    Path(sysfs, "sys/class/infiniband/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    assert topology.recommend([GPU0], sysfs)[0].ib_hcas == ("mlx5_1",)


def test_no_numa_information_with_one_numa_node(sysfs):
    """numa_node -1 (VMs, one socket): the CPUs of the system's only NUMA node are the GPU's."""
    Path(sysfs, "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", GPU0, "numa_node").write_text("-1\n")
    assert topology.recommend([GPU0], sysfs)[0].cpus == ()   # two NUMA nodes: no guess
    os.rename(Path(sysfs, "sys/devices/system/node/node1"), Path(sysfs, "sys/devices/system/node/cpu-list-moved"))
    recommendation = topology.recommend([GPU0, GPU0], sysfs)
    assert recommendation[0].numa_node is None
    assert [r.cpus for r in recommendation] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_empty_infiniband_class(tmp_path):
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)
    text = "\n".join(info.format_topologies({"node": topology.node_report([], str(tmp_path))}))
    assert "InfiniBand: no HCA listed in /sys/class/infiniband" in text


def test_gpudirect_messages(sysfs, tmp_path):
    status = topology.gpudirect_status(sysfs)
    assert not status.possible
    assert "nvidia_peermem" in status.describe() and "absent" in status.describe()
    Path(sysfs, "sys/module/nvidia_peermem").mkdir()
    assert "nvidia_peermem loaded" in topology.gpudirect_status(sysfs).describe()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "does not apply" in topology.gpudirect_status(str(empty)).describe()
    (empty / "sys" / "module" / "nvidia").mkdir(parents=True)
    (empty / "proc" / "sys" / "kernel").mkdir(parents=True)
    (empty / "proc" / "sys" / "kernel" / "osrelease").write_text("6.5.0-1024-azure\n")
    (empty / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (empty / "proc" / "driver" / "nvidia" / "version").write_text("NVRM version: NVIDIA UNIX Open Kernel Module 550\n")
    assert topology.gpudirect_status(str(empty)).dma_buf


def test_empty_root_never_fails(tmp_path):
    report = topology.node_report([GPU0, None], str(tmp_path))
    assert report["adapters"] == [] and not report["infiniband_present"]
    assert report["recommendations"][0]["cpus"] == [] and report["recommendations"][0]["ib_hcas"] == []
    text = "\n".join(info.format_topologies({"node": report}))
    assert "/sys/class/infiniband absent" in text and "no physical network adapter" in text


def test_report_and_exports(sysfs):
    report = topology.node_report([GPU0, GPU1], sysfs)
    text = "\n".join(info.format_topologies({"n1": report, "n2": report}))
    assert "Network on n1 (and 1 more node(s) alike)" in text
    assert f"GPU {GPU0} (NUMA 0) to NICs: mlx5_0 PIX, mlx5_1 SYS, eth0 PHB" in text
    assert "virtual interfaces (no PCI device): lo, veth0" in text
    assert "local 1: GPU 0000:83:00.0: CPUs 8-15; NCCL_IB_HCA==mlx5_1 (PIX)" in text
    script = info.format_exports({"topologies": {"n1": report}})
    for local_rank, expected in (("0", "0-7 =mlx5_0"), ("1", "8-15 =mlx5_1")):
        out = subprocess.run(["bash", "-c", script + '\necho "$HPCGPU_RECOMMENDED_CPUS $NCCL_IB_HCA"'],
                             env={"PATH": os.environ["PATH"], "SLURM_LOCALID": local_rank},
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == expected


def test_nccl_topology_summary():
    xml = """<system version="1"><cpu numaid="0"><pci busid="0000:03:00.0"><gpu dev="0">
             <nvlink target="0000:83:00.0" count="18"/></gpu></pci>
             <nic><net name="mlx5_0" dev="0" speed="200000" gdr="1"/></nic></cpu></system>"""
    assert nccl_topology.summarise_nccl_topology(xml) == ["NUMA 0: GPUs GPU0 (18 NVLinks); NICs mlx5_0 200000 Mb/s GDR"]
    assert "could not parse" in nccl_topology.summarise_nccl_topology("<system")[0]


@pytest.mark.parametrize("n_ranks", [1, 2])
def test_info_prints_the_network_section(n_ranks):
    result = run_mpi(n_ranks, [sys.executable, "-m", "hpcgpu", "info"], timeout=120, cwd=str(ROOT))
    assert result.returncode == 0, result.output
    assert "Traceback" not in result.output
    assert "Network on " in result.output and "GPUDirect RDMA" in result.output
    assert f"ranks: {n_ranks} on" in result.output


@pytest.mark.mpi(ranks=[1, 2])
def test_nccl_topology_and_apply_on_cpu(comm):
    report = info.collect(comm, backend="numpy", nccl_topology=True)
    if comm.rank == 0:
        assert "does not apply" in report["nccl_topology"]["message"]
        assert "does not apply" in info.format_report(report)
        assert info.format_exports(report).startswith("# hpcgpu info --apply: nothing to export")


def test_apply_to_writes_the_exports_beside_the_report(tmp_path):
    """``hpcgpu info --apply-to FILE``: the usual report on stdout, the ``--apply`` lines in FILE (what the
    job scripts source per rank)."""
    target = tmp_path / "topology.sh"
    result = run_mpi(2, [sys.executable, "-m", "hpcgpu", "info", "--apply-to", str(target)], timeout=120, cwd=str(ROOT))
    assert result.returncode == 0, result.output
    assert "ranks: 2 on" in result.output and "Network on " in result.output
    assert target.read_text().startswith("# hpcgpu info --apply:")
    assert subprocess.run(["bash", "-n", str(target)]).returncode == 0

"""hpcgpu.runtime.container: the runtime is named from its marks, and what a container hides of its node
(GPUs, InfiniBand devices, CPUs) is reported with the fix.

The node is drawn as a file tree (what ``/sys``, ``/dev``, ``/run`` and ``/proc/1/environ`` hold inside
a container on a GPU node); this machine has no GPU or HCA, so those cases cannot be met for real here.
The image tests (tests/containers) run the same code inside a real Podman container.
"""

from __future__ import annotations

import os

import pytest

from hpcgpu.health.findings import FAIL, OK, WARN
from hpcgpu.health.job_checks import judge_container
from hpcgpu.observe.info import format_report, warnings_for
from hpcgpu.runtime import container


def make_node(root, gpus=0, gpu_files=0, hcas=(), verbs=0, cpuset="0-63", cpu_max="max 100000", mark=None):
    """A file tree of a node as seen from inside a container: ``gpus`` NVIDIA GPUs on PCI (plus a NIC),
    ``gpu_files`` /dev/nvidiaN, HCAs in sysfs, ``verbs`` uverbs files, a cgroup v2 cpuset and quota."""
    pci = root / "sys/bus/pci/devices"
    pci.mkdir(parents=True)
    for index in range(gpus):
        device = pci / f"0000:{0x18 + index:02x}:00.0"
        device.mkdir()
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text("0x030200\n")
    nic = pci / "0000:05:00.0"
    nic.mkdir()
    (nic / "vendor").write_text("0x15b3\n")
    (nic / "class").write_text("0x020700\n")
    (root / "dev").mkdir()
    for index in range(gpu_files):
        (root / "dev" / f"nvidia{index}").write_text("")
    (root / "dev" / "nvidiactl").write_text("")
    if hcas:
        (root / "sys/class/infiniband").mkdir(parents=True)
        for name in hcas:
            (root / "sys/class/infiniband" / name).mkdir()
    if verbs:
        (root / "dev/infiniband").mkdir()
        for index in range(verbs):
            (root / "dev/infiniband" / f"uverbs{index}").write_text("")
    (root / "sys/fs/cgroup").mkdir(parents=True)
    (root / "sys/fs/cgroup/cpuset.cpus.effective").write_text(cpuset + "\n")
    (root / "sys/fs/cgroup/cpu.max").write_text(cpu_max + "\n")
    if mark:
        (root / mark).parent.mkdir(parents=True, exist_ok=True)
        (root / mark).write_text("")
    return root


def view_of(root, **environment):
    view = container.inspect(root, environment=environment, load_libraries=False)
    view.node_cpus = 64     # os.cpu_count() is this machine's; the drawn node has 64
    return view


@pytest.mark.parametrize("mark, runtime", [("run/.containerenv", "podman"), (".dockerenv", "docker"),
                                           (".singularity.d/env", "apptainer")])
def test_runtime_is_named_from_its_mark(tmp_path, mark, runtime):
    assert container.detect_runtime(make_node(tmp_path, mark=mark), environment={})[0] == runtime


def test_apptainer_variable_and_pid1_container_variable_name_the_runtime(tmp_path):
    root = make_node(tmp_path)
    assert container.detect_runtime(root, {"APPTAINER_CONTAINER": "/images/hpcgpu.sif"}) == \
        ("apptainer", "APPTAINER_CONTAINER=/images/hpcgpu.sif")
    (root / "proc/1").mkdir(parents=True)
    (root / "proc/1/environ").write_bytes(b"PATH=/usr/bin\0container=lxc\0")
    assert container.detect_runtime(root, {})[0] == "lxc"


def test_bare_node_with_everything_visible_has_no_mismatch(tmp_path):
    view = view_of(make_node(tmp_path, gpus=4, gpu_files=4, hcas=("mlx5_0", "mlx5_1"), verbs=2),
                   SLURM_GPUS_ON_NODE="4")
    assert not view.in_container
    assert view.host_gpus == [f"0000:{0x18 + i:02x}:00.0" for i in range(4)]   # the NIC is not a GPU
    assert view.gpu_device_files == [f"/dev/nvidia{i}" for i in range(4)]     # nvidiactl is not one
    assert container.mismatches(view) == []
    assert judge_container(view.as_dict(), "node1").status == OK


def test_gpus_hidden_by_the_container_is_named_with_the_fix_and_fails_a_gpu_job(tmp_path):
    view = view_of(make_node(tmp_path, gpus=8, gpu_files=0, mark="run/.containerenv"), SLURM_GPUS_ON_NODE="8")
    (kind, message), = container.mismatches(view)
    assert kind == "gpus"
    assert "8 NVIDIA GPU(s) on PCI" in message and "podman container sees no /dev/nvidiaN" in message
    assert "--nv" in message and "nvidia.com/gpu=all" in message
    finding = judge_container(view.as_dict(), "node1")
    assert finding.status == FAIL and finding.scope == "node"


def test_fewer_gpu_files_than_slurm_gave_is_a_mismatch_and_without_slurm_a_warning_only(tmp_path):
    root = make_node(tmp_path, gpus=8, gpu_files=2, mark=".dockerenv")
    (kind, message), = container.mismatches(view_of(root, SLURM_GPUS_ON_NODE="4(IDX:0-3)"))
    assert kind == "gpus" and "gave the job 4 GPU(s)" in message and "sees 2" in message
    assert container.mismatches(view_of(root)) == []   # 2 of 8 without a request: a deliberate choice


def test_a_slurm_request_beyond_the_gpus_on_pci_is_not_blamed_on_the_container(tmp_path):
    """A node without GPUs on PCI (a CI node with fake GRES) inside a container: no container mismatch; the
    GPU count check reports a real shortfall."""
    root = make_node(tmp_path, gpus=0, gpu_files=0, mark=".dockerenv")
    assert container.mismatches(view_of(root, SLURM_GPUS_ON_NODE="2")) == []
    root = make_node(tmp_path / "two", gpus=2, gpu_files=1, mark=".dockerenv")
    (kind, message), = container.mismatches(view_of(root, SLURM_GPUS_ON_NODE="4"))
    assert kind == "gpus" and "sees 1" in message


def test_missing_infiniband_devices_and_missing_driver_libraries_are_warnings(tmp_path):
    view = view_of(make_node(tmp_path, gpus=2, gpu_files=2, hcas=("mlx5_0",), verbs=0, mark=".dockerenv"))
    view.driver_libraries = {"libcuda.so.1": False, "libnvidia-ml.so.1": True}
    kinds = dict(container.mismatches(view))
    assert set(kinds) == {"infiniband", "driver"}
    assert "mlx5_0" in kinds["infiniband"] and "TCP" in kinds["infiniband"] and "/dev/infiniband" in kinds["infiniband"]
    assert "libcuda.so.1" in kinds["driver"] and "libnvidia-ml" not in kinds["driver"]
    assert judge_container(view.as_dict(), "node1").status == WARN


@pytest.mark.parametrize("cpuset, cpu_max, job_cpus, usable", [
    ("0-3", "max 100000", None, 4.0),           # a cpuset of 4 on a 64-CPU node
    ("0-63", "150000 100000", None, 1.5),       # a quota of 1.5 CPUs (podman --cpus=1.5)
    ("0-15", "max 100000", "32", 16.0),         # Slurm gave 32 CPUs here, the container may use 16
])
def test_a_cpu_set_smaller_than_the_node_or_the_job_is_a_mismatch(tmp_path, cpuset, cpu_max, job_cpus, usable):
    environment = {"SLURM_CPUS_ON_NODE": job_cpus} if job_cpus else {}
    view = view_of(make_node(tmp_path, cpuset=cpuset, cpu_max=cpu_max, mark="run/.containerenv"), **environment)
    assert view.usable_cpus == usable
    (kind, message), = container.mismatches(view)
    assert kind == "cpus" and f"may use {usable:g} CPU(s)" in message
    assert (f"Slurm gave the job {job_cpus}" if job_cpus else "the node has 64") in message


def test_slurm_giving_part_of_the_node_is_no_mismatch_when_the_container_has_all_of_it(tmp_path):
    view = view_of(make_node(tmp_path, cpuset="0-15", mark="run/.containerenv"), SLURM_CPUS_ON_NODE="16")
    assert container.mismatches(view) == []


def test_cgroup_v1_quota_and_cpuset_are_read(tmp_path):
    base = tmp_path / "sys/fs/cgroup"
    (base / "cpuset").mkdir(parents=True)
    (base / "cpu,cpuacct").mkdir()
    (base / "cpuset/cpuset.effective_cpus").write_text("0-1,4\n")
    (base / "cpu,cpuacct/cpu.cfs_quota_us").write_text("200000\n")
    (base / "cpu,cpuacct/cpu.cfs_period_us").write_text("100000\n")
    assert container.cgroup_cpu_limits(tmp_path) == ([0, 1, 4], 2.0)
    (base / "cpu,cpuacct/cpu.cfs_quota_us").write_text("-1\n")
    assert container.cgroup_cpu_limits(tmp_path) == ([0, 1, 4], None)


def test_info_report_names_the_container_and_warns_about_what_it_hides(tmp_path):
    view = view_of(make_node(tmp_path, gpus=4, gpu_files=0, hcas=("mlx5_0",), mark="run/.containerenv"))
    report = {"hpcgpu": "0", "python": "3", "mpi_library": "MPICH", "mpi_standard": "4.1", "mpi_cuda_aware": False,
              "n_ranks": 1, "n_nodes": 1, "nccl": None, "backend": "cpu", "backend_reason": "no GPU",
              "transport": "mpi", "ranks": [], "link_matrices": {}, "topologies": {},
              "containers": {"gpu7": view.as_dict()}}
    text = format_report(report)
    assert "Container on gpu7: inside a podman container (/run/.containerenv); GPUs 0 visible of 4 on PCI" in text
    warnings = warnings_for(report)
    assert [w.split(":")[1].strip() for w in warnings] == ["GPUs hidden", "no InfiniBand devices"]
    assert all(f"WARNING: {w}" in text for w in warnings)


def test_this_machine_is_read_without_errors():
    """The real readers on the real file system: whatever this machine is, the view is consistent."""
    view = container.inspect()
    assert view.node_cpus == os.cpu_count()
    assert view.usable_cpus is None or 0 < view.usable_cpus <= view.node_cpus
    device_files = [name for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit()]
    assert len(view.gpu_device_files) == len(device_files)
    assert container.describe(view).startswith("inside a " if view.in_container else "no container detected")

"""Is this process inside a container, and does the container hide part of its node?

A container shares the host's kernel, so some of the node stays visible from inside even when the
runtime did not pass it through: ``/sys`` lists every PCI device and InfiniBand adapter of the host,
while ``/dev`` holds only the device files the runtime mounted, and the container's cgroup says how
many CPUs it may use. :func:`inspect` reads both sides; :func:`mismatches` names what the job would
miss:

* **GPUs hidden**: NVIDIA GPUs on the node's PCI bus but no ``/dev/nvidiaN`` (Apptainer without
  ``--nv``, Podman/Docker without ``--gpus``/``--device nvidia.com/gpu=all``), fewer device files
  than the job asked Slurm for, or device files without the driver's libraries (``libcuda``,
  ``libnvidia-ml``): CuPy and NVML then fail, and ``--backend auto`` runs on the CPU;
* **no InfiniBand devices**: HCAs in ``/sys/class/infiniband`` but no ``/dev/infiniband/uverbs*``:
  NCCL and MPI fall back to TCP sockets, many times slower between nodes;
* **a CPU set smaller than the node**: the container's cpuset or CPU quota allows fewer CPUs than
  the node has (or than Slurm gave the job on it): ranks and threads share the few.

The runtime is named from the marks runtimes leave: Podman ``/run/.containerenv``, Docker
``/.dockerenv``, Apptainer/Singularity ``/.singularity.d`` (or ``APPTAINER_CONTAINER``), and the
``container`` variable of PID 1 (systemd's convention, set by Podman and LXC). enroot (Slurm's pyxis)
leaves none of these; the device and CPU checks run inside any container and on bare nodes alike.

Every reader takes ``root`` (the file-system root, ``/`` by default) so tests can point it at a
prepared tree. Nothing here starts MPI, loads CUDA or needs root.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpcgpu.runtime.affinity import format_cpus
from hpcgpu.runtime.topology import parse_cpulist

#: PCI vendor id of NVIDIA, and the PCI classes of its GPUs (VGA controller, 3D controller).
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
#: The driver libraries a GPU container needs besides the device files (the runtime mounts them).
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
_GPU_DEVICE = re.compile(r"nvidia(\d+)")


@dataclass
class ContainerView:
    """What this process sees of its node, from inside a container or not.

    Attributes
    ----------
    runtime : str or None
        ``podman``, ``docker``, ``apptainer``, another name from PID 1's ``container`` variable, or
        None when no container is detected.
    evidence : str
        What the runtime was recognised by (a file or a variable), or why none was.
    host_gpus : list of str
        PCI addresses of the NVIDIA GPUs of the node (``/sys/bus/pci/devices``).
    gpu_device_files : list of str
        ``/dev/nvidiaN`` files this process can see.
    driver_libraries : dict
        For each of :data:`DRIVER_LIBRARIES`: whether it loads (None: not tried, no GPU device file).
    requested_gpus : int or None
        GPUs the job asked for on this node (``SLURM_GPUS_ON_NODE``), None outside such a job.
    host_hcas : list of str
        InfiniBand adapters of the node (``/sys/class/infiniband``).
    verbs_device_files : list of str
        ``/dev/infiniband/uverbs*`` files this process can see.
    node_cpus : int
        CPUs of the node (``os.cpu_count()``: the kernel's count, not limited by cgroups).
    cpuset : list of int or None
        CPUs the container's cgroup allows (``cpuset.cpus.effective``), None when unknown.
    cpu_quota : float or None
        CPUs' worth of time the cgroup allows per period (``cpu.max`` / CFS quota), None: no limit.
    job_cpus_on_node : int or None
        CPUs Slurm gave the job on this node (``SLURM_CPUS_ON_NODE``), None outside Slurm.
    """

    runtime: str | None
    evidence: str
    host_gpus: list[str] = field(default_factory=list)
    gpu_device_files: list[str] = field(default_factory=list)
    driver_libraries: dict = field(default_factory=dict)
    requested_gpus: int | None = None
    host_hcas: list[str] = field(default_factory=list)
    verbs_device_files: list[str] = field(default_factory=list)
    node_cpus: int = 0
    cpuset: list[int] | None = None
    cpu_quota: float | None = None
    job_cpus_on_node: int | None = None

    @property
    def in_container(self) -> bool:
        return self.runtime is not None

    @property
    def usable_cpus(self) -> float | None:
        """The CPUs the container may use: the smaller of its cpuset and its quota (None: unknown)."""
        limits = [float(len(self.cpuset))] if self.cpuset else []
        if self.cpu_quota is not None:
            limits.append(self.cpu_quota)
        return min(limits) if limits else None

    def as_dict(self) -> dict:
        return asdict(self)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def detect_runtime(root: str | Path = "/", environment: dict | None = None) -> tuple[str | None, str]:
    """(runtime name or None, what it was recognised by) from the marks container runtimes leave."""
    root = Path(root)
    environment = os.environ if environment is None else environment
    if (root / "run/.containerenv").exists():
        return "podman", "/run/.containerenv"
    if (root / ".dockerenv").exists():
        return "docker", "/.dockerenv"
    for variable in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"):
        if environment.get(variable):
            return "apptainer", f"{variable}={environment[variable]}"
    if (root / ".singularity.d").is_dir():
        return "apptainer", "/.singularity.d"
    try:
        init_environment = (root / "proc/1/environ").read_bytes().split(b"\0")
    except OSError:
        init_environment = []
    for entry in init_environment:
        if entry.startswith(b"container=") and len(entry) > len(b"container="):
            return entry.split(b"=", 1)[1].decode(errors="replace"), "container= in the environment of PID 1"
    return None, "no container marks (/run/.containerenv, /.dockerenv, /.singularity.d, container= of PID 1)"


def host_gpus(root: str | Path = "/") -> list[str]:
    """PCI addresses of the node's NVIDIA GPUs, from sysfs (visible inside containers too)."""
    found = []
    devices = Path(root) / "sys/bus/pci/devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return found
    for device in entries:
        if _read(device / "vendor") == NVIDIA_VENDOR and (_read(device / "class") or "")[:6] in GPU_CLASSES:
            found.append(device.name)
    return found


def gpu_device_files(root: str | Path = "/") -> list[str]:
    """The ``/dev/nvidiaN`` files present, in GPU order."""
    try:
        names = [p.name for p in (Path(root) / "dev").iterdir() if _GPU_DEVICE.fullmatch(p.name)]
    except OSError:
        return []
    return ["/dev/" + name for name in sorted(names, key=lambda n: int(_GPU_DEVICE.fullmatch(n).group(1)))]


def driver_libraries_load() -> dict:
    """For each of :data:`DRIVER_LIBRARIES`, whether the dynamic loader finds and loads it."""
    loaded = {}
    for name in DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
            loaded[name] = True
        except OSError:
            loaded[name] = False
    return loaded


def infiniband(root: str | Path = "/") -> tuple[list[str], list[str]]:
    """(HCAs in ``/sys/class/infiniband``, ``/dev/infiniband/uverbs*`` files present)."""
    root = Path(root)
    try:
        hcas = sorted(p.name for p in (root / "sys/class/infiniband").iterdir())
    except OSError:
        hcas = []
    try:
        verbs = sorted("/dev/infiniband/" + p.name for p in (root / "dev/infiniband").iterdir()
                       if p.name.startswith("uverbs"))
    except OSError:
        verbs = []
    return hcas, verbs


def cgroup_cpu_limits(root: str | Path = "/") -> tuple[list[int] | None, float | None]:
    """(cpuset, quota in CPUs) of the cgroup mounted at ``/sys/fs/cgroup`` (v2, else v1).

    Inside a container that mount is the container's own cgroup; on a bare node it is the root cgroup
    (no limit). Either value is None when it cannot be read or does not limit.
    """
    base = Path(root) / "sys/fs/cgroup"
    cpuset_text = _read(base / "cpuset.cpus.effective") or _read(base / "cpuset/cpuset.effective_cpus") \
        or _read(base / "cpuset/cpuset.cpus")
    cpuset = parse_cpulist(cpuset_text) or None
    quota = None
    maximum = _read(base / "cpu.max")
    if maximum:                                   # v2: "max 100000" or "150000 100000"
        limit, _, period = maximum.partition(" ")
        if limit != "max" and period:
            quota = int(limit) / int(period)
    else:
        for directory in ("cpu,cpuacct", "cpu"):  # v1: quota -1 means no limit
            limit, period = _read(base / directory / "cpu.cfs_quota_us"), _read(base / directory / "cpu.cfs_period_us")
            if limit and period:
                if int(limit) > 0:
                    quota = int(limit) / int(period)
                break
    return cpuset, quota


def _positive_int(text: str | None) -> int | None:
    digits = re.match(r"\d+", text or "")
    return int(digits.group()) if digits and int(digits.group()) > 0 else None


def inspect(root: str | Path = "/", environment: dict | None = None, load_libraries: bool = True) -> ContainerView:
    """What this process sees of its node (see :class:`ContainerView`).

    Parameters
    ----------
    root : path
        The file-system root to read (``/``; tests pass a prepared tree).
    environment : dict, optional
        The variables to read (``os.environ``).
    load_libraries : bool
        Try to load the driver libraries when a GPU device file is present.
    """
    environment = os.environ if environment is None else environment
    runtime, evidence = detect_runtime(root, environment)
    devices = gpu_device_files(root)
    hcas, verbs = infiniband(root)
    cpuset, quota = cgroup_cpu_limits(root)
    return ContainerView(
        runtime=runtime, evidence=evidence, host_gpus=host_gpus(root), gpu_device_files=devices,
        driver_libraries=driver_libraries_load() if devices and load_libraries else {},
        requested_gpus=_positive_int(environment.get("SLURM_GPUS_ON_NODE")),
        host_hcas=hcas, verbs_device_files=verbs, node_cpus=os.cpu_count() or 0, cpuset=cpuset,
        cpu_quota=quota, job_cpus_on_node=_positive_int(environment.get("SLURM_CPUS_ON_NODE")))


def describe(view: ContainerView) -> str:
    """One line: the runtime (or none) and what the process sees of GPUs, InfiniBand and CPUs."""
    where = f"inside a {view.runtime} container ({view.evidence})" if view.in_container else "no container detected"
    gpus = f"GPUs {len(view.gpu_device_files)} visible of {len(view.host_gpus)} on PCI"
    hcas = f"InfiniBand {len(view.verbs_device_files)} verbs device(s) for {len(view.host_hcas)} HCA(s)"
    usable = view.usable_cpus
    cpus = f"CPUs {view.node_cpus} on the node"
    if usable is not None and usable < view.node_cpus:
        cpus += f", {usable:g} usable (cgroup {_limit_text(view)})"
    return f"{where}; {gpus}; {hcas}; {cpus}"


def _limit_text(view: ContainerView) -> str:
    parts = []
    if view.cpuset:
        parts.append(f"cpuset {format_cpus(view.cpuset)}")
    if view.cpu_quota is not None:
        parts.append(f"quota {view.cpu_quota:g} CPUs")
    return ", ".join(parts)


def mismatches(view: ContainerView) -> list[tuple[str, str]]:
    """What of the node this process cannot use: ``(kind, message)`` pairs, ``kind`` one of ``gpus``,
    ``driver``, ``infiniband``, ``cpus``; each message says what was expected, what was found and the fix."""
    found = []
    inside = f"the {view.runtime} container" if view.in_container else "this process"
    if view.host_gpus and not view.gpu_device_files:
        found.append(("gpus",
            f"GPUs hidden: the node has {len(view.host_gpus)} NVIDIA GPU(s) on PCI but {inside} sees no "
            "/dev/nvidiaN, so the job runs on the CPU; pass the GPUs through (apptainer exec --nv, podman/docker "
            "run --device nvidia.com/gpu=all or --gpus all, pyxis does it by itself)"))
    elif view.requested_gpus and len(view.gpu_device_files) < min(view.requested_gpus, len(view.host_gpus)):
        # Only GPUs the node has on PCI can be hidden by the container; a request beyond what the node has
        # (a fake GRES, a wrong gres.conf) is the GPU count check's finding, not the container's.
        found.append(("gpus",
            f"GPUs hidden: Slurm gave the job {view.requested_gpus} GPU(s) on this node (SLURM_GPUS_ON_NODE) but "
            f"{inside} sees {len(view.gpu_device_files)} /dev/nvidiaN; pass all of them through (apptainer --nv, "
            "podman --device nvidia.com/gpu=all)"))
    missing = [name for name, loads in view.driver_libraries.items() if not loads]
    if view.gpu_device_files and missing:
        found.append(("driver",
            f"GPU driver libraries missing: {inside} has {len(view.gpu_device_files)} /dev/nvidiaN but cannot load "
            f"{', '.join(missing)}; the runtime mounts the host's driver libraries with apptainer --nv or the "
            "NVIDIA Container Toolkit (podman/docker --device nvidia.com/gpu=all), not with a bare --device"))
    if view.host_hcas and not view.verbs_device_files:
        found.append(("infiniband",
            f"no InfiniBand devices: the node has HCA(s) {', '.join(view.host_hcas)} but {inside} sees no "
            "/dev/infiniband/uverbs*, so NCCL and MPI fall back to TCP sockets between nodes; pass "
            "--device /dev/infiniband (podman/docker), or bind /dev/infiniband (apptainer binds /dev by default)"))
    usable = view.usable_cpus
    expected = view.job_cpus_on_node or view.node_cpus
    if usable is not None and expected and usable < expected:
        given = (f"Slurm gave the job {expected} on this node" if view.job_cpus_on_node
                 else f"the node has {expected}")
        found.append(("cpus",
            f"CPU set smaller than the node: {inside} may use {usable:g} CPU(s) ({_limit_text(view)}) but {given}; "
            "ranks and threads beyond that share them; give the container the job's CPUs (no --cpus or "
            "--cpuset-cpus limit for podman/docker)"))
    return found

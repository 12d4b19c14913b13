"""One GPU per rank, chosen by node-local rank.

How the GPU is chosen, in order:

1. If this rank sees exactly one GPU (a scheduler gave each task its own, for example Slurm's
   ``--gpus-per-task=1`` with GPU binding, or a wrapper set ``CUDA_VISIBLE_DEVICES``), use it.
2. Otherwise use visible device ``local_rank % n_visible``.

Then the ranks of a node compare the UUIDs of the GPUs they picked. Two ranks on one GPU is an error
(``HpcgpuError``) unless sharing was asked for (``allow_sharing=True`` or ``HPCGPU_ALLOW_GPU_SHARING=1``),
because it silently halves the speed of both and breaks NCCL's one-rank-per-device rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcgpu.errors import BackendError


@dataclass(frozen=True)
class GpuIdentity:
    """What identifies a GPU across processes (visible indices differ between ranks; UUIDs do not)."""

    device_id: int
    name: str
    uuid: str
    pci_bus_id: str


def probe_cupy() -> tuple[bool, str]:
    """Return (usable, reason): whether CuPy imports and sees at least one working GPU."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"CuPy cannot reach a CUDA driver ({type(exc).__name__}: {exc})"
    if count == 0:
        return False, "CuPy is installed but no GPU is visible"
    return True, f"CuPy {cupy.__version__} sees {count} GPU(s)"


def gpu_identity(device_id: int) -> GpuIdentity:
    """Name, UUID and PCI bus id of visible device ``device_id``."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    pci_bus_id = cupy.cuda.runtime.deviceGetPCIBusId(device_id)
    return GpuIdentity(device_id, name, _uuid(pci_bus_id, props.get("uuid", b"")), pci_bus_id)


def _uuid(pci_bus_id: str, raw: bytes) -> str:
    """The GPU's UUID as nvidia-smi prints it: from NVML, else from CUDA's 16 bytes.

    CuPy returns CUDA's uuid as a C string, cut at the first zero byte, so it is only trusted when
    all 16 bytes arrived.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id))
        return uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:
        pass
    if isinstance(raw, bytes) and len(raw) == 16:
        h = raw.hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return f"unknown (PCI {pci_bus_id})"


def sharing_allowed(allow_sharing: bool) -> bool:
    """True if ranks may share a GPU (argument or ``HPCGPU_ALLOW_GPU_SHARING=1``)."""
    return allow_sharing or os.environ.get("HPCGPU_ALLOW_GPU_SHARING", "0") not in ("", "0")


def select_device(comm, allow_sharing: bool = False) -> tuple[int, str]:
    """Collective over ``comm``: choose this rank's GPU and check that no two local ranks share one.

    Returns
    -------
    device_id : int
        Index among this process's visible devices.
    reason : str
        One line saying how the device was chosen.
    """
    import cupy

    n_visible = cupy.cuda.runtime.getDeviceCount()
    if n_visible == 1:
        device_id, how = 0, "the only GPU visible to this rank"
    else:
        device_id = comm.local_rank % n_visible
        how = f"node-local rank {comm.local_rank} of {comm.local_size}, {n_visible} GPUs visible"
    identity = gpu_identity(device_id)
    # The PCI bus id names a GPU uniquely within a node, whatever each rank's CUDA_VISIBLE_DEVICES.
    uuids = comm.node.allgather(identity.pci_bus_id)
    shared = [r for r, u in enumerate(uuids) if u == identity.pci_bus_id]
    problem = None
    if len(shared) > 1 and not sharing_allowed(allow_sharing):
        problem = (
            f"node-local ranks {shared} on {comm.hostname} would all use GPU {identity.pci_bus_id} ({identity.uuid}): "
            f"expected one rank per GPU, found {comm.local_size} ranks for "
            f"{len(set(uuids))} distinct GPU(s). Start at most that many ranks per node, give each task "
            "its own GPU (Slurm: --gpus-per-task=1), or set HPCGPU_ALLOW_GPU_SHARING=1 to share on purpose."
        )
    comm.check(problem is None, problem or "", error=BackendError)
    return device_id, how

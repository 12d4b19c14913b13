"""CUDA IPC: map another process's device memory into this one (GPUs of one node).

A rank *exports* a device pointer as ``(handle, offset)``: the IPC handle of the whole
allocation that holds it (``cudaIpcGetMemHandle`` works on allocation bases only, and CuPy's
memory pool sub-allocates, so the base is found with ``cuMemGetAddressRange``) and the
pointer's byte offset in it. The pair travels to the peer by MPI (it is plain bytes and an
int); the peer *opens* the handle (``cudaIpcOpenMemHandle``, which also enables peer access
to the exporting GPU) and adds the offset. From then on the peer's kernels and
``cudaMemcpyAsync`` calls read and write that memory directly over NVLink / PCIe.

A process may open one allocation's handle only once, and several arrays of a peer often
live in one allocation (pool chunks), so opened handles are cached for the life of the
process (:func:`open_peer_pointer`); they are never closed. ``cudaIpcGetMemHandle`` returns
a new, unique handle for memory that was freed and allocated again, so a cached mapping is
never mistaken for a newer allocation at the same address.

Every GPU of the node must be reachable from every rank. Per-task GPU binding that the node
enforces (Slurm ``--gpus-per-task=1 --gpu-bind=per_task:1`` on a site whose cgroups constrain
devices, or a container per rank) hides the neighbours' GPUs, and opening their handles fails:
:func:`open_peer_pointer` then raises :class:`PeerAccessError`, saying why and what to do.

CuPy is imported inside the functions: importing this module needs no GPU.
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np

from hpcgpu.errors import BackendError

# (device id, handle bytes) -> base address of the mapped allocation in this process
_opened: dict[tuple[int, bytes], int] = {}


class PeerAccessError(BackendError, RuntimeError):
    """A neighbour's GPU memory cannot be mapped into this process (CUDA IPC); a RuntimeError too, so
    callers that fall back to NCCL on a failed mapping keep doing so."""


def _peer_access_help(error) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"cannot map a neighbour's GPU memory with CUDA IPC (cudaIpcOpenMemHandle: {error}); this rank sees "
            f"CUDA_VISIBLE_DEVICES={visible if visible is not None else '(unset)'}. The peer paths (--peer-halo, "
            "the MD peer exchange, --allreduce peer) need every GPU of the node reachable from every rank: per-task "
            "GPU binding that the node enforces (Slurm --gpus-per-task=1 / --gpu-bind=per_task:1 with cgroup "
            "ConstrainDevices) hides them. Ask Slurm for --gpus-per-node=G without --gpu-bind (hpcgpu picks GPU "
            "local_rank % G; the jobscripts do so), or use the NCCL path: drop --peer-halo, --allreduce nccl, "
            "MD exchange nccl")


@functools.cache
def libcuda():
    """The CUDA driver library (for ``cuMemGetAddressRange``, which the runtime API lacks)."""
    return ctypes.CDLL("libcuda.so.1")


def allocation_base(pointer: int) -> int:
    """Base address of the device allocation holding ``pointer`` (CuPy's pool sub-allocates)."""
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
    if status != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed (CUDA error {status}) for {pointer:#x}")
    return base.value


def export_pointer(pointer: int) -> tuple[bytes, int]:
    """(IPC handle of the allocation, byte offset of ``pointer`` in it): what a peer needs to map it."""
    import cupy

    base = allocation_base(pointer)
    return bytes(cupy.cuda.runtime.ipcGetMemHandle(base)), pointer - base


def open_peer_pointer(handle_and_offset: tuple[bytes, int]) -> int:
    """This process's address of a peer's exported pointer; the handle is opened once per device.

    Raises
    ------
    PeerAccessError
        When the handle cannot be opened (the peer's GPU is not reachable from this process).
    """
    import cupy

    handle, offset = handle_and_offset
    key = (cupy.cuda.runtime.getDevice(), bytes(handle))
    if key not in _opened:
        try:
            _opened[key] = int(cupy.cuda.runtime.ipcOpenMemHandle(bytes(handle)))
        except cupy.cuda.runtime.CUDARuntimeError as error:
            raise PeerAccessError(_peer_access_help(error)) from error
    return _opened[key] + int(offset)


def opened_mappings() -> dict:
    """The cache of opened peer allocations, ``{(device id, handle bytes): base address}`` (mutable: used
    by :func:`hpcgpu.transport.peer_memory.close_peer_mappings`)."""
    return _opened


def pointer_arg(address: int):
    """A raw device address as a kernel argument (CuPy passes numpy.uint64 as a 64-bit value)."""
    return np.uint64(address)

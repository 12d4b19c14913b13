"""Transports: how halo messages move between ranks.

All transports take a planned :class:`~hpcgpu.halo.HaloExchange` and return a handle with ``wait()``.

============== ================================ =====================================================
name           arrays                           how
============== ================================ =====================================================
``mpi``        NumPy                            MPI Isend/Irecv on host memory
``nccl``       CuPy                             NCCL send/recv in one group on the high-priority
                                                communication stream, ordered after the compute
                                                stream by events; no host synchronisation
``mpi-cuda``   CuPy, CUDA-aware MPI only        the stream is synchronised, then MPI gets device
                                                pointers
``mpi-staged`` CuPy                             device -> pinned host copy, MPI on host, copy back
============== ================================ =====================================================

:func:`default_transport` picks ``mpi`` on CPUs and the first usable of ``nccl``, ``mpi-cuda``,
``mpi-staged`` on GPUs. ``HPCGPU_TRANSPORT`` overrides the choice for the whole job.
"""

from __future__ import annotations

import os

from hpcgpu.errors import BackendError

TRANSPORTS = ("mpi", "nccl", "mpi-cuda", "mpi-staged")


def make_transport(name: str, comm, arch):
    """Build the transport called ``name`` for ``comm`` and ``arch`` (collective for ``nccl``)."""
    if name not in TRANSPORTS:
        raise BackendError(f"unknown transport {name!r}; expected one of {', '.join(TRANSPORTS)}")
    if not arch.is_gpu:
        if name != "mpi":
            raise BackendError(f"transport {name!r} moves GPU arrays, but the architecture is the CPU; use 'mpi'")
        from hpcgpu.transport.mpi_host import MpiHostTransport

        return MpiHostTransport(comm)
    if name == "mpi":
        raise BackendError("transport 'mpi' moves host arrays; on a GPU use 'nccl', 'mpi-cuda' or 'mpi-staged'")
    if name == "nccl":
        from hpcgpu.transport.nccl import NcclTransport, nccl_communicator

        return NcclTransport(nccl_communicator(comm))
    if name == "mpi-cuda":
        from hpcgpu.transport.mpi_device import CudaAwareMpiTransport, mpi_is_cuda_aware

        if not mpi_is_cuda_aware():
            raise BackendError(
                "transport 'mpi-cuda' needs an MPI library built with CUDA support, but this one does not "
                "report it (MPIX_Query_cuda_support). Use 'nccl' or 'mpi-staged', or set "
                "HPCGPU_CUDA_AWARE_MPI=1 if you know better."
            )
        return CudaAwareMpiTransport(comm)
    from hpcgpu.transport.mpi_device import StagedMpiTransport

    return StagedMpiTransport(comm)


def auto_transport_name(arch) -> str:
    """The transport :func:`default_transport` would pick for ``arch`` (honours ``HPCGPU_TRANSPORT``)."""
    override = os.environ.get("HPCGPU_TRANSPORT", "")
    if override:
        return override
    if not arch.is_gpu:
        return "mpi"
    from hpcgpu.transport.nccl import nccl_available
    from hpcgpu.transport.mpi_device import mpi_is_cuda_aware

    if nccl_available():
        return "nccl"
    return "mpi-cuda" if mpi_is_cuda_aware() else "mpi-staged"


def default_transport(comm, arch):
    """The job's transport for ``arch``, built once per communicator (collective on first use)."""
    cache = comm.__dict__.setdefault("_transports", {})
    key = (arch.name, arch.device_id)
    if key not in cache:
        cache[key] = make_transport(auto_transport_name(arch), comm, arch)
    return cache[key]

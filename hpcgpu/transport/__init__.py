"""Transports: the only code that moves data between ranks.

Two kinds of object, both built on the job's one transport choice:

* **collectives** (:func:`collectives`, :mod:`hpcgpu.transport.collectives`): allreduce,
  reduce-scatter, allgather(v), broadcast, gather/scatter(v), alltoallv and paired point-to-point
  messages on host or device buffers -- what particles, training and checkpoints use;
* **halo transports** (:func:`default_transport`): the planned, graph-capturable exchange of field
  halos. They take a planned :class:`~hpcgpu.halo.HaloExchange` and return a handle with ``wait()``:

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

:func:`select_transport` chooses the job's transport once per communicator (an explicit request such as
the ``--transport`` flag, else ``HPCGPU_TRANSPORT``, else ``mpi`` on CPUs and the first usable of ``nccl``,
``mpi-cuda``, ``mpi-staged`` on GPUs) and keeps it in ``comm.job_transport``
(:mod:`hpcgpu.transport.selection`); halos (:func:`default_transport`), particle ghosts and device
collectives all read it there (:mod:`hpcgpu.transport.job`). Besides: CUDA-IPC peer windows
(:mod:`hpcgpu.transport.peer_memory`) for apps that store into a neighbour's memory directly.
"""

from __future__ import annotations

from hpcgpu.errors import BackendError
from hpcgpu.transport.collectives import Collectives, collectives
from hpcgpu.transport.job import JobTransport, TransportChoice, job_transport
from hpcgpu.transport.messages import Message
from hpcgpu.transport.mpi_device import CudaAwareMpiTransport, StagedMpiTransport, mpi_is_cuda_aware
from hpcgpu.transport.mpi_host import MpiHostTransport
from hpcgpu.transport.nccl import NcclTransport, nccl_communicator
from hpcgpu.transport.selection import (
    TRANSPORTS,
    select_transport,
    transport_choice,
    transport_name,
)

__all__ = ["TRANSPORTS", "Collectives", "JobTransport", "Message", "TransportChoice", "collectives",
           "default_transport", "job_transport", "make_transport", "select_transport", "transport_choice",
           "transport_name"]


def make_transport(name: str, comm, arch):
    """Build the halo transport called ``name`` for ``comm`` and ``arch`` (collective for ``nccl``).

    Benchmarks and tests compare transports with it; a job's exchanges use :func:`default_transport`.
    """
    if name not in TRANSPORTS:
        raise BackendError(f"unknown transport {name!r}; expected one of {', '.join(TRANSPORTS)}")
    if not arch.is_gpu:
        if name != "mpi":
            raise BackendError(f"transport {name!r} moves GPU arrays, but the architecture is the CPU; use 'mpi'")
        return MpiHostTransport(comm)
    if name == "mpi":
        raise BackendError("transport 'mpi' moves host arrays; on a GPU use 'nccl', 'mpi-cuda' or 'mpi-staged'")
    if name == "nccl":
        return NcclTransport(nccl_communicator(comm))
    if name == "mpi-cuda":
        if not mpi_is_cuda_aware():
            raise BackendError(
                "transport 'mpi-cuda' needs an MPI library built with CUDA support, but this one does not "
                "report it (MPIX_Query_cuda_support). Use 'nccl' or 'mpi-staged', or set "
                "HPCGPU_CUDA_AWARE_MPI=1 if you know better."
            )
        return CudaAwareMpiTransport(comm)
    return StagedMpiTransport(comm)


def default_transport(comm, arch):
    """The job's halo transport for ``arch``: :func:`select_transport`'s choice, built once per
    communicator and architecture (collective on first use) and kept with the communicator."""
    name = select_transport(comm, arch)
    transports = job_transport(comm).halo_transports
    key = (arch.name, arch.device_id)
    if key not in transports:
        transports[key] = make_transport(name, comm, arch)
    return transports[key]

"""Collectives on device arrays: NCCL when the job's transport is ``nccl``, else host-staged MPI.

Which one is the job's choice (:func:`hpcgpu.transport.select_transport`): ``nccl`` reduces with NCCL on
the current stream; ``mpi-cuda`` and ``mpi-staged`` copy to the host and reduce with MPI (there is no
CUDA-aware collective path).
"""

from __future__ import annotations

from hpcgpu.transport.nccl import NcclCollectives
from hpcgpu.transport.selection import select_transport_for


class StagedCollectives:
    """Copy to the host, reduce with MPI, copy back (correct everywhere, slow)."""

    name = "mpi-staged"

    def __init__(self, comm):
        self.comm = comm

    def allreduce(self, array, op: str):
        import cupy

        host = cupy.asnumpy(array)  # synchronous: the stream that wrote ``array`` has finished
        return cupy.asarray(self.comm.allreduce(host, op))

    def broadcast(self, array, root: int):
        host = array.get()
        self.comm.mpi.Bcast(host, root=root)
        array.set(host)
        return array


def make_device_collectives(comm):
    """Build the collectives of the job's GPU transport (collective: may select it, and create NCCL's
    communicator)."""
    if select_transport_for(comm, is_gpu=True) == "nccl":
        return NcclCollectives(comm)
    return StagedCollectives(comm)


def device_collectives(comm):
    """The job's collectives for device arrays, built on first use and kept in ``comm.job_transport``.

    Collective the first time: every rank must reach its first device collective together."""
    job = comm.job_transport
    if job.device_collectives is None:
        job.device_collectives = make_device_collectives(comm)
    return job.device_collectives

"""Collectives on device arrays: NCCL where available, else host-staged MPI."""

from __future__ import annotations

import os


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
    """NCCL collectives unless ``HPCGPU_TRANSPORT`` asks for an MPI transport or NCCL is missing."""
    from hpcgpu.transport.nccl import NcclCollectives, nccl_available

    requested = os.environ.get("HPCGPU_TRANSPORT", "")
    if nccl_available() and requested in ("", "nccl"):
        return NcclCollectives(comm)
    return StagedCollectives(comm)

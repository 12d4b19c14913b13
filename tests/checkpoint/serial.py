"""In-process stand-ins for one rank, so single-rank checkpoint tests need no MPI launch.

``SerialComm`` is a real Communicator of this process alone; ``BoxGrid`` is a
decomposition of which this process owns an arbitrary box, so one process can play any rank of any
decomposition (to read a checkpoint as rank 2 of 3 would).
"""

from __future__ import annotations

import numpy as np



def SerialComm():
    """A real one-rank :class:`hpcgpu.Communicator` (on ``MPI.COMM_SELF``): this process alone, so
    single-rank checkpoint tests need no launch."""
    from mpi4py import MPI

    import hpcgpu

    return hpcgpu.Communicator(MPI.COMM_SELF.Dup())


class BoxGrid:
    """The part of a decomposition a Field needs: this process owns ``[start, start + shape)``."""

    def __init__(self, global_shape, start=None, shape=None, dims=None):
        self.global_shape = tuple(global_shape)
        self.ndim = len(self.global_shape)
        self.local_start = tuple(start or (0,) * self.ndim)
        self.local_shape = tuple(shape or self.global_shape)
        self.local_stop = tuple(s + n for s, n in zip(self.local_start, self.local_shape))
        self.dims = tuple(dims or (1,) * self.ndim)
        self.periodic = (False,) * self.ndim


class HostField:
    """A Field-like object on the CPU (no ghost cells needed for I/O tests)."""

    def __init__(self, grid, dtype="float64", name="f"):
        import hpcgpu.arch

        self.decomposition, self.name = grid, name
        self.arch = hpcgpu.arch.CPU()
        self.data = np.zeros(grid.local_shape, dtype=dtype)
        self.interior = self.data

    @property
    def dtype(self):
        return self.data.dtype


def data_offset(dataset, chunk: int = 0) -> int:
    """File offset of a rank-file dataset's bytes (contiguous layout) or of one of its chunks (chunked)."""
    if dataset.chunks is None:
        return dataset.id.get_offset()
    return dataset.id.get_chunk_info(chunk).byte_offset

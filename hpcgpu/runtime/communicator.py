"""The communicator every hpcgpu object is built on.

:class:`Communicator` wraps an mpi4py communicator (by default a *clone* of ``COMM_WORLD``, so hpcgpu's
messages never match a user's) and adds what a rank-per-GPU program needs: the node-local rank and size
(from ``Split_type(COMM_TYPE_SHARED)``), the number of nodes, and one API for collectives on host values
(through MPI) and device arrays (through NCCL, or host-staged MPI when NCCL is not available).

Nothing happens at import: MPI is initialised when the first :class:`Communicator` is built.
"""

from __future__ import annotations

import socket
import numpy as np

from hpcgpu.errors import ConfigurationError, HpcgpuError, rank_prefix

_OPS = ("sum", "max", "min")


def _mpi():
    """Import mpi4py.MPI lazily: importing it initialises MPI."""
    from mpi4py import MPI

    return MPI


__all__ = ["Communicator", "is_device_array"]   # is_device_array: hpcgpu.arch's, re-exported


class Communicator:
    """A group of ranks: MPI for control and host data, NCCL for device data.

    Parameters
    ----------
    mpi_comm : mpi4py.MPI.Comm, optional
        The communicator to wrap. Default: a clone of ``MPI.COMM_WORLD``.

    Attributes
    ----------
    mpi : mpi4py.MPI.Comm
        The wrapped communicator.
    rank, size : int
        Rank in ``mpi`` and number of ranks.
    local_rank, local_size : int
        Rank and number of ranks on this node (ranks sharing memory with this one).
    n_nodes, node_index : int
        Number of nodes in the job and the index of this rank's node (0 .. n_nodes-1, by lowest rank).
    hostname : str
    job_transport : hpcgpu.transport.job.JobTransport or None
        The transport this job chose and what is built from it once (halo transports, the NCCL
        communicator, the collectives); None until :mod:`hpcgpu.transport` first needs it
        (:func:`hpcgpu.transport.job.job_transport`). This class moves only small host values itself.
    parent : Communicator or None
        The communicator this one was split from (its transport choice is inherited).
    errors : mpi4py.MPI.Comm
        A duplicate of ``mpi`` used only on the error path (:func:`hpcgpu.runtime.abort.abort_on_error`
        checks with a non-blocking barrier there whether every rank raised the same error), so it can
        never be confused with a collective of the computation.
    """

    def __init__(self, mpi_comm=None):
        MPI = _mpi()
        self.mpi = MPI.COMM_WORLD.Clone() if mpi_comm is None else mpi_comm
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.node = self.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = self.node.Get_rank()
        self.local_size = self.node.Get_size()
        is_leader = 1 if self.local_rank == 0 else 0
        self.n_nodes = self.mpi.allreduce(is_leader, op=MPI.SUM)
        leader_order = self.mpi.exscan(is_leader, op=MPI.SUM) or 0
        self.node_index = self.node.bcast(leader_order if is_leader else None, root=0)
        self.hostname = socket.gethostname()
        self.job_transport = None
        self.parent = None
        self.errors = self.mpi.Dup()

    # ------------------------------------------------------------------ identity
    @property
    def prefix(self) -> str:
        """``[rank r/n]``, the prefix of rank-local messages."""
        return rank_prefix(self.rank, self.size)

    def __repr__(self) -> str:
        return (
            f"Communicator(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, "
            f"local_size={self.local_size}, n_nodes={self.n_nodes}, host={self.hostname!r})"
        )

    def split(self, color: int, key: int | None = None) -> "Communicator":
        """Collective: split into sub-communicators (for example one per row of a process grid)."""
        child = Communicator(self.mpi.Split(color, self.rank if key is None else key))
        child.parent = self
        return child

    def duplicate(self) -> "Communicator":
        """Collective: a communicator on the same ranks whose messages never match this one's (a private
        channel, e.g. for a background thread's agreement). Release it with :meth:`free`."""
        return Communicator(self.mpi.Dup())

    def free(self) -> None:
        """Collective: release the MPI communicators this object made (after its last use)."""
        for mpi_comm in (self.errors, self.node, self.mpi):
            if mpi_comm is not None:
                mpi_comm.Free()
        self.errors = self.node = self.mpi = None

    # ------------------------------------------------------------------ errors
    def check(self, ok: bool, message: str = "", error: type[HpcgpuError] = ConfigurationError) -> None:
        """Collective: raise ``error`` on *every* rank if any rank has ``ok == False``.

        Use it for conditions that may differ between ranks (a file visible on one node only, a GPU
        missing on one host), so that all ranks fail together instead of some entering a collective
        that never completes. Conditions that depend only on replicated input need no communication:
        validate them on every rank and raise directly.
        """
        failures = self.mpi.allgather(None if ok else message)
        failed = [(rank, text) for rank, text in enumerate(failures) if text is not None]
        if failed:
            lines = [f"{rank_prefix(rank, self.size)} {text}" for rank, text in failed]
            exc = error("\n".join(lines))
            exc.replicated = True  # every rank raises this same error
            raise exc

    def abort(self, code: int = 1) -> None:
        """End the whole job now (MPI_Abort)."""
        self.mpi.Abort(code)

    # ------------------------------------------------------------------ collectives
    def barrier(self) -> None:
        """Block until every rank arrives."""
        self.mpi.Barrier()

    def allreduce(self, value, op: str = "sum"):
        """Combine ``value`` over all ranks and return the result on every rank.

        Parameters
        ----------
        value : int, float or numpy.ndarray
            A small host value: Python scalars and NumPy arrays go through MPI. The input is not
            modified. Device arrays move through the job's transport instead:
            ``hpcgpu.transport.collectives(comm, arch).allreduce(array)``.
        op : {"sum", "max", "min"}
        """
        if op not in _OPS:
            raise ConfigurationError(f"allreduce op must be one of {_OPS}, got {op!r}")
        _refuse_device_array(value, "allreduce")
        MPI = _mpi()
        mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
        if isinstance(value, np.ndarray):
            send = np.ascontiguousarray(value)
            result = np.empty_like(send)
            self.mpi.Allreduce(send, result, op=mpi_op)
            return result
        if isinstance(value, (bool, int, float, np.integer, np.floating)):
            result = np.empty(1, dtype=np.asarray(value).dtype)
            self.mpi.Allreduce(np.asarray([value]), result, op=mpi_op)
            return result[0].item()
        raise ConfigurationError(
            f"allreduce expects a number or a NumPy array, got {type(value).__name__}"
        )

    def broadcast(self, value, root: int = 0):
        """Return ``value`` from ``root`` on every rank.

        NumPy arrays must have the same shape and dtype on every rank (they are filled in place and
        returned); any other picklable object is sent whole. Device arrays move through the job's
        transport: ``hpcgpu.transport.collectives(comm, arch).broadcast(array, root)``.
        """
        _refuse_device_array(value, "broadcast")
        if isinstance(value, np.ndarray):
            self.mpi.Bcast(value, root=root)
            return value
        return self.mpi.bcast(value, root=root)


def _refuse_device_array(value, operation: str) -> None:
    if type(value).__module__.startswith("cupy"):   # hpcgpu.arch.is_device_array (arch sits above runtime)
        raise ConfigurationError(
            f"Communicator.{operation} moves host values; for a device array use the job's transport: "
            f"hpcgpu.transport.collectives(comm, arch).{operation}(array)")

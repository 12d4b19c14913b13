"""The job's data mover: collectives and paired point-to-point messages on host or device buffers.

Everything an app moves between ranks goes through one object per communicator and kind of buffer::

    movers = hpcgpu.transport.collectives(comm, arch)     # device buffers on a GPU arch, host on CPU
    movers.allreduce(gradients, out=gradients)            # in place
    movers.exchange(sends=[(left_rows, left)], receives=[(ghosts, left)]).wait()

Which object is the job's transport choice (:func:`hpcgpu.transport.select_transport`):

============== ================================== ======================================================
transport      object                             how
============== ================================== ======================================================
``mpi``        :class:`HostCollectives`           MPI on NumPy arrays (every CPU job; host buffers on
                                                  GPU jobs too, ``collectives(comm, on_device=False)``)
``nccl``       :class:`NcclCollectives`           NCCL on the stream; no host synchronisation;
                                                  capturable in a CUDA graph
``mpi-cuda``   :class:`MpiDeviceCollectives`      the stream is synchronised, MPI gets device pointers
``mpi-staged`` :class:`MpiDeviceCollectives`      device -> pinned host copy, MPI, copy back
============== ================================== ======================================================

Every object offers the same operations (:class:`Collectives` documents them) with the same results:
reductions are MPI's or NCCL's own (the two may round differently; within one transport a result does
not depend on anything but the inputs and the number of ranks), data movement is exact.

The halo exchange of fields has its own planned, graph-capturable path
(:func:`hpcgpu.transport.default_transport`) on the same choice.
"""

from __future__ import annotations

from typing import Protocol

from hpcgpu.transport.device_collectives import MpiDeviceCollectives
from hpcgpu.transport.host_collectives import HostCollectives
from hpcgpu.transport.job import job_transport
from hpcgpu.transport.nccl_collectives import NcclCollectives
from hpcgpu.transport.selection import select_transport_for


class Collectives(Protocol):
    """What every transport's collectives object offers (host arrays on ``mpi``, CuPy arrays otherwise).

    Buffers are C-contiguous arrays; counts are in elements of the array's dtype. ``stream`` (device
    transports only; ignored on the host) is the CUDA stream that wrote the inputs and on which later
    work reads the outputs, default the current stream. ``nccl`` queues on it and returns at once; the
    MPI device transports synchronise it first. ``element_type="bfloat16"`` reduces uint16 bit patterns
    as bfloat16 (NCCL only; MPI has no bfloat16 arithmetic and raises BackendError).

    Attributes
    ----------
    name : str
        The transport: ``"mpi"``, ``"nccl"``, ``"mpi-cuda"`` or ``"mpi-staged"``.
    capturable : bool
        Whether the calls may be captured in a CUDA graph (``nccl`` only).
    on_device : bool
        Whether the buffers are device (CuPy) arrays.
    size, rank : int
        Of the communicator.
    """

    name: str
    capturable: bool
    on_device: bool

    def allreduce(self, send, out=None, op="sum", stream=None, **element_type):
        """Combine ``send`` over the ranks into ``out`` (new if None; ``out is send`` reduces in place).
        ``op``: ``"sum"``, ``"max"`` or ``"min"``. Returns ``out``."""

    def reduce_scatter(self, send, out, op="sum", stream=None, **element_type):
        """Reduce ``send`` (``size * out.size`` elements) over the ranks; rank r receives block r in
        ``out``. Returns ``out``."""

    def allgather(self, send, out, stream=None):
        """Concatenate every rank's ``send`` (equal sizes) into ``out`` (``size * send.size``) in rank order."""

    def allgatherv(self, send, out, counts, stream=None):
        """Like :meth:`allgather` with ``counts[r]`` elements from rank r (``send.size == counts[rank]``)."""

    def broadcast(self, array, root=0, stream=None):
        """Fill ``array`` on every rank with root's (same size everywhere). Returns ``array``."""

    def gatherv(self, send, out, counts, root=0, stream=None):
        """Concatenate every rank's ``send`` (``counts[r]`` elements) into ``out`` on ``root``; returns
        ``out`` on root, None elsewhere (``out`` is ignored there)."""

    def scatterv(self, send, out, counts, root=0, stream=None):
        """Root's ``send`` (``sum(counts)`` elements) cut into blocks of ``counts[r]``; block r lands in
        rank r's ``out``. Returns ``out``."""

    def alltoallv(self, send, send_counts, out, receive_counts, stream=None):
        """Block r of ``send`` (``send_counts[r]`` elements) goes to rank r; block r of ``out``
        (``receive_counts[r]``) comes from rank r. Returns ``out``."""

    def exchange(self, sends=(), receives=(), tag=0, stream=None):
        """Paired point-to-point messages: post every receive and send and return a handle whose
        ``wait()`` completes them. ``sends`` and ``receives`` list :class:`~hpcgpu.transport.messages.Message`
        or ``(array, peer)`` pairs; the k-th message to a peer meets the peer's k-th from this rank
        (:mod:`hpcgpu.transport.messages`). ``tag`` separates concurrent exchanges on MPI."""

    def send_receive(self, sends=(), receives=(), tag=0, stream=None):
        """:meth:`exchange` then ``wait()``."""


def make_collectives(comm, on_device: bool):
    """Build the collectives of ``comm`` for host (``on_device=False``) or device buffers, after the job's
    transport (collective on the first call: may select the transport and create NCCL's communicator)."""
    if not on_device:
        return HostCollectives(comm)
    name = select_transport_for(comm, is_gpu=True)
    if name == "nccl":
        return NcclCollectives(comm)
    return MpiDeviceCollectives(comm, staged=(name == "mpi-staged"))


def collectives(comm, arch=None, on_device: bool | None = None):
    """The job's collectives of ``comm`` for ``arch``'s buffers, built once and kept with the communicator.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or hpcgpu.arch.GPU, optional
        Device buffers on a GPU, host buffers on the CPU.
    on_device : bool, optional
        Instead of ``arch``: whether the buffers are CuPy arrays. ``on_device=False`` gives the MPI
        collectives of host arrays on a GPU job too.

    Returns
    -------
    Collectives
        :class:`HostCollectives`, :class:`NcclCollectives` or :class:`MpiDeviceCollectives`.

    Notes
    -----
    Collective on the first call per communicator and kind of buffer: every rank must get there together.
    """
    if on_device is None:
        if arch is None:
            raise TypeError("collectives() needs arch or on_device")
        on_device = bool(arch.is_gpu)
    built = job_transport(comm).collectives
    key = "device" if on_device else "host"
    if key not in built:
        built[key] = make_collectives(comm, bool(on_device))
    return built[key]


def device_collectives(comm):
    """The collectives of device (CuPy) buffers of ``comm``: ``collectives(comm, on_device=True)``."""
    return collectives(comm, on_device=True)


__all__ = ["Collectives", "HostCollectives", "MpiDeviceCollectives", "NcclCollectives", "collectives",
           "device_collectives", "make_collectives"]

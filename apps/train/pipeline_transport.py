"""Point-to-point transfers between pipeline stages: MPI on CPUs, NCCL (or host-staged MPI) on GPUs.

The :class:`~apps.train.pipeline.PipelineEngine` moves two kinds of messages over the pipeline
communicator (rank = stage): activations forward (stage ``s`` to ``s + 1``, tag ``2 m`` for
micro-batch ``m``) and their gradients backward (``s + 1`` to ``s``, tag ``2 m + 1``). Every sender
here has one entry point, :meth:`exchange`: an optional send and an optional receive, posted
together. The engine pairs a send with the next receive *from the same peer* (Megatron's
``send_forward_recv_backward`` / ``send_backward_recv_forward``), because a NCCL send does not
complete until its peer posts the matching receive: in the 1F1B steady state stage ``s`` sends
activation ``k`` and then waits for gradient ``j`` from ``s + 1``, while ``s + 1`` sends gradient
``j`` and then waits for activation ``k``; posted one after the other on each side, both sends
would wait forever (the device streams block, not the host). Posted in one NCCL group they progress
together.

================================  ======================================================================
:class:`MpiPointToPoint`          NumPy: ``Isend`` (kept alive until :meth:`wait_all`), blocking ``Recv``
:class:`NcclPointToPoint`         CuPy, job transport ``nccl``: one :func:`~hpcgpu.transport.nccl.
                                  grouped_send_receive` group per exchange on the current (compute)
                                  stream; the host never waits
:class:`StagedPointToPoint`       CuPy, job transport ``mpi-cuda`` / ``mpi-staged``: device -> host
                                  copy, MPI as above, copy back (correct everywhere, slow)
================================  ======================================================================

Activations travel in the compute dtype (2 bytes a value in fp16 and bf16). bfloat16 has no MPI
type: :class:`MpiPointToPoint` moves its bit patterns as ``uint16``; on GPUs it already is ``uint16``
(NCCL moves dtypes it cannot reduce as bytes: exact).

:func:`make_point_to_point` picks one after the pipeline communicator's transport (which
:func:`apps.train.parallel_grid.prepare_device_communication` set to the job's on GPUs). Every sender counts the bytes it
was given to send (``bytes_sent``, ``n_sends``): the measured side of
:mod:`apps.train.comm_volume`.
"""

import numpy as np

from hpcgpu.transport.nccl import grouped_send_receive, nccl_communicator
from hpcgpu.transport.selection import select_transport_for

from ._backend import is_bfloat16


class _CountedSender:
    """Counters of what was passed to the sends: ``bytes_sent`` (bytes) and ``n_sends``."""

    def __init__(self):
        self.bytes_sent = 0
        self.n_sends = 0

    def _count(self, array):
        self.bytes_sent += int(array.nbytes)
        self.n_sends += 1

    # the one-message forms, for callers that never pair
    def send(self, array, dest, tag):
        """Start sending ``array`` to ``dest``; returns None."""
        self.exchange(send=(array, dest, tag))

    def recv(self, shape, dtype, source, tag):
        """Receive an array of ``shape`` and ``dtype`` from ``source``."""
        return self.exchange(receive=(shape, dtype, source, tag))


def _message_buffer(buffer):
    """What MPI sends or receives for the contiguous NumPy ``buffer``: itself, or for bfloat16
    (``ml_dtypes``, a dtype MPI does not know) its bit patterns as a ``uint16`` view -- the same
    bytes, copied exactly."""
    return buffer.view(np.uint16) if is_bfloat16(buffer.dtype) else buffer


class MpiPointToPoint(_CountedSender):
    """Activations and gradients between pipeline stages over MPI (NumPy buffers).

    Parameters
    ----------
    comm : hpcgpu.Communicator
        The pipeline sub-communicator (rank = stage).
    """

    def __init__(self, comm):
        super().__init__()
        self.comm = comm
        self._pending = []

    def exchange(self, send=None, receive=None):
        """Start ``send`` = ``(array, dest, tag)`` (non-blocking, the buffer kept until
        :meth:`wait_all`), then receive ``receive`` = ``(shape, dtype, source, tag)`` (blocking).

        Returns
        -------
        numpy.ndarray or None
            The received array (None without ``receive``).
        """
        if send is not None:
            array, dest, tag = send
            buffer = np.ascontiguousarray(array)
            self._count(buffer)
            self._pending.append((self.comm.mpi.Isend(_message_buffer(buffer), dest=dest, tag=tag),
                                  buffer))
        if receive is None:
            return None
        shape, dtype, source, tag = receive
        buffer = np.empty(shape, dtype=dtype)
        self.comm.mpi.Recv(_message_buffer(buffer), source=source, tag=tag)
        return buffer

    def wait_all(self):
        """Complete every send started; returns None."""
        for request, _ in self._pending:
            request.Wait()
        self._pending = []


class NcclPointToPoint(_CountedSender):
    """Activations and gradients between pipeline stages over NCCL (CuPy arrays, same device order).

    Each :meth:`exchange` is one NCCL group (receive and send together) on the CURRENT stream: the
    kernels that wrote the send run before it, the kernels that read the receive after it, and
    the host goes on without waiting. Tags are not sent: NCCL matches the k-th send from ``a`` to
    ``b`` with the k-th receive on ``b`` from ``a``, and the engine posts both directions in
    micro-batch order on every stage (both schedules), which is the same order on both sides.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        The pipeline sub-communicator; its NCCL communicator is created here if it does not exist
        (collective over ``comm``: :func:`apps.train.parallel_grid.prepare_device_communication`
        creates it beforehand on every rank in the same order).
    """

    def __init__(self, comm):
        super().__init__()
        self.comm = comm
        self.nccl_comm = nccl_communicator(comm)
        self._pending = []

    def exchange(self, send=None, receive=None):
        """One NCCL group: receive ``(shape, dtype, source, tag)`` and send ``(array, dest, tag)``.

        Returns
        -------
        cupy.ndarray or None
            The receive buffer (filled in stream order), or None without ``receive``.
        """
        import cupy

        sends, receives, received = [], [], None
        if send is not None:
            array, dest, _ = send
            buffer = cupy.ascontiguousarray(array)
            self._count(buffer)
            # kept until wait_all: the group reads it later, in stream order
            self._pending.append(buffer)
            sends.append((buffer, dest))
        if receive is not None:
            shape, dtype, source, _ = receive
            received = cupy.empty(shape, dtype=dtype)
            receives.append((received, source))
        grouped_send_receive(self.nccl_comm, sends, receives, cupy.cuda.get_current_stream())
        return received

    def wait_all(self):
        """Release the send buffers; returns None.

        Nothing waits on the host: the sends are queued on the compute stream, so everything that
        runs after them on that stream (and CuPy's reuse of their memory, which is stream-ordered)
        comes after them.
        """
        self._pending = []


class StagedPointToPoint(MpiPointToPoint):
    """CuPy arrays through host memory and MPI (the GPU path without NCCL).

    ``cupy.asnumpy`` synchronises the stream that wrote the array before MPI reads the copy.
    """

    def exchange(self, send=None, receive=None):
        import cupy

        if send is not None:
            array, dest, tag = send
            send = (cupy.asnumpy(array), dest, tag)
        received = super().exchange(send, receive)
        return None if received is None else cupy.asarray(received)


def make_point_to_point(comm, arch):
    """The pipeline sender of ``comm`` (the pipeline communicator) for ``arch``.

    CPU: :class:`MpiPointToPoint`. GPU: :class:`NcclPointToPoint` when the communicator's transport
    is ``nccl``, else :class:`StagedPointToPoint`. Collective over ``comm`` when the transport is
    not chosen yet or NCCL's communicator does not exist yet.
    """
    if not arch.is_gpu:
        return MpiPointToPoint(comm)
    if comm.size > 1 and select_transport_for(comm, is_gpu=True) == "nccl":
        return NcclPointToPoint(comm)
    return StagedPointToPoint(comm)

"""Point-to-point transfers between pipeline stages, through the job's transport.

The :class:`~apps.train.parallel.pipeline.PipelineEngine` moves two kinds of messages over the pipeline
communicator (rank = stage): activations forward (stage ``s`` to ``s + 1``) and their gradients
backward (``s + 1`` to ``s``). :class:`PointToPoint` has one entry point, :meth:`PointToPoint.exchange`:
an optional send and an optional receive, posted together as one paired exchange of the pipeline
communicator's collectives (:meth:`hpcgpu.transport.collectives.Collectives.exchange`). The engine pairs a
send with the next receive *from the same peer* (Megatron's ``send_forward_recv_backward`` /
``send_backward_recv_forward``), because a NCCL send does not complete until its peer posts the
matching receive: in the 1F1B steady state stage ``s`` sends activation ``k`` and then waits for
gradient ``j`` from ``s + 1``, while ``s + 1`` sends gradient ``j`` and then waits for activation
``k``; posted one after the other on each side, both sends would wait forever (the device streams
block, not the host). Posted in one exchange (one NCCL group) they progress together.

What an exchange does on each transport of the job (the buffers are the pipeline's activations):

==============  ========================================================================================
``mpi``         NumPy: non-blocking send and receive; a lone send stays in flight (its buffer kept)
                until :meth:`PointToPoint.wait_all`, an exchange with a receive returns once it arrived
``nccl``        CuPy: one NCCL group on the current (compute) stream; the host never waits
``mpi-cuda``,   CuPy: the current stream is synchronised, MPI moves the bytes (device pointers or pinned
``mpi-staged``  host copies) and the exchange completes before it returns (the staging buffers are reused)
==============  ========================================================================================

Messages match in the order each side lists them, per peer and direction (the transport's rule:
:mod:`hpcgpu.transport.messages`), not by tag: the engine posts both directions in micro-batch order on
every stage (both schedules), the same order on both sides. Activations travel in the compute dtype
(2 bytes a value in fp16 and bf16); dtypes the transport cannot reduce (bfloat16) move as their bytes,
exactly.

:class:`ActivationShapes` carries the one message the engine needs besides: the shape of one sample's
activation, from each stage to the next, once per run. Every sender counts the bytes it was given to
send (``bytes_sent``, ``n_sends``): the measured side of :mod:`apps.train.parallel.comm_volume`.
"""

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives

from apps.train.kernels.backend import array_module

#: The MPI tag of the activation and gradient messages (NCCL has none; messages match in order).
MESSAGE_TAG = 0


class PointToPoint:
    """Activations and gradients between pipeline stages through the pipeline communicator's
    collectives (see the module docstring for what each transport does).

    Parameters
    ----------
    comm : hpcgpu.Communicator
        The pipeline sub-communicator (rank = stage).
    arch : hpcgpu.arch.CPU or GPU, optional
        Device (CuPy) buffers on a GPU, host (NumPy) buffers otherwise (the default). With more than
        one stage on a GPU the device collectives are built here: collective over ``comm`` with NCCL
        (:func:`apps.train.parallel.grid.prepare_device_communication` builds them beforehand on
        every rank in the same order).

    Attributes
    ----------
    movers : hpcgpu.transport.Collectives or None
        The collectives the messages go through (None on one stage: nothing to send).
    bytes_sent, n_sends : int
        Bytes and number of the arrays given to the sends.
    """

    def __init__(self, comm, arch=None):
        self.comm = comm
        on_device = bool(getattr(arch, "is_gpu", False))
        self.movers = collectives(comm, on_device=on_device) if comm.size > 1 else None
        self.bytes_sent = 0
        self.n_sends = 0
        self._pending = []   # (handle or None, send buffer) until wait_all

    def _count(self, array):
        self.bytes_sent += int(array.nbytes)
        self.n_sends += 1

    def exchange(self, send=None, receive=None):
        """Post ``send`` = ``(array, dest, tag)`` and ``receive`` = ``(shape, dtype, source, tag)``
        (either may be None) as one paired exchange. The tags name the messages for readers; the
        messages match in order (see the module docstring).

        Returns
        -------
        ndarray or None
            The received array (None without ``receive``): complete on the host (``mpi``), or filled
            in stream order (device transports).
        """
        sends, receives, received, buffer = [], [], None, None
        if send is not None:
            array, dest, _ = send
            buffer = array_module(array).ascontiguousarray(array)
            self._count(buffer)
            sends.append((buffer, dest))
        if receive is not None:
            shape, dtype, source, _ = receive
            received = self._empty(shape, dtype)
            receives.append((received, source))
        handle = self.movers.exchange(sends=sends, receives=receives, tag=MESSAGE_TAG)
        if receive is not None or self.movers.on_device:
            # a receive is read next; on devices nothing is left to wait for (NCCL: queued on the
            # stream) or must not be (MPI device transports reuse their staging buffers)
            handle.wait()
            handle = None
        if buffer is not None:
            # kept until wait_all: a host send in flight reads it, a NCCL group reads it in stream order
            self._pending.append((handle, buffer))
        return received

    def _empty(self, shape, dtype):
        if self.movers.on_device:
            import cupy

            return cupy.empty(shape, dtype=dtype)
        return np.empty(shape, dtype=dtype)

    # the one-message forms, for callers that never pair
    def send(self, array, dest, tag):
        """Start sending ``array`` to ``dest``; returns None."""
        self.exchange(send=(array, dest, tag))

    def recv(self, shape, dtype, source, tag):
        """Receive an array of ``shape`` and ``dtype`` from ``source``."""
        return self.exchange(receive=(shape, dtype, source, tag))

    def wait_all(self):
        """Complete every send still in flight and release the send buffers; returns None.

        On devices nothing waits on the host: NCCL's sends are queued on the compute stream, so
        everything that runs after them on that stream (and CuPy's reuse of their memory, which is
        stream-ordered) comes after them.
        """
        for handle, _ in self._pending:
            if handle is not None:
                handle.wait()
        self._pending = []


class ActivationShapes:
    """The shape of one sample's activation, sent once per run from each stage to the next.

    A small ``int64`` buffer through the host collectives of the pipeline communicator (MPI, the
    control plane, also on GPU jobs): ``[ndim, d1, ..., d_ndim, 0, ...]``, :data:`MAX_DIMS` + 1 values.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        The pipeline communicator.
    """

    #: MPI tag of the shape messages (apart from the activations' :data:`MESSAGE_TAG`).
    TAG = 32000
    #: Most axes of one sample's activation.
    MAX_DIMS = 8

    def __init__(self, comm):
        self.comm = comm

    def send(self, trailing_shape, dest):
        """Send ``trailing_shape`` (a tuple of ints) to stage ``dest``; returns once it is sent."""
        trailing_shape = tuple(int(n) for n in trailing_shape)
        if len(trailing_shape) > self.MAX_DIMS:
            raise ConfigurationError(
                f"pipeline: an activation of one sample has {len(trailing_shape)} axes {trailing_shape}; at "
                f"most {self.MAX_DIMS} can be sent between stages. Flatten it before the stage boundary")
        message = np.zeros(self.MAX_DIMS + 1, dtype=np.int64)
        message[0] = len(trailing_shape)
        message[1:1 + len(trailing_shape)] = trailing_shape
        collectives(self.comm, on_device=False).send_receive(sends=[(message, dest)], tag=self.TAG)

    def receive(self, source):
        """The trailing shape stage ``source`` sent (a tuple of ints)."""
        message = np.zeros(self.MAX_DIMS + 1, dtype=np.int64)
        collectives(self.comm, on_device=False).send_receive(receives=[(message, source)], tag=self.TAG)
        return tuple(int(n) for n in message[1:1 + int(message[0])])


def make_point_to_point(comm, arch):
    """The pipeline sender of ``comm`` (the pipeline communicator) for ``arch``: a :class:`PointToPoint`.
    Collective over ``comm`` when its device collectives are not built yet (NCCL's communicator)."""
    return PointToPoint(comm, arch)

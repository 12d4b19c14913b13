"""What one communicator keeps of its transport: the agreed choice and the objects built from it.

The state lives with the communicator (``comm.job_transport``) but belongs to this package: the
communicator itself (:mod:`hpcgpu.runtime.communicator`) knows nothing of transports, and
:func:`job_transport` creates the state on first use. Pure Python, no MPI or CUDA import.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransportChoice:
    """The transport chosen for one kind of architecture.

    Attributes
    ----------
    name : str
        One of :data:`hpcgpu.transport.TRANSPORTS`.
    source : str
        Where it came from: ``"flag"``, ``"environment"`` or ``"automatic"``.
    """

    name: str
    source: str

    def describe(self) -> str:
        """``"nccl (automatic)"``: for headers and summaries."""
        return f"{self.name} ({self.source})"


@dataclass
class JobTransport:
    """Everything one communicator uses to move data: the chosen transport and what is built from it.

    Every :class:`hpcgpu.Communicator` gets one, as ``comm.job_transport``, from :func:`job_transport` on
    first use. Filled lazily: the choice at the first :func:`~hpcgpu.transport.select_transport`
    (explicit, or from the first halo exchange, message or collective), the objects at their first use.
    A communicator split from another starts with its parent's choices.

    Attributes
    ----------
    requested : str or None
        The explicit request recorded by :func:`~hpcgpu.transport.select_transport` (the ``--transport`` flag).
    choices : dict of str -> TransportChoice
        Per architecture name (``"cpu"``, ``"gpu"``): the agreed transport.
    halo_transports : dict of (str, int or None) -> transport
        Halo transport objects per ``(arch.name, arch.device_id)``
        (:func:`hpcgpu.transport.default_transport`).
    nccl_communicator : cupy.cuda.nccl.NcclCommunicator or None
        The job's NCCL communicator (:func:`hpcgpu.transport.nccl.nccl_communicator`).
    collectives : dict of str -> object
        The collectives objects per kind of buffer, ``"host"`` or ``"device"``
        (:func:`hpcgpu.transport.collectives.collectives`).
    """

    requested: str | None = None
    choices: dict = field(default_factory=dict)
    halo_transports: dict = field(default_factory=dict)
    nccl_communicator: object = None
    collectives: dict = field(default_factory=dict)


def job_transport(comm) -> JobTransport:
    """The :class:`JobTransport` of ``comm``, created on first use.

    A communicator made by :meth:`hpcgpu.Communicator.split` starts with the choices of its parent
    (``comm.parent``), so every group of a job moves data with the transport the job chose.
    """
    state = getattr(comm, "job_transport", None)
    if state is None:
        state = JobTransport()
        parent = getattr(comm, "parent", None)
        if parent is not None:
            inherited = job_transport(parent)
            state.requested = inherited.requested
            state.choices = dict(inherited.choices)
        comm.job_transport = state
    return state

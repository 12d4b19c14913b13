"""The job's transport: chosen once per communicator, read by halos, particles and device collectives.

One name says how device data moves between ranks for the whole job:

============== ===================================================================================
name           used by
============== ===================================================================================
``mpi``        CPU jobs: halos by MPI Isend/Irecv of NumPy buffers (the only transport on CPUs)
``nccl``       GPU jobs: halos and particle ghosts by NCCL send/recv, device collectives by NCCL
``mpi-cuda``   GPU jobs: halos by CUDA-aware MPI; particle ghosts and device collectives host-staged
``mpi-staged`` GPU jobs: halos, particle ghosts and device collectives through pinned host memory
============== ===================================================================================

Precedence: an explicit request (the apps' ``--transport`` flag, passed as ``requested``), else the
``HPCGPU_TRANSPORT`` environment variable, else automatic (``mpi`` on CPUs; on GPUs the first usable of
``nccl``, ``mpi-cuda``, ``mpi-staged``). The choice is made by :func:`select_transport` -- collective the
first time, so every rank agrees or every rank raises the same error -- and kept in the communicator's
:class:`~hpcgpu.transport.job.JobTransport`, which also holds what is built from it once per job: the
halo transport objects, the NCCL communicator and the collectives. Nothing else reads the
environment variable.

This module imports neither CuPy nor MPI at import time.
"""

from __future__ import annotations

import os

from hpcgpu.errors import BackendError, ConfigurationError, HpcgpuError
from hpcgpu.runtime.abort import replicated
from hpcgpu.transport.job import TransportChoice, job_transport
from hpcgpu.transport.mpi_device import mpi_is_cuda_aware
from hpcgpu.transport.nccl import nccl_available

#: Every transport name, in the order of the automatic choice on GPUs after ``mpi``.
TRANSPORTS = ("mpi", "nccl", "mpi-cuda", "mpi-staged")
#: The environment variable that requests a transport for the whole job.
ENVIRONMENT_VARIABLE = "HPCGPU_TRANSPORT"


def requested_transport(requested: str | None = None) -> tuple[str | None, str]:
    """The requested name and where it came from: ``(requested, "flag")`` if given, else the environment
    variable (``"environment"``), else ``(None, "automatic")``. Local; the name is not validated here."""
    if requested:
        return requested, "flag"
    from_environment = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if from_environment:
        return from_environment, "environment"
    return None, "automatic"


def check_transport_name(name: str, is_gpu: bool, source: str = "flag") -> None:
    """Raise unless transport ``name`` exists and moves the arrays of this architecture.

    Raises
    ------
    BackendError
        ``name`` is not one of :data:`TRANSPORTS`, moves GPU arrays on a CPU architecture, or is ``mpi``
        (host arrays) on a GPU one.
    """
    where = {"flag": "--transport", "environment": ENVIRONMENT_VARIABLE}.get(source, "transport")
    if name not in TRANSPORTS:
        raise BackendError(f"unknown transport {name!r} ({where}); expected one of {', '.join(TRANSPORTS)}")
    if not is_gpu and name != "mpi":
        raise BackendError(f"transport {name!r} ({where}) moves GPU arrays, but the architecture is the CPU; "
                           "use 'mpi'")
    if is_gpu and name == "mpi":
        raise BackendError(f"transport 'mpi' ({where}) moves host arrays; on a GPU use 'nccl', 'mpi-cuda' or "
                           "'mpi-staged'")


def automatic_transport(is_gpu: bool) -> str:
    """The automatic choice on this rank: ``mpi`` on CPUs; on GPUs ``nccl`` if CuPy has NCCL, else
    ``mpi-cuda`` if the MPI library is CUDA-aware, else ``mpi-staged``."""
    if not is_gpu:
        return "mpi"
    if nccl_available():
        return "nccl"
    return "mpi-cuda" if mpi_is_cuda_aware() else "mpi-staged"


def _architecture_name(is_gpu: bool) -> str:
    return "gpu" if is_gpu else "cpu"


def select_transport(comm, arch, requested: str | None = None) -> str:
    """Choose the job's transport for ``arch`` once and return its name.

    The entry point for the apps' ``--transport`` flag: call it right after ``hpcgpu.arch.auto`` with
    the flag's value (None when the flag is absent), before any halo exchange, ghost exchange or device
    collective. Without an explicit call, the first of those calls it with ``requested=None``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    arch : hpcgpu.arch.CPU or hpcgpu.arch.GPU
        Only ``arch.is_gpu`` is read: the choice is kept per kind of architecture.
    requested : str, optional
        One of :data:`hpcgpu.transport.TRANSPORTS`. Precedence: ``requested`` (the flag), else ``HPCGPU_TRANSPORT``,
        else automatic (:func:`automatic_transport`).

    Returns
    -------
    str
        The transport name, the same on every rank.

    Raises
    ------
    ConfigurationError
        Ranks that asked for different transports -- raised on every rank alike.
    BackendError
        An unknown name or one that does not fit the architecture (:func:`check_transport_name`), or
        ranks whose automatic choices differ (set ``HPCGPU_TRANSPORT``) -- raised on every rank alike.

    Notes
    -----
    Collective on the first call per communicator and kind of architecture (one ``allgather`` of each
    rank's request and automatic choice, before any data moves); later calls return the stored choice
    without communicating. A later explicit ``requested`` that differs from the stored choice raises
    ConfigurationError (on every rank: the arguments are replicated).
    """
    return select_transport_for(comm, bool(arch.is_gpu), requested)


def select_transport_for(comm, is_gpu: bool, requested: str | None = None) -> str:
    """:func:`select_transport` for a kind of architecture (``is_gpu``) rather than an ``arch`` object:
    the device collectives know only that their arrays are on a GPU."""
    job = job_transport(comm)
    kind = _architecture_name(is_gpu)
    stored = job.choices.get(kind)
    if stored is not None:
        if requested and requested != stored.name:
            raise replicated(ConfigurationError(
                f"transport {requested!r} requested, but this job already uses {stored.name!r} ({stored.source}); "
                "choose the transport once, before any exchange"))
        return stored.name
    name, source = requested_transport(requested)
    automatic = automatic_transport(is_gpu) if name is None else None
    # One allgather: every rank sees every request, so a mismatch is the same error everywhere.
    everyone = comm.mpi.allgather((name, source, automatic))
    names = sorted({entry[0] or "(automatic)" for entry in everyone})
    if len(names) > 1:
        raise replicated(ConfigurationError(
            f"the ranks requested different transports ({', '.join(names)}); expected one transport for the "
            f"whole job. Set --transport or {ENVIRONMENT_VARIABLE} alike on every rank"))
    if name is None:
        automatic_names = sorted({entry[2] for entry in everyone})
        if len(automatic_names) > 1:
            raise replicated(BackendError(
                f"the ranks would choose different transports ({', '.join(automatic_names)}: NCCL or CUDA-aware "
                f"MPI is missing on some hosts); set {ENVIRONMENT_VARIABLE} to one of them for the whole job"))
        name = automatic
    else:
        try:
            check_transport_name(name, is_gpu, source)
        except HpcgpuError as error:
            raise replicated(error)   # the same name on every rank (agreed above): the same error
    if requested:
        job.requested = requested
    job.choices[kind] = TransportChoice(name, source)
    return name


def transport_choice(comm, arch) -> TransportChoice:
    """The stored choice for ``arch`` (name and source) for headers and summaries; never collective.

    Before :func:`select_transport` has run: what it would choose on this rank (unvalidated source
    ``"automatic"`` or ``"environment"``)."""
    stored = job_transport(comm).choices.get(_architecture_name(bool(arch.is_gpu)))
    if stored is not None:
        return stored
    name, source = requested_transport(None)
    return TransportChoice(name if name is not None else automatic_transport(bool(arch.is_gpu)), source)


def transport_name(comm, arch) -> str:
    """The transport of this job for ``arch`` (for headers, summaries and ``hpcgpu info``); never
    collective: :func:`transport_choice`'s name."""
    return transport_choice(comm, arch).name

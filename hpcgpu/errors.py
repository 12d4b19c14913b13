"""One hierarchy of errors for hpcgpu.

Every message says what was expected, what was found and how to fix it. Errors raised because of a
rank-local condition carry a ``[rank r/n]`` prefix (see :func:`rank_prefix`); errors raised from
replicated input (the same on every rank) carry none, because every rank raises the same text.
"""

from __future__ import annotations


class HpcgpuError(Exception):
    """Base class of every error raised on purpose by hpcgpu.

    ``replicated`` is True when the error is known to be raised identically on every rank (input
    validated the same way everywhere, or agreed through :meth:`Communicator.check`); the job can then
    end with a clean exit instead of ``MPI_Abort``.
    """

    replicated = False


class ConfigurationError(HpcgpuError):
    """A user-supplied option, file or combination of options is invalid.

    Raised only from replicated input (every rank sees the same options) or through
    :meth:`Communicator.check`, so it is replicated by construction.
    """

    replicated = True


class DecompositionError(ConfigurationError):
    """A domain decomposition cannot be built for the requested grid and ranks."""


class DirectoryLockedError(ConfigurationError):
    """Another job holds the run's output or checkpoint directory (:mod:`hpcgpu.app.directory_lock`).

    Raised on every rank, before anything is written; exit code 2. The message names the holder
    (program, host, process id, batch job, since when) and the lock file.
    """


class HaloError(HpcgpuError):
    """A halo exchange was asked for something it cannot do (ghost width too large, mixed dtypes)."""


class BackendError(HpcgpuError):
    """The requested backend (GPU, NCCL, MPI flavour) is not usable here."""


class CheckpointError(HpcgpuError):
    """A checkpoint is missing, truncated, corrupt or belongs to another run."""


class OutputError(HpcgpuError):
    """Writing a file the run keeps (output, checkpoint, summary) failed: a full disk, a quota, an I/O error.

    Rank-local (the rank that writes sees it); the job ends with exit code :attr:`exit_code` (74,
    ``EX_IOERR`` of ``sysexits.h``) and one message naming the file. What was written before stays intact.
    """

    exit_code = 74


class CheckpointStorageError(OutputError, CheckpointError):
    """A checkpoint could not be written: no room for it, a full disk or an I/O error (exit code 74).

    The previous checkpoint is intact.
    """


class NumericalError(HpcgpuError):
    """The simulation state became invalid (NaN/Inf) or a time step is unstable."""


def replicated(error: HpcgpuError) -> HpcgpuError:
    """Mark ``error`` as raised identically on every rank (see :attr:`HpcgpuError.replicated`); returns it."""
    error.replicated = True
    return error


def rank_prefix(rank: int, size: int) -> str:
    """Return the ``[rank r/n]`` prefix used in rank-local messages."""
    return f"[rank {rank}/{size}]"

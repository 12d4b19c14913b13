"""An exception on one rank ends the whole job.

Exit codes: 2 for invalid input raised on every rank, 74 for a failed write
(:class:`~hpcgpu.errors.OutputError`: a full disk, an I/O error), 1 for any other error, 75 for a
run stopped by a stop request after its checkpoint (:mod:`hpcgpu.checkpoint.preemption`).

Without this, a rank that raises leaves the others waiting forever in their next collective.
:func:`abort_on_error` prints the error once, prefixed with ``[rank r/n]``, then calls
``MPI_Abort`` so the launcher (mpiexec, srun) tears down every rank within seconds with a non-zero
exit code. An :class:`~hpcgpu.errors.HpcgpuError` (a user mistake with a clear message) is printed
without a traceback; anything else with one.

When every rank raises the same error together (input validated identically on every rank), the
job ends cleanly with exit code 2 instead, so a user sees one message, not one per rank.
"""

from __future__ import annotations

import contextlib
import sys
import traceback

from hpcgpu.errors import HpcgpuError, rank_prefix

#: Exit code of a run stopped by invalid input (an HpcgpuError raised on every rank).
EXIT_USAGE = 2
#: Exit code passed to MPI_Abort after an unexpected error on some rank.
EXIT_ABORT = 1


def _report(rank: int, size: int, exc: BaseException) -> None:
    if isinstance(exc, HpcgpuError):
        text = f"error: {exc}"
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    prefix = rank_prefix(rank, size)
    print("\n".join(f"{prefix} {line}" for line in text.splitlines()), file=sys.stderr, flush=True)


@contextlib.contextmanager
def abort_on_error(comm, all_ranks_error_exit: bool = True):
    """Run the body; on an exception, end the job instead of hanging the other ranks.

    Parameters
    ----------
    comm : hpcgpu.Communicator or mpi4py communicator
    all_ranks_error_exit : bool
        For an HpcgpuError, exit with :data:`EXIT_USAGE` (printing from rank 0 only) when it was raised
        identically on every rank. This costs no communication: replicated-input errors are, by
        construction, raised on every rank, so the error's type tells. Set False to always abort.
    """
    mpi = getattr(comm, "mpi", comm)
    rank, size = mpi.Get_rank(), mpi.Get_size()
    try:
        yield
    except SystemExit:
        raise
    except KeyboardInterrupt:
        mpi.Abort(130)
    except BaseException as exc:  # noqa: BLE001 - we must catch everything to avoid a hang
        if isinstance(exc, HpcgpuError) and getattr(exc, "replicated", False) and all_ranks_error_exit:
            if rank == 0:
                print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USAGE) from None
        _report(rank, size, exc)
        code = getattr(exc, "exit_code", EXIT_ABORT) if isinstance(exc, HpcgpuError) else EXIT_ABORT
        if size == 1:
            raise SystemExit(code) from None
        mpi.Abort(code)


def replicated(exc: HpcgpuError) -> HpcgpuError:
    """Mark ``exc`` as raised identically on every rank (so the job can exit without MPI_Abort)."""
    exc.replicated = True
    return exc

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
import os
import sys
import time
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


#: Environment variables in which launchers give a process its rank in MPI_COMM_WORLD, before MPI_Init:
#: srun, Open MPI, MPICH/Intel MPI (hydra, PMI), Cray PALS, MVAPICH, Flux.
RANK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "PALS_RANKID",
                  "MV2_COMM_WORLD_RANK", "FLUX_TASK_RANK")


def launcher_rank(environ=None) -> int:
    """This process's rank as the launcher announced it (0 when started without one); needs no MPI."""
    environ = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def exit_before_mpi(error: HpcgpuError, code: int = 2) -> None:
    """End a process whose job has not started MPI yet: ``error: MESSAGE`` once per job, then exit ``code``.

    For a mistake found while a user's script is still being read (a stencil that cannot be compiled):
    every process of the job reads the same file and stops here, so the launcher's rank 0 alone
    prints the line, without a traceback. Raises SystemExit.
    """
    if launcher_rank() == 0:
        print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(code)


#: Seconds a rank with an error said to be raised on every rank waits for the others to say so too.
AGREEMENT_SECONDS = 10.0


def all_ranks_raise(comm, timeout: float = AGREEMENT_SECONDS) -> bool:
    """True when every rank of ``comm`` calls this within ``timeout`` seconds (False: some rank does not).

    A non-blocking barrier on ``comm.errors``, the communicator reserved for the error path, so a rank
    still busy in the computation (an error that was not raised everywhere after all: a file missing on
    one node) cannot match it by mistake. Without ``comm.errors`` (a plain mpi4py communicator) the
    error is trusted to be raised everywhere, as before.
    """
    errors = getattr(comm, "errors", None)
    if errors is None or errors.Get_size() == 1:
        return True
    request = errors.Ibarrier()
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


@contextlib.contextmanager
def abort_on_error(comm, all_ranks_error_exit: bool = True):
    """Run the body; on an exception, end the job instead of hanging the other ranks.

    Parameters
    ----------
    comm : hpcgpu.Communicator or mpi4py communicator
    all_ranks_error_exit : bool
        For an HpcgpuError marked ``replicated`` (raised identically on every rank), exit with
        :data:`EXIT_USAGE`, printing from rank 0 only, once :func:`all_ranks_raise` confirms that every
        rank raised it; a rank that waits in vain prints its own message and aborts the job with the
        same code. Set False to always abort.
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
            code = getattr(exc, "exit_code", EXIT_USAGE)
            if all_ranks_raise(comm):
                if rank == 0:
                    print(f"error: {exc}", file=sys.stderr, flush=True)
                raise SystemExit(code) from None
            _report(rank, size, exc)   # raised here only: the other ranks would wait for this one forever
            mpi.Abort(code)
        _report(rank, size, exc)
        code = getattr(exc, "exit_code", EXIT_ABORT) if isinstance(exc, HpcgpuError) else EXIT_ABORT
        if size == 1:
            raise SystemExit(code) from None
        mpi.Abort(code)


def exit_without_teardown(code: int) -> None:
    """End this process with ``code`` after MPI_Finalize, skipping the interpreter's teardown.

    For a job that every rank ends together after an error: after a failed write HDF5 may still hold
    a file whose metadata it cannot flush, and its library shutdown at interpreter exit can then crash
    (a segmentation fault after the clear message). Our files are closed or written with plain system
    calls by then; standard output and error are flushed here.
    """
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
    os._exit(code)


def replicated(exc: HpcgpuError) -> HpcgpuError:
    """Mark ``exc`` as raised identically on every rank (so the job can exit without MPI_Abort)."""
    exc.replicated = True
    return exc

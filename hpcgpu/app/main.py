"""The ``main`` every app shares: parse on every rank, abort the job on an error, honour ``--profile``.

``--help`` (``-h``) is answered before MPI starts: printing the options needs neither mpi4py nor an
MPI library, so ``python -m apps.stencil --help`` works on a login node or a laptop without MPI.
Under a launcher only the process it numbers 0 prints (read from the launcher's environment, see
:func:`launcher_rank`), as it does for every other message.
"""

from __future__ import annotations

import os
import sys

import hpcgpu
from hpcgpu.app.cli import parse_args
from hpcgpu.profiling import handle_profile_flag

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


def asks_for_help(argv) -> bool:
    """True when ``argv`` holds ``-h`` or ``--help`` before a ``--`` (argparse would print the help)."""
    for argument in argv:
        if argument == "--":
            return False
        if argument in ("-h", "--help"):
            return True
    return False


def run_app(name: str, build_parser, run, argv=None) -> int:
    """Parse ``argv`` with ``build_parser(rank)`` and call ``run(options, comm)`` under ``abort_on_error``.

    Returns the process exit code (0); errors end the job as described in :mod:`hpcgpu.runtime.abort`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if asks_for_help(argv):
        # Before hpcgpu.Communicator(): importing mpi4py.MPI fails on a machine without an MPI library.
        build_parser(launcher_rank()).print_help()
        return 0
    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        options = parse_args(build_parser(comm.rank), argv)
        if handle_profile_flag(comm, options, name, argv):
            return 0  # --profile: printed the nsys command
        run(options, comm)
    return 0

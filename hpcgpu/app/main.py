"""The ``main`` every app shares: parse on every rank, abort the job on an error, honour ``--profile``.

``--help`` (``-h``) is answered before MPI starts: printing the options needs neither mpi4py nor an
MPI library, so ``python -m apps.stencil --help`` works on a login node or a laptop without MPI.
Under a launcher only the process it numbers 0 prints (read from the launcher's environment, see
:func:`launcher_rank`), as it does for every other message.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import hpcgpu
from hpcgpu.app.cli import parse_args
from hpcgpu.app.directory_lock import release_run_directories
from hpcgpu.errors import ConfigurationError, OutputError, rank_prefix, replicated
from hpcgpu.runtime.abort import EXIT_USAGE, RANK_VARIABLES, exit_without_teardown, launcher_rank  # noqa: F401
from hpcgpu.runtime.fault_injection import check_request as check_fault_request, maybe_fail
from hpcgpu.observe.profiling import handle_profile_flag


def asks_for_help(argv) -> bool:
    """True when ``argv`` holds ``-h`` or ``--help`` before a ``--`` (argparse would print the help)."""
    for argument in argv:
        if argument == "--":
            return False
        if argument in ("-h", "--help"):
            return True
    return False


#: Set to 1, an app only parses its command line (no MPI, no run): exit 0 when valid, 2 with the message
#: when not. ``hpcgpu jobscript`` checks the app's arguments this way before it writes a script.
PARSE_ONLY_VARIABLE = "HPCGPU_PARSE_ONLY"


def check_arguments(build_parser, argv) -> int:
    """Parse ``argv`` without MPI: 0 when valid, 2 (after one ``error:`` line on stderr) when not."""
    try:
        parse_args(build_parser(0), argv)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def communicator_or_exit():
    """``hpcgpu.Communicator()``, or one line on how to get an MPI library and exit code 2 without one."""
    try:
        importlib.import_module("mpi4py.MPI")   # initialises MPI
    except (ImportError, RuntimeError) as exc:   # no mpi4py, or mpi4py finds no MPI library to load
        if launcher_rank() == 0:
            found = " ".join(str(exc).split())
            print(f"error: no usable MPI library ({found}); install one with pip install 'hpcgpu[mpich]' "
                  f"(MPICH from PyPI), or load your system's MPI and pip install --no-binary mpi4py mpi4py",
                  file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return hpcgpu.Communicator()


def parse_on_every_rank(comm, build_parser, argv):
    """Collective: parse ``argv`` on every rank and agree; the same ConfigurationError everywhere if any rank fails.

    The command line is the same on every rank, but what it names may not be: a ``--config`` file on a
    node-local disk can exist on one node only. Each rank reports its verdict (one allgather), so a
    rank that cannot parse ends the job with its message instead of leaving the others waiting.
    """
    problem, options = None, None
    try:
        options = parse_args(build_parser(comm.rank), argv)
        check_fault_request(comm.size)
        maybe_fail("parse", comm.rank)
    except ConfigurationError as exc:
        problem = str(exc)
    failures = comm.mpi.allgather(problem)
    failed = [(rank, text) for rank, text in enumerate(failures) if text is not None]
    if failed:
        if len(failed) == comm.size and len({text for _, text in failed}) == 1:
            text = failed[0][1]   # the usual case: the same mistake on every rank, said once
        else:
            text = "\n".join(f"{rank_prefix(rank, comm.size)} {text}" for rank, text in failed)
        raise replicated(ConfigurationError(text))
    return options


def show_user_warnings_in_one_line() -> None:
    """Warnings of hpcgpu's own categories (:class:`~hpcgpu.checkpoint.CheckpointWarning`: a
    corrupt checkpoint skipped) print as one line ``warning: MESSAGE``, without Python's file, line and
    source line: they speak to the user. Other warnings print as Python prints them. Returns None."""
    default = warnings.formatwarning
    if getattr(default, "hpcgpu_one_line", False):
        return   # already installed

    def formatwarning(message, category, filename, lineno, line=None):
        if category.__module__.partition(".")[0] == "hpcgpu":
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    formatwarning.hpcgpu_one_line = True
    warnings.formatwarning = formatwarning


def run_app(name: str, build_parser, run, argv=None) -> int:
    """Parse ``argv`` with ``build_parser(rank)`` and call ``run(options, comm)`` under ``abort_on_error``.

    Returns the process exit code (0); errors end the job as described in :mod:`hpcgpu.runtime.abort`.
    The run directories locked by :func:`hpcgpu.app.environment.prepare_output` are released on every
    way out (:func:`hpcgpu.app.directory_lock.release_run_directories`), before ``MPI_Abort`` too.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(PARSE_ONLY_VARIABLE) == "1":
        return check_arguments(build_parser, argv)
    if asks_for_help(argv):
        # Before hpcgpu.Communicator(): importing mpi4py.MPI fails on a machine without an MPI library.
        build_parser(launcher_rank()).print_help()
        return 0
    comm = communicator_or_exit()
    show_user_warnings_in_one_line()
    try:
        with hpcgpu.abort_on_error(comm):
            try:
                options = parse_on_every_rank(comm, build_parser, argv)
                if handle_profile_flag(comm, options, name, argv):
                    return 0  # --profile: printed the nsys command
                maybe_fail("setup", comm.rank)
                run(options, comm)
            finally:
                # On every way out (the end, exit 2/74/75, an error before MPI_Abort): the next job
                # on these directories need not wait for this one's lock to go stale.
                release_run_directories()
    except SystemExit as exc:
        if exc.code in (EXIT_USAGE, OutputError.exit_code):
            exit_without_teardown(exc.code)   # every rank ends here together (see abort_on_error)
        raise
    return 0

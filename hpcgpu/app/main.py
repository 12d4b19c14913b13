"""The ``main`` every app shares: parse on every rank, abort the job on an error, honour ``--profile``."""

from __future__ import annotations

import hpcgpu
from hpcgpu.app.cli import parse_args


def run_app(name: str, build_parser, run, argv=None) -> int:
    """Parse ``argv`` with ``build_parser(rank)`` and call ``run(options, comm)`` under ``abort_on_error``.

    Returns the process exit code (0); errors end the job as described in :mod:`hpcgpu.runtime.abort`.
    """
    from hpcgpu.monitor import handle_profile_flag

    comm = hpcgpu.Communicator()
    with hpcgpu.abort_on_error(comm):
        options = parse_args(build_parser(comm.rank), argv)
        if handle_profile_flag(comm, options, name, argv):
            return 0  # --profile: printed the nsys command
        run(options, comm)
    return 0

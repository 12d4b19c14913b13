"""Command line of the framework: ``hpcgpu {info,check,jobscript}`` (also ``python -m hpcgpu ...``)."""

from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "hpcgpu" if os.path.basename(sys.argv[0]) == "hpcgpu" else "python -m hpcgpu"
    if argv[:1] == ["jobscript"]:
        # Its own parser: app flags after `--` pass through untouched. Needs no MPI.
        from hpcgpu.jobs.jobscript import main as jobscript_main

        return jobscript_main(argv[1:], prog=f"{prog} jobscript")
    from hpcgpu.app.cli import CommandParser   # one-line usage errors, printed by rank 0 only

    parser = CommandParser(
        prog=prog,
        description="hpcgpu: MPI + GPU scientific computing. Run under mpiexec/srun for one row per rank.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser(
        "info",
        help="print the MPI library, ranks, nodes, GPUs, links, CPU affinity and chosen backend",
        description="Print what this job runs on (use as the first line of a job script).",
    )
    info.add_argument("--backend", choices=("auto", "cupy", "numpy"), default="auto", help="backend to probe (default: auto)")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from hpcgpu.observe.info import add_arguments as add_topology_arguments   # needs no MPI (--help works without one)

    add_topology_arguments(info)
    check = commands.add_parser(
        "check",
        help="health check of the job's nodes on every rank: GPUs (NVML), bandwidths, versions, clocks, "
             "free space; exit 0 healthy, 3 warnings, 4 failed",
        description="Check every node of this job before it runs (docs/health.md). Run under srun/mpiexec: "
                    "one table per node, one verdict line.",
    )
    from hpcgpu.health.check import add_arguments as add_check_arguments   # needs no MPI

    add_check_arguments(check)
    commands.add_parser(
        "jobscript", add_help=False,
        help="write a Slurm script for an app (one rank per GPU), or list / copy the shipped templates "
             "(see: jobscript --help)",
    )
    args = parser.parse_args(argv)
    if args.command == "info":
        from hpcgpu.observe.info import main as info_main

        return info_main(args)
    if args.command == "check":
        from hpcgpu.health.check import main as check_main

        return check_main(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())

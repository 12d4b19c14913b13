"""Command line of the framework: ``python -m hpcgpu {info,demo}``."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpcgpu",
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
    args = parser.parse_args(argv)
    if args.command == "info":
        from hpcgpu.info import main as info_main

        return info_main(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m hpcgpu.bench halo ...`` — see each subcommand's ``--help``."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcgpu.bench", description="hpcgpu benchmarks (run under mpiexec/srun)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    from hpcgpu.bench import halo

    halo.add_arguments(commands.add_parser("halo", help=halo.__doc__.splitlines()[0], description=halo.__doc__,
                                           formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.command == "halo":
        return halo.main(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m hpcgpu.bench halo|scaling|model ...`` — see each subcommand's ``--help``.

``halo`` runs under mpiexec/srun itself; ``scaling`` is started once (no launcher) and starts the
app's runs under the launcher; ``model`` predicts scaling without running anything. Arguments
after ``--`` go to the app (``scaling`` only).
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" belongs to the app a scaling study runs, not to this parser.
    app_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m hpcgpu.bench", description="hpcgpu benchmarks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    from hpcgpu.bench import halo, model, scaling

    for name, module in (("halo", halo), ("scaling", scaling), ("model", model)):
        module.add_arguments(commands.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.command == "halo":
        if app_args:
            parser.error("halo takes no arguments after --")
        return halo.main(args)
    if args.command == "scaling":
        args.app_args = app_args
        return scaling.main(args)
    if args.command == "model":
        if app_args:
            parser.error("model takes no arguments after --")
        return model.main(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())

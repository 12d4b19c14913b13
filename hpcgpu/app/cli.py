"""Command line shared by every app: common flags, ``--config FILE.toml``, errors without a hang.

Precedence: built-in defaults < values from ``--config`` < flags given on the command line. A TOML
file holds the same names as the long flags, with ``-`` or ``_`` (``checkpoint_every = 100``).

Parsing happens on every rank with the same argv, so a bad flag raises the same
:class:`~hpcgpu.errors.ConfigurationError` everywhere; only rank 0 prints it (and ``--help``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcgpu.errors import ConfigurationError

EPILOG_COMMON = """\
examples:
  mpiexec -n 4 python -m {prog}                       default problem on 4 ranks (CPU or GPU)
  mpiexec -n 8 python -m {prog} --config run.toml     options from a file, flags override it
  srun python -m {prog} --restart latest              continue from the newest valid checkpoint
"""


class AppArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting and prints help on rank 0 only."""

    def __init__(self, *args, rank: int = 0, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.rank = rank

    def error(self, message):
        raise ConfigurationError(f"{message}\n(run with --help for all options)")

    def print_help(self, file=None):
        if self.rank == 0:
            super().print_help(file)

    def exit(self, status=0, message=None):
        if message and self.rank == 0:
            sys.stderr.write(message)
        raise SystemExit(status)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def common_parser(prog: str, description: str, rank: int = 0, default_steps: int | None = None) -> AppArgumentParser:
    """A parser with the flags every app accepts; the app adds its own to it."""
    parser = AppArgumentParser(prog=f"python -m {prog}", description=description,
                               epilog=EPILOG_COMMON.format(prog=prog), rank=rank)
    run = parser.add_argument_group("run")
    run.add_argument("--config", metavar="FILE.toml", help="read options from a TOML file (flags override it)")
    run.add_argument("--backend", choices=("auto", "cupy", "numpy"), default="auto",
                     help="auto: GPU (CuPy) when every rank has one, else CPU (NumPy + Numba) [auto]")
    run.add_argument("--steps", type=non_negative_int, default=default_steps, metavar="N",
                     help="number of time steps / iterations" + (f" [{default_steps}]" if default_steps else ""))
    run.add_argument("--seed", type=int, default=0, metavar="N", help="random seed [0]")
    run.add_argument("--quiet", action="store_true", help="no header, progress or table (errors still print)")
    run.add_argument("--bind-cpus", action="store_true", help="bind each rank to the CPUs near its GPU (NVML)")
    out = parser.add_argument_group("output")
    out.add_argument("--output", metavar="DIR", default="output", help="directory for results [output]")
    out.add_argument("--summary", metavar="FILE.json", help="write the run summary as JSON")
    ckpt = parser.add_argument_group("checkpoint / restart")
    ckpt.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="N",
                      help="write a checkpoint every N steps (0: only at the end of an interrupted run) [0]")
    ckpt.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                      help="where checkpoints go [OUTPUT/checkpoints]")
    ckpt.add_argument("--restart", metavar="latest|PATH", default=None,
                      help="continue from the newest valid checkpoint (latest) or from PATH")
    ckpt.add_argument("--keep", type=positive_int, default=3, metavar="K", help="keep the last K checkpoints [3]")
    ckpt.add_argument("--async-checkpoint", action="store_true",
                      help="write checkpoints on a background thread while stepping continues")
    ckpt.add_argument("--wall-time-limit", metavar="SECONDS", type=float, default=None,
                      help="checkpoint and stop cleanly before this many seconds have passed "
                           "(default: the Slurm job's limit when there is one)")
    return parser


def _toml_load(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigurationError(f"--config {path}: file not found; expected a TOML file with option = value lines") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"--config {path}: not valid TOML ({exc})") from None


def parse_args(parser: AppArgumentParser, argv=None) -> argparse.Namespace:
    """Parse ``argv`` with values from ``--config`` as defaults.

    Raises
    ------
    ConfigurationError
        On an unknown flag or TOML key, a bad value, or an unreadable config file.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        table = _toml_load(Path(known.config))
        destinations = {action.dest: action for action in parser._actions if action.dest != "help"}
        defaults = {}
        for key, value in table.items():
            dest = key.replace("-", "_")
            if dest not in destinations or dest == "config":
                valid = ", ".join(sorted(d for d in destinations if d != "config"))
                raise ConfigurationError(f"--config {known.config}: unknown option {key!r}; valid options are: {valid}")
            action = destinations[dest]
            if action.type is not None and not isinstance(value, bool):
                try:
                    value = action.type(str(value))
                except (ValueError, argparse.ArgumentTypeError) as exc:
                    raise ConfigurationError(f"--config {known.config}: {key} = {value!r}: {exc}") from None
            if action.choices is not None and value not in action.choices:
                raise ConfigurationError(
                    f"--config {known.config}: {key} = {value!r}; expected one of {', '.join(map(str, action.choices))}"
                )
            defaults[dest] = value
        parser.set_defaults(**defaults)
    return parser.parse_args(argv)

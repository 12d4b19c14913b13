"""Command line shared by every app: common flags, ``--config FILE.toml``, errors without a hang.

Precedence: built-in defaults < values from ``--config`` < flags given on the command line. A TOML
file holds the same names as the long flags, with ``-`` or ``_`` (``checkpoint_every = 100``).

Parsing happens on every rank with the same argv, so a bad flag raises the same
:class:`~hpcgpu.errors.ConfigurationError` everywhere; only rank 0 prints it (and ``--help``).
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from pathlib import Path

import hpcgpu
from hpcgpu.errors import ConfigurationError
from hpcgpu.health.options import add_watchdog_arguments
from hpcgpu.locations import caller_site
from hpcgpu.runtime.abort import launcher_rank
from hpcgpu.transport.selection import TRANSPORTS

EPILOG_COMMON = """\
examples:
  mpiexec -n 4 python -m {prog}                       default problem on 4 ranks (CPU or GPU)
  mpiexec -n 8 python -m {prog} --config run.toml     options from a file, flags override it
  srun python -m {prog} --restart latest              continue from the newest valid checkpoint
"""


class CommandParser(argparse.ArgumentParser):
    """The parser of hpcgpu's own commands (``hpcgpu check``, ``hpcgpu jobscript``): a usage error is one
    line, ``PROG: error: MESSAGE (run PROG --help for all options)``, printed by the launcher's rank 0
    only (under ``srun``/``mpiexec`` every rank parses the same line), and exit code 2."""

    def error(self, message):
        if launcher_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message} (run {self.prog} --help for all options)\n")
            sys.stderr.flush()
        raise SystemExit(2)


class AppArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting and prints help on rank 0 only."""

    def __init__(self, *args, rank: int = 0, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.rank = rank

    def error(self, message):
        raise ConfigurationError(f"{message}{self._suggestion(message)} (run with --help for all options)")

    def _suggestion(self, message: str) -> str:
        """``"; did you mean --alpha?"`` for a misspelled flag in an "unrecognized arguments" message."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        flags = [f for action in self._actions for f in action.option_strings if f.startswith("--")]
        for word in message.split(":", 1)[1].split():
            close = difflib.get_close_matches(word.split("=")[0], flags, n=1)
            if word.startswith("--") and close:
                return f"; did you mean {close[0]}?"
        return ""

    def print_help(self, file=None):
        if self.rank == 0:
            super().print_help(file)

    def _print_message(self, message, file=None):
        if self.rank == 0:   # --version, usage lines: once per job
            super()._print_message(message, file)

    def exit(self, status=0, message=None):
        if message and self.rank == 0:
            sys.stderr.write(message)
        raise SystemExit(status)


def _integer(text) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _integer(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _number(text) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def finite_float(text: str) -> float:
    """A real number (NaN and infinities rejected)."""
    return _number(text)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def float_in(low: float, high: float, low_open: bool = False, high_text: str | None = None):
    """A type for a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``).

    ``high_text``: how messages write ``high`` (``"1/6"``).
    """

    def parse(text: str) -> float:
        value = _number(text)
        if (value <= low if low_open else value < low) or value > high:
            interval = f"{'(' if low_open else '['}{low:g}, {high_text or format(high, 'g')}]"
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text}")
        return value

    parse.__name__ = f"float_in_{low:g}_{high:g}"
    _KIND[parse] = "number"
    return parse


#: What a TOML value must be for an option of this ``type=`` (other types take a string).
_KIND = {int: "integer", positive_int: "integer", non_negative_int: "integer",
         float: "number", finite_float: "number", positive_float: "number", non_negative_float: "number"}


def launch_command(prog: str) -> str:
    """How the app is started: ``python -m apps.stencil`` for a module, ``python gray_scott.py`` for a script."""
    return f"python {prog}" if prog.endswith(".py") or "/" in prog else f"python -m {prog}"


def dims_type(n_axes: int):
    """A type for ``--dims``: ``n_axes`` comma-separated ranks per axis, ``*`` or 0 for "choose"."""

    def parse(text: str) -> tuple:
        parts = [part.strip() for part in str(text).split(",")]
        try:
            values = tuple(0 if part in ("*", "0") else int(part) for part in parts)
        except ValueError:
            values = None
        if values is None or len(values) != n_axes or any(v < 0 for v in values):
            raise argparse.ArgumentTypeError(
                f"expected {n_axes} ranks per axis separated by commas (a number, or * to choose), e.g. "
                f"{','.join(['2'] * n_axes)} or {','.join(['*'] * (n_axes - 1) + ['1'])}; got {text!r}")
        return values

    parse.__name__ = f"dims_{n_axes}d"
    return parse


def common_parser(prog: str, description: str, rank: int = 0, default_steps: int | None = None,
                  version: str | None = None, grid_axes: int | None = None) -> AppArgumentParser:
    """A parser with the flags every app accepts; the app adds its own to it.

    Parameters
    ----------
    prog : str
        The app's module (``"apps.stencil"``: help says ``python -m apps.stencil``) or script file
        (``"gray_scott.py"``: help says ``python gray_scott.py``).
    description : str
    rank : int
        Only rank 0 prints help.
    default_steps : int, optional
    version : str, optional
        The app's own version: adds ``--version`` (``PROG VERSION (hpcgpu X)``).
    grid_axes : int, optional
        Axes of the app's grid: adds ``--dims`` (ranks per axis, e.g. ``2,2``), parsed into a tuple of
        ``grid_axes`` ints (0: chosen by :class:`hpcgpu.Decomposition`), identically on every rank.
    """
    command = launch_command(prog)
    parser = AppArgumentParser(prog=command, description=description,
                               epilog=EPILOG_COMMON.replace("python -m {prog}", command), rank=rank)
    if version is not None:
        parser.add_argument("--version", action="version", version=f"{prog} {version} (hpcgpu {hpcgpu.__version__})")
    run = parser.add_argument_group("run")
    if grid_axes is not None:
        run.add_argument("--dims", type=dims_type(grid_axes), default=None, metavar=",".join(["N"] * grid_axes),
                         help="ranks per axis of the process grid, slowest axis first (* or 0: chosen) [automatic]")
    run.add_argument("--config", metavar="FILE.toml", help="read options from a TOML file (flags override it)")
    run.add_argument("--backend", choices=("auto", "cupy", "numpy"), default="auto",
                     help="auto: GPU (CuPy) when every rank has one, else CPU (NumPy + Numba) [auto]")
    run.add_argument("--steps", type=non_negative_int, default=default_steps, metavar="N",
                     help="number of time steps / iterations" + (f" [{default_steps}]" if default_steps else ""))
    run.add_argument("--seed", type=int, default=0, metavar="N", help="random seed [0]")
    run.add_argument("--quiet", action="store_true", help="no header, progress or table (errors still print)")
    run.add_argument("--bind-cpus", action="store_true", help="bind each rank to the CPUs near its GPU (NVML)")
    run.add_argument("--transport", choices=("auto",) + TRANSPORTS, default="auto",
                     help="how data moves between ranks for the whole job (halos, particles, collectives): mpi "
                          "(CPU), nccl, mpi-cuda or mpi-staged (GPU); auto: $HPCGPU_TRANSPORT if set, else the first "
                          "usable [auto]")
    out = parser.add_argument_group("output")
    out.add_argument("--output", metavar="DIR", default="output", help="directory for results [output]")
    out.add_argument("--summary", metavar="FILE.json", help="write the run summary as JSON")
    out.add_argument("--wait-for-lock", type=positive_float, nargs="?", const=math.inf, default=None,
                     metavar="SECONDS",
                     help="when another job holds --output or the checkpoint directory, wait until it ends "
                          "(at most SECONDS; no limit without a value) instead of refusing (docs/reliability.md)")
    ckpt = parser.add_argument_group("checkpoint / restart")
    ckpt.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="N",
                      help="write a checkpoint every N steps (0: only at the end of an interrupted run) [0]")
    ckpt.add_argument("--checkpoint-dir", metavar="DIR", default=None,
                      help="where checkpoints go [OUTPUT/checkpoints]")
    ckpt.add_argument("--restart", metavar="latest|PATH", default=None,
                      help="continue from the newest valid checkpoint (latest) or from PATH")
    ckpt.add_argument("--share-checkpoint-dir", action="store_true",
                      help="start a new run in a checkpoint directory that holds another run's checkpoints "
                           "(left untouched; without it such a run refuses to start)")
    ckpt.add_argument("--keep", type=positive_int, default=3, metavar="K", help="keep the last K checkpoints [3]")
    ckpt.add_argument("--async-checkpoint", action="store_true",
                      help="write checkpoints on a background thread while stepping continues")
    ckpt.add_argument("--wall-time-limit", metavar="SECONDS", type=positive_float, default=None,
                      help="checkpoint and stop cleanly before this many seconds have passed "
                           "(default: the Slurm job's limit when there is one)")
    add_watchdog_arguments(parser)   # --no-watchdog, --watchdog-step ..., --straggler-every ...
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


def _toml_type_name(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _toml_value(config: str, key: str, value, action: argparse.Action):
    """``value`` of TOML ``key`` checked against ``action`` and converted like the flag's argument.

    A flag without argument (``store_true``) needs a TOML boolean; an integer option an integer (a
    float only without fractional part, never a boolean); a number option an integer or float; a
    string option a string; then ``type=`` and ``choices`` apply as on the command line.
    """
    def wrong(expected: str):
        return ConfigurationError(f"--config {config}: {key} = {_toml_repr(value)}: expected {expected}, "
                                  f"found {_toml_type_name(value)}; fix the value in {config}")

    if action.nargs == 0:   # store_true / store_false / store_const
        if not isinstance(value, bool):
            raise wrong("a TOML boolean (true or false)")
        if isinstance(action.const, bool) and action.const is False:
            return value   # a store_false flag (--no-plot style) keeps the TOML value of its destination
        return action.const if value else action.default
    kind = _KIND.get(action.type, "string" if action.type is None else "any")
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise wrong({"integer": "an integer", "number": "a number"}.get(kind, "a string"))
    if kind == "integer":
        if isinstance(value, float) and not value.is_integer():
            raise wrong("an integer (no fractional part)")
        if isinstance(value, str):
            raise wrong("an integer (without quotes)")
        value = int(value)
    elif kind == "number":
        if isinstance(value, str):
            raise wrong("a number (without quotes)")
    elif kind == "string" and not isinstance(value, str):
        raise wrong("a string (in quotes)")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except (ValueError, TypeError, argparse.ArgumentTypeError, ConfigurationError) as exc:
            raise ConfigurationError(f"--config {config}: {key} = {_toml_repr(value)}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigurationError(
            f"--config {config}: {key} = {_toml_repr(value)}; expected one of {', '.join(map(str, action.choices))}"
        )
    return value


def _toml_repr(value) -> str:
    """``value`` as written in TOML (``true``, ``"text"``, ``1.5``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


class UnknownOptionError(ConfigurationError, AttributeError):
    """``options.NAME`` for a NAME that is no option (an AttributeError too: ``getattr(options, NAME, default)`` works)."""

    def __init__(self, message: str, name: str | None = None):
        ConfigurationError.__init__(self, message)
        self.name = name


class FrozenOptions:
    """Read-only options: the parsed flags with the app's own defaults filled in.

    An app resolves its defaults once (``--nx`` from the model, ``--lr`` from the recipe) into a new
    object instead of writing them into the parsed ``argparse.Namespace``; attribute access reads
    like the namespace (``options.nx``), assignment raises.

    Parameters
    ----------
    options : argparse.Namespace or FrozenOptions
        The parsed options.
    **changes
        Resolved values that replace (or add to) those of ``options``.
    """

    __slots__ = ("_values",)

    def __init__(self, options, **changes):
        values = options.as_dict() if isinstance(options, FrozenOptions) else dict(vars(options))
        values.update(changes)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            pass
        if name.startswith("__"):
            raise AttributeError(name)
        where = caller_site()
        close = difflib.get_close_matches(name, list(self._values), n=1)
        raise UnknownOptionError(f"{where + ': ' if where else ''}there is no option {name!r}"
                                 + (f" (did you mean {close[0]!r}?)" if close else "")
                                 + "; declare it, or use one of: " + ", ".join(sorted(self._values)), name=name)

    def __setattr__(self, name, value):
        raise AttributeError(f"options are read-only (tried to set {name!r}); resolve values into a new "
                             "FrozenOptions(options, name=value)")

    def as_dict(self) -> dict:
        """A copy of the values, keyed by ``argparse`` destination."""
        return dict(self._values)

    def __repr__(self) -> str:
        return f"FrozenOptions({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


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
            defaults[dest] = _toml_value(known.config, key, value, destinations[dest])
        parser.set_defaults(**defaults)
    return parser.parse_args(argv)

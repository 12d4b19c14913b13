"""A model's own options, declared once: :class:`Option`.

A model lists its options as a class attribute; :func:`hpcgpu.run_model` turns each into a command-line
flag (``diffusion_u`` becomes ``--diffusion-u``), a key of ``--config FILE.toml`` and an attribute of
the ``options`` the model is built with, and records in the checkpoints which ones a restart may change::

    class GrayScott(hpcgpu.FieldModel):
        options = (
            hpcgpu.Option("n", int, 256, "cells per side", minimum=1),
            hpcgpu.Option("feed", float, 0.037, "feed rate F", positive=True),
            hpcgpu.Option("output_every", int, 500, "steps between records", minimum=0, restart_may_change=True),
        )

Values are checked when the command line is read, identically on every rank, so a bad value ends the
job with one message (exit code 2) before anything runs.
"""

from __future__ import annotations

import argparse
import math

from hpcgpu.app.cli import _KIND
from hpcgpu.errors import ConfigurationError
from hpcgpu.locations import caller_site

_TYPES = (int, float, str, bool)


class Option:
    """One option of a model: a flag, a ``--config`` key and an attribute of ``options``.

    Parameters
    ----------
    name : str
        A Python identifier (``"diffusion_u"``); the flag is ``--diffusion-u``.
    type : {int, float, str, bool}
        The value's type. A ``bool`` option with default False is a flag (``--name``); with default
        True it is turned off with ``--no-name``.
    default : int, float, str or bool
        The value without the flag (shown in ``--help``).
    help : str
        One line for ``--help``, units included (``"time step [s]"``).
    minimum, maximum : float, optional
        Inclusive bounds of a number.
    positive : bool
        A number > 0.
    choices : sequence, optional
        The allowed values.
    restart_may_change : bool
        True for options that do not change the physics (how often to write output): a restart may
        give another value. Every other option must be the same on ``--restart``, or the restart is
        refused with the option named.
    metavar : str, optional
        How ``--help`` names the value (default ``N`` for integers, ``X`` for numbers).

    Attributes
    ----------
    declared_at : str or None
        ``"model.py:12"``: where the option was declared (named in errors about it).
    """

    def __init__(self, name: str, type, default, help: str, *, minimum=None, maximum=None, positive: bool = False,
                 choices=None, restart_may_change: bool = False, metavar: str | None = None):
        self.declared_at = caller_site()
        where = f"{self.declared_at}: " if self.declared_at else ""
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigurationError(f"{where}Option name {name!r}: expected a Python identifier such as 'n' or "
                                     "'diffusion_u' (the flag is --diffusion-u)")
        if type not in _TYPES:
            raise ConfigurationError(f"{where}Option {name!r}: type must be one of int, float, str, bool; got {type!r}")
        self.name, self.type, self.help = name, type, help
        self.minimum, self.maximum, self.positive = minimum, maximum, positive
        self.choices = tuple(choices) if choices is not None else None
        self.restart_may_change = bool(restart_may_change)
        self.metavar = metavar
        try:
            self.default = bool(default) if type is bool else self.parse(str(default))
        except argparse.ArgumentTypeError as error:
            raise ConfigurationError(f"{where}Option {name!r}: the default {default!r} is not allowed: {error}") from None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--diffusion-u``."""
        return "--" + self.name.replace("_", "-")

    def __repr__(self) -> str:
        return f"Option({self.name!r}, {self.type.__name__}, {self.default!r})"

    def parse(self, text: str):
        """The value of the flag's argument ``text``; raises argparse.ArgumentTypeError when not allowed."""
        if self.type is int:
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        elif self.type is float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
            if not math.isfinite(value):
                raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
        else:
            value = text
        if self.type in (int, float):
            if self.positive and not value > 0:
                raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
            if self.minimum is not None and value < self.minimum:
                raise argparse.ArgumentTypeError(f"expected a number >= {self.minimum:g}, got {text}")
            if self.maximum is not None and value > self.maximum:
                raise argparse.ArgumentTypeError(f"expected a number <= {self.maximum:g}, got {text}")
        if self.choices is not None and value not in self.choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(map(str, self.choices))}, got {text}")
        return value

    def add_to(self, group) -> None:
        """Add the flag to an argparse parser or group; returns None."""
        shown = f" [{self.default}]"
        if self.type is bool:
            if self.default:
                group.add_argument("--no-" + self.name.replace("_", "-"), dest=self.name, action="store_false",
                                   help=f"{self.help} (on unless given)")
            else:
                group.add_argument(self.flag, dest=self.name, action="store_true", help=self.help)
            return
        convert = _converter(self)
        group.add_argument(self.flag, dest=self.name, type=convert, default=self.default,
                           metavar=self.metavar or {int: "N", float: "X", str: "TEXT"}[self.type], help=self.help + shown)


def _converter(option: Option):
    """``option.parse`` as an argparse ``type=`` (named for messages, known to ``--config``'s checks)."""

    def convert(text):
        return option.parse(text)

    convert.__name__ = option.type.__name__
    _KIND[convert] = {int: "integer", float: "number"}.get(option.type, "string")
    return convert


def check_options(options, reserved, model_name: str) -> tuple:
    """``options`` as a tuple of :class:`Option`, checked: no duplicates, no name of a common flag.

    ``reserved``: destinations already taken by the common flags (``steps``, ``output`` ...).
    """
    options = tuple(options)
    seen = {}
    for option in options:
        if not isinstance(option, Option):
            raise ConfigurationError(f"{model_name}.options holds {option!r}; expected hpcgpu.Option(...) entries")
        where = f"{option.declared_at}: " if option.declared_at else ""
        if option.name in reserved:
            raise ConfigurationError(
                f"{where}Option {option.name!r} of {model_name} has the name of a flag every model has "
                f"({option.flag}); rename it (e.g. {option.name}_model) or use the common flag")
        if option.name in seen:
            raise ConfigurationError(f"{where}Option {option.name!r} of {model_name} is declared twice "
                                     f"(also at {seen[option.name]})")
        seen[option.name] = option.declared_at
    return options


def description_of(model_class) -> str:
    """The first paragraph of the model's docstring (its ``--help`` description), or its name."""
    text = (model_class.__doc__ or "").strip()
    return " ".join(text.split("\n\n")[0].split()) if text else model_class.name


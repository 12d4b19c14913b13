"""A model's declared options become its command line: flags, defaults, bounds, --config keys, help."""

from __future__ import annotations

import pytest

import hpcgpu
from hpcgpu.app.cli import parse_args
from hpcgpu.errors import ConfigurationError
from hpcgpu.simulation.program import build_parser_for, model_options


@hpcgpu.stencil
def relax(u, rate):
    return u[0, 0] + rate * (u[-1, 0] + u[1, 0] - 2 * u[0, 0])


class Relax(hpcgpu.FieldModel):
    """Relaxation along y.

    A second paragraph, not in --help's description.
    """

    name, version, default_steps = "relax", "2.1", 40
    fields, stencils = ("u",), (relax,)
    output_every = 5
    options = (hpcgpu.Option("n", int, 16, "cells per side", minimum=2),
               hpcgpu.Option("rate", float, 0.25, "relaxation rate", positive=True, maximum=0.5),
               hpcgpu.Option("scheme", str, "plain", "which scheme", choices=("plain", "fancy")),
               hpcgpu.Option("smooth", bool, False, "smooth the start"),
               hpcgpu.Option("plot", bool, True, "draw a figure", restart_may_change=True))


def parse(argv):
    return parse_args(build_parser_for(Relax)(0), argv)


def test_every_option_is_a_flag_with_its_default_and_the_common_flags_are_there():
    options = parse([])
    assert (options.n, options.rate, options.scheme, options.smooth, options.plot) == (16, 0.25, "plain", False, True)
    assert options.steps == 40 and options.output_every == 5 and options.dims is None and options.quiet is False
    options = parse(["--n", "32", "--rate", "0.5", "--scheme", "fancy", "--smooth", "--no-plot",
                     "--output-every", "0", "--dims", "2,1", "--steps", "3", "--checkpoint-every", "1"])
    assert (options.n, options.rate, options.scheme, options.smooth, options.plot) == (32, 0.5, "fancy", True, False)
    assert options.output_every == 0 and options.dims == (2, 1) and options.checkpoint_every == 1


@pytest.mark.parametrize("argv, message", [
    (["--n", "1"], "--n: expected a number >= 2, got 1"),
    (["--rate", "0"], "--rate: expected a positive number, got 0"),
    (["--rate", "0.6"], "--rate: expected a number <= 0.5, got 0.6"),
    (["--rate", "nan"], "--rate: expected a finite number"),
    (["--n", "4.5"], "--n: expected an integer, got '4.5'"),
    (["--scheme", "odd"], "--scheme: expected one of plain, fancy, got odd"),
    (["--rtae", "0.1"], "did you mean --rate?"),
])
def test_bad_values_are_one_line_naming_the_flag(argv, message):
    with pytest.raises(ConfigurationError) as error:
        parse(argv)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_config_file_keys_are_the_option_names_with_their_types(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('n = 8\nrate = 0.125\nscheme = "fancy"\nsmooth = true\noutput_every = 2\n')
    options = parse(["--config", str(config), "--n", "12"])
    assert (options.n, options.rate, options.scheme, options.smooth, options.output_every) == (12, 0.125, "fancy",
                                                                                               True, 2)
    config.write_text('n = "8"\n')
    with pytest.raises(ConfigurationError, match="expected an integer"):
        parse(["--config", str(config)])


def test_help_shows_the_description_defaults_and_version(capsys):
    parser = build_parser_for(Relax)(0)
    parser.print_help()
    text = capsys.readouterr().out
    assert "Relaxation along y." in text and "second paragraph" not in text
    assert "--rate X" in text and "relaxation rate [0.25]" in text and "--no-plot" in text
    assert "--output-every N" in text and "relax.nc" in text
    assert parser.prog == f"python {__file__.split('/')[-1]}"


def test_restart_may_change_is_declared_per_option():
    names = {option.name for option in model_options(Relax) if option.restart_may_change}
    assert names == {"plot", "output_every"}


@pytest.mark.parametrize("arguments, message", [
    (("2n", int, 1, "x"), "expected a Python identifier"),
    (("n", list, [], "x"), "type must be one of int, float, str, bool"),
    (("n", int, 0, "x"), "the default 0 is not allowed: expected a number >= 1"),
])
def test_a_bad_declaration_names_its_line(arguments, message):
    with pytest.raises(ConfigurationError) as error:
        hpcgpu.Option(*arguments, minimum=1)
    assert message in str(error.value) and "test_model_options.py:" in str(error.value)

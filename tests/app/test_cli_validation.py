"""The shared command line and run services: TOML type checks, float options, output paths, progress.

Issue 24: a TOML ``steps = true`` ran "steps: True", ``quiet = "false"`` turned quiet on, ``--days -1``
ran one step, an unwritable ``--output`` ended in MPI_Abort with a traceback, the first ETA read
"left 15:55:18", and MD's "% wall" added up to 113%.
"""

import io
import sys

import pytest

from apps.stencil.app import build_parser as stencil_parser
from apps.train.app import build_parser as train_parser
from hpcgpu.app.cli import parse_args
from hpcgpu.app.environment import output_path_problems
from hpcgpu.app.progress import Progress, format_rate, steps_text
from hpcgpu.app.timers import format_timers
from hpcgpu.errors import ConfigurationError
from hpcgpu.jobs.launch import run_mpi


def parse_toml(tmp_path, text, parser_fn=stencil_parser, argv=()):
    config = tmp_path / "run.toml"
    config.write_text(text)
    return parse_args(parser_fn(0), ["--config", str(config), *argv])


# -- TOML values are type-checked against their option ----------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("steps = true", "expected an integer, found a boolean"),
    ("steps = 2.5", "expected an integer (no fractional part)"),
    ('steps = "5"', "expected an integer (without quotes)"),
    ('quiet = "false"', "expected a TOML boolean (true or false), found a string"),
    ("quiet = 1", "expected a TOML boolean (true or false), found an integer"),
    ("model = 3", "expected a string (in quotes), found an integer"),
    ('model = "foo"', "expected one of swe, jacobi, heat3d"),
    ("dx = true", "expected a number, found a boolean"),
    ('dx = "5"', "expected a number (without quotes)"),
    ("days = -1", "expected a positive number"),
    ("overlap = 0", "expected a TOML boolean"),
])
def test_a_toml_value_of_the_wrong_type_is_refused(tmp_path, text, expected):
    with pytest.raises(ConfigurationError) as error:
        parse_toml(tmp_path, text)
    message = str(error.value)
    key = text.split(" =")[0]
    assert expected in message, message
    assert "run.toml" in message and f"{key} = " in message   # names the file, the key and the value
    assert "\n" not in message


def test_well_typed_toml_values_are_applied(tmp_path):
    options = parse_toml(tmp_path, 'steps = 7\nquiet = true\nmodel = "jacobi"\ndx = 2500\ncfl = 0.5\n'
                                   "overlap = false\nno_plot = true\n")
    assert options.steps == 7 and options.quiet is True and options.model == "jacobi"
    assert options.dx == 2500.0 and options.cfl == 0.5 and options.overlap is False and options.no_plot is True


def test_quiet_false_in_toml_leaves_quiet_off_and_a_float_integer_is_an_integer(tmp_path):
    options = parse_toml(tmp_path, "quiet = false\nsteps = 12.0\n")
    assert options.quiet is False and options.steps == 12 and isinstance(options.steps, int)


def test_command_line_flags_override_toml(tmp_path):
    options = parse_toml(tmp_path, "steps = 7\n", argv=["--steps", "9"])
    assert options.steps == 9


def test_int_choices_of_another_app_are_checked(tmp_path):
    with pytest.raises(ConfigurationError, match="expected one of 0, 1"):
        parse_toml(tmp_path, "zero = 2\n", parser_fn=train_parser)
    assert parse_toml(tmp_path, "zero = 1\n", parser_fn=train_parser).zero == 1


# -- float options of the stencil --------------------------------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["--days", "-1"], "argument --days: expected a positive number"),
    (["--days", "0"], "argument --days: expected a positive number"),
    (["--days", "nan"], "argument --days: expected a finite number"),
    (["--dt", "0"], "argument --dt: expected a positive number"),
    (["--dt", "inf"], "argument --dt: expected a finite number"),
    (["--cfl", "1.5"], "argument --cfl: expected a number in (0, 1]"),
    (["--cfl", "0"], "argument --cfl: expected a number in (0, 1]"),
    (["--dx", "-5"], "argument --dx: expected a positive number"),
    (["--viscosity", "-1"], "argument --viscosity: expected a number >= 0"),
    (["--hyperviscosity=-1e9"], "argument --hyperviscosity: expected a number >= 0"),
    (["--filter-latitude", "0"], "argument --filter-latitude: expected a number in (0, 90]"),
    (["--filter-latitude", "91"], "argument --filter-latitude: expected a number in (0, 90]"),
    (["--diffusion-number", "0.5"], "argument --diffusion-number: expected a number in (0, 1/6]"),
    (["--steps", "3.5"], "argument --steps: expected an integer"),
])
def test_bad_stencil_numbers_are_refused_with_one_message(argv, expected):
    with pytest.raises(ConfigurationError) as error:
        parse_args(stencil_parser(0), argv)
    assert str(error.value).splitlines()[0].startswith(expected), str(error.value)


def test_good_stencil_numbers_pass():
    options = parse_args(stencil_parser(0), ["--days", "0.5", "--cfl", "1", "--viscosity", "0",
                                             "--hyperviscosity", "0", "--filter-latitude", "90",
                                             "--diffusion-number", str(1 / 6)])
    assert options.days == 0.5 and options.cfl == 1.0 and options.filter_latitude == 90.0


# -- output paths ------------------------------------------------------------------------------------------


def test_output_path_problems_name_the_path_the_fault_and_the_fix(tmp_path):
    regular = tmp_path / "a_file"
    regular.write_text("x")
    problems = output_path_problems({
        "--output": (regular, "dir"),
        "--checkpoint-dir": (regular / "sub", "dir"),
        "--summary": (tmp_path, "file"),
        "--write-data": (regular / "final.data", "file"),
    })
    assert problems == [
        f"--output {regular}: exists and is a regular file, not a directory; pass a writable directory as --output",
        f"--checkpoint-dir {regular / 'sub'}: {regular} is a regular file, not a directory; "
        "pass a writable directory as --checkpoint-dir",
        f"--summary {tmp_path}: is a directory; pass a file name as --summary, e.g. {tmp_path / 'summary.json'}",
        f"--write-data {regular / 'final.data'}: {regular} is a regular file, not a directory; "
        "pass a --write-data FILE in a writable directory",
    ]


def test_writable_output_paths_pass_and_leave_nothing_behind(tmp_path):
    problems = output_path_problems({"--output": (tmp_path / "new" / "deeper", "dir"),
                                     "--summary": (tmp_path / "s.json", "file"), "--other": (None, "file")})
    assert problems == []
    assert list(tmp_path.iterdir()) == []   # no probe file and no directory left


@pytest.mark.parametrize("n_ranks", [1, 2])
@pytest.mark.parametrize("flag", ["--output", "--summary"])
def test_an_unusable_output_path_ends_the_job_with_exit_2_and_one_line(tmp_path, n_ranks, flag):
    regular = tmp_path / "a_file"
    regular.write_text("x")
    target = str(regular) if flag == "--output" else str(regular / "s.json")
    args = [sys.executable, "-m", "apps.stencil", "--model", "jacobi", "--nx", "16", "--ny", "16", "--steps", "2",
            "--output", str(tmp_path / "out"), flag, target]
    result = run_mpi(n_ranks, args, timeout=120)
    assert result.returncode == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output   # one line: no traceback, no header, not once per rank
    assert lines[0].startswith(f"error: {flag} {target}: ") and "regular file" in lines[0]
    assert not (tmp_path / "out").exists()   # checked before anything was written


# -- progress and timers -----------------------------------------------------------------------------------


class _Rank0:
    rank = 0


def test_no_eta_until_steps_after_the_first_are_timed(monkeypatch):
    clock = iter([0.0, 1000.0, 1000.5, 1001.0, 1001.5, 1002.0])   # a first step of 1000 s (compilation)
    monkeypatch.setattr("hpcgpu.app.progress.time.perf_counter", lambda: next(clock))
    stream = io.StringIO()
    progress = Progress(_Rank0(), 100, stream=stream)
    progress._last_print = -1e9
    lines = []
    for done in (1, 2, 3, 4):
        progress._last_fraction = -1.0   # print every update
        progress.update(done)
        lines.append(stream.getvalue().splitlines()[-1])
    assert "left ?" in lines[0] and "warming up" in lines[0]
    assert "left ?" in lines[1] and "left ?" in lines[2]      # 1 and 2 timed steps: not enough yet
    assert "2.00 steps/s" in lines[3] and "left 0:48" in lines[3]   # (100 - 4) / 2 per second, not hours


def test_rates_are_readable_at_every_size():
    """A small run's rate is not '0.000 G...': the prefix follows the value, three significant digits."""
    assert format_rate(1.24e5, "cell-updates/s") == "124 k cell-updates/s"
    assert format_rate(6.99e8, "cell-updates/s") == "699 M cell-updates/s"
    assert format_rate(1.3612e10, "cell-updates/s") == "13.6 G cell-updates/s"
    assert format_rate(999_960.0, "steps/s") == "1.00 M steps/s"   # rounded before the prefix is chosen
    assert format_rate(812.4, "steps/s") == "812 steps/s"
    assert format_rate(0.25, "steps/s") == "0.250 steps/s"


def test_steps_text_says_what_this_job_runs():
    assert steps_text(0, 300) == "300"
    assert steps_text(150, 300) == "150 (continuing from step 150 to step 300)"


def test_format_timers_shares_add_up_to_100_percent():
    summary = {"compute": {"min": 6.0, "mean": 6.0, "max": 6.0, "imbalance": 0.0},
               "host overhead": {"min": 4.0, "mean": 4.0, "max": 4.0, "imbalance": 0.0}}
    table = format_timers(summary, 10.0)
    assert " 60.0%" in table and " 40.0%" in table

"""A mistake in a model file ends the job as a user sees it: exit code 2, one line from one rank naming
the user's file and line and the symbol, and nothing written (no output directory).

Each case is a small heat model with one mistake, run as a user runs it (``mpiexec -n 2 python
model.py ...``)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[2]

MODEL = '''\
import numpy as np

import hpcgpu


@hpcgpu.stencil
def heat(u, alpha):
    return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])


class Heat(hpcgpu.FieldModel):
    """2D heat diffusion."""

    name, version, default_steps = "heat", "1.0", 10
    fields, stencils = ("u",), (heat,)
    options = (hpcgpu.Option("n", int, 16, "cells per side", minimum=1),
               hpcgpu.Option("alpha", float, 0.2, "kappa dt / dx^2", positive=True))

    def __init__(self, comm, arch, options):
        n = options.n
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (n, n), dims=options.dims, periodic=True))
        self.current["u"].set_from_global(lambda y, x: np.sin(2 * np.pi * x / n))

    def step(self, timers):
        self.advance(heat, timers=timers)


if __name__ == "__main__":
    raise SystemExit(Heat.main())
'''

HEAT = "    return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])"

#: name -> (replacements in MODEL, extra command-line arguments, text the line must hold, the line of
#: model.py it must name: a substring of that line)
CASES = {
    "stencil reads a field the model does not pass": (
        [("def heat(u, alpha)", "def heat(u, w, alpha)"), ("4 * u[0, 0])", "4 * u[0, 0]) + w[0, 0]")],
        [], "'w', which the model does not have", "self.advance(heat"),
    "wrong number of outputs": (
        [(HEAT, HEAT + ", u[0, 0]")], [], "returns 2 value(s) but reads 1 state field", "self.advance(heat"),
    "if statement in the stencil": (
        [(HEAT, "    if alpha > 0:\n        alpha = 0\n" + HEAT)], [], "unsupported statement (If)", "if alpha > 0"),
    "unsupported function": (
        [("alpha * (u[-1, 0]", "np.arctan(alpha) * (u[-1, 0]")], [], "a call of 'np.arctan'", "np.arctan"),
    "undeclared name": (
        [("alpha * (u[-1, 0]", "beta * (u[-1, 0]")], [], "`beta` is neither a parameter", "beta *"),
    "index beyond the declared halo": (
        [('fields, stencils = ("u",), (heat,)', 'fields, stencils, halo_width = ("u",), (heat,), 1'),
         ("u[0, 1] - 4", "u[0, 2] - 4")],
        [], "beyond the model's halo", "self.advance(heat"),
    "three indices in a 2D model": (
        [(HEAT, "    return u[0, 0, 0] + alpha * (u[-1, 0, 0] + u[1, 0, 0] - 2 * u[0, 0, 0])")], [],
        "indexes its fields with 3 offset(s), but the grid of Heat has 2 axes", "def heat"),
    "grid too small for the ranks": (
        [("u[0, 1] - 4", "u[2, 1] - 4")], ["--n", "3", "--dims", "2,1"], "blocks of 1 cell(s) along axis 0",
        "super().__init__"),
    "parameter missing": (
        [('hpcgpu.Option("alpha", float, 0.2, "kappa dt / dx^2", positive=True)', "")], [],
        "takes the parameter 'alpha'", "self.advance(heat"),
    "parameter misspelled": (
        [("def heat(u, alpha)", "def heat(u, alpah)"), ("alpha * (u[-1, 0]", "alpah * (u[-1, 0]")], [],
        "did you mean 'alpha'?", "self.advance(heat"),
    "field name misspelled in the model": (
        [('self.current["u"].set_from_global', 'self.current["uu"].set_from_global')], [],
        "Heat has no field 'uu' (did you mean 'u'?)", 'self.current["uu"]'),
    "option misspelled in the model": (
        [("n = options.n", "n = options.nn")], [], "there is no option 'nn' (did you mean 'n'?)", "options.nn"),
    "option named like a common flag": (
        [('hpcgpu.Option("n", int, 16, "cells per side", minimum=1)',
          'hpcgpu.Option("n", int, 16, "cells per side", minimum=1), hpcgpu.Option("steps", int, 5, "steps")')],
        [], "has the name of a flag every model has (--steps)", 'Option("steps"'),
}


def model_line(source: str, fragment: str) -> int:
    """The number of the first line of ``source`` holding ``fragment``."""
    return next(number for number, line in enumerate(source.splitlines(), 1) if fragment in line)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_ends_the_job_with_one_line_naming_the_users_line(case, tmp_path):
    replacements, arguments, expected, fragment = CASES[case]
    source = MODEL
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    (tmp_path / "model.py").write_text(source)
    environment = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = run_mpi(2, [sys.executable, "model.py", "--output", "run", "--steps", "4", *arguments], timeout=120,
                     env=environment, cwd=str(tmp_path))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2, result.output
    assert len(lines) == 1, result.output
    line = lines[0]
    assert line.startswith("error: ") and expected in line, line
    assert re.search(rf"model\.py(:|, line ){model_line(source, fragment)}\b", line), line
    assert not (tmp_path / "run").exists()


def test_a_misspelled_flag_is_one_line_with_the_flag_it_resembles(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    result = run_mpi(2, [sys.executable, "model.py", "--output", "run", "--alpah", "0.1"], timeout=120,
                     env=environment, cwd=str(tmp_path))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.output
    assert "--alpah" in lines[0] and "did you mean --alpha?" in lines[0]
    assert not (tmp_path / "run").exists()

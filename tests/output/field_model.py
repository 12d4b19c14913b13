"""A small model on a Field for the output tests: each step adds a position-dependent increment.

After ``s`` steps cell ``(j, i)`` holds ``j * 1000 + i + s * (1 + (i + 2 j) % 5) / 8`` exactly (all
values are multiples of 1/8 below 2**40), so any rank count gives the same bits and the serial
reference is a formula. The model time is ``60 * step`` in the units ``--time-units`` declares
(``legacy``: a numeric ``time`` and no ``time_units``; ``none``: no time). Runs as an app:
``python -m tests.output.field_model --output DIR ...``.
"""

from __future__ import annotations

import sys

import numpy as np

import hpcgpu
from hpcgpu.app.checksum import fields_checksum
from hpcgpu.app.cli import common_parser, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.simulation.netcdf_output import NetCDFOutput
from hpcgpu.simulation import Model, Periodic, Simulation

GLOBAL_SHAPE = (7, 11)   # odd sizes: uneven splits on 2-4 ranks


def expected(step: int, shape=GLOBAL_SHAPE) -> np.ndarray:
    """The global state after ``step`` steps, shape ``shape``."""
    j, i = np.indices(shape, dtype=np.float64)
    return j * 1000 + i + step * (1 + (i + 2 * j) % 5) / 8


class Ramp(Model):
    name, unit, default_steps = "ramp", "cell-updates/s", 20
    # The tests change the time declaration on restart: NetCDFOutput must refuse that, not the checkpoint.
    restart_independent_options = frozenset({"time_units", "time_calendar"})

    def __init__(self, comm, arch, options):
        self.comm, self.arch, self.step_index = comm, arch, 0
        self.grid = hpcgpu.Decomposition(comm, GLOBAL_SHAPE, periodic=(True, True))
        self.u = hpcgpu.Field(self.grid, arch, halo_width=1, name="u")
        self.u.set_from_global(lambda j, i: j * 1000 + i)
        start = self.grid.local_start
        j, i = np.indices(self.u.interior.shape)
        self.increment = (1 + ((i + start[1]) + 2 * (j + start[0])) % 5) / 8
        self.updates_per_step = int(np.prod(GLOBAL_SHAPE))
        self.dt = 60.0
        self.has_time = options.time_units != "none"
        if options.time_units not in ("none", "legacy"):
            self.time_units = options.time_units
        if options.time_calendar is not None:
            self.time_calendar = options.time_calendar

    @property
    def time(self):
        return self.step_index * self.dt if self.has_time else None

    def step(self, timers):
        with timers.phase("compute"):
            self.u.interior[...] += self.increment
        self.step_index += 1

    def describe(self):
        return f"ramp {GLOBAL_SHAPE}"

    def decomposition(self):
        return {"dims": list(self.grid.dims), "global_shape": list(GLOBAL_SHAPE)}

    def checkpoint_state(self):
        return {"fields": {"u": self.u}, "replicated": {"step": self.step_index}}

    def load_checkpoint(self, control):
        restored = control.restore(fields={"u": self.u})
        if restored is None:
            return None
        self.step_index = restored.step
        return restored.step

    def checksum(self):
        return fields_checksum(self.comm, [self.u])

    def finite_arrays(self):
        return [self.u.interior]


def build_parser(rank=0):
    parser = common_parser("tests.output.field_model", "a ramp on a field, written with NetCDFOutput", rank=rank)
    parser.add_argument("--output-every", type=positive_int, default=3)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--time-units", default="legacy", help="the model's time_units, 'legacy' or 'none'")
    parser.add_argument("--time-calendar", default=None, help="the model's time_calendar")
    return parser


def run(options, comm):
    arch = hpcgpu.arch.auto(comm, options.backend)
    output = prepare_output(comm, arch, options)
    model = Ramp(comm, arch, options)
    writer = NetCDFOutput("ramp.nc", {"u": model.u}, Periodic(options.output_every), units={"u": "m"},
                          long_names={"u": "ramp"}, spacing=(250.0, 100.0), dtype=options.dtype)
    steps = options.steps if options.steps is not None else model.default_steps
    Simulation(comm, arch, model, options, app="tests.output.field_model", output=output,
               final_step=steps, operations=[writer]).run()


if __name__ == "__main__":
    sys.exit(run_app("tests.output.field_model", build_parser, run))

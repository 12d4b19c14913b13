"""Nonlinear heat flow between a hot floor and an insulated lid, three-stage Runge-Kutta with adaptive steps.

    du/dt = c(y, x) (1 + u^2) lap(u) + s(t),     s(t) = S sin(2 pi t / P)

on ny x nx cells (grid units), periodic along x. The floor (y = 0) is held at u = T (Dirichlet), the lid
(y = ny) is insulated (zero gradient). The conductivity c is a fixed pattern (a field the stencils
read and never write); the source s changes with time. Each step is the strong-stability-preserving
Runge-Kutta scheme of order 3 (Shu and Osher 1988)::

    u1 = u + dt L(u, t)
    u2 = 3/4 u + 1/4 (u1 + dt L(u1, t + dt))
    u(n+1) = 1/3 u + 2/3 (u2 + dt L(u2, t + dt/2))

with dt from the stability limit of explicit diffusion at the largest conductivity on the grid,
dt = courant / (4 max c (1 + max u^2)): a global maximum inside the step, the same bits on any
number of ranks.

    python examples/heat_rk3.py --steps 200
    mpiexec -n 4 python examples/heat_rk3.py --ny 64 --nx 96 --steps 2000 --output heat
"""

import numpy as np

import hpcgpu


@hpcgpu.stencil
def euler(u, conductivity, dt, source):
    kappa = conductivity[0, 0] * (1 + u[0, 0] * u[0, 0])
    return u[0, 0] + dt * (kappa * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0]) + source)


@hpcgpu.stencil
def blend(u, v, conductivity, a, dt, source):
    kappa = conductivity[0, 0] * (1 + v[0, 0] * v[0, 0])
    return a * u[0, 0] + (1 - a) * (v[0, 0] + dt * (kappa * (v[-1, 0] + v[1, 0] + v[0, -1] + v[0, 1] - 4 * v[0, 0])
                                                    + source))


def conductivity_pattern(y, x, ny, nx):
    """0.5 .. 1.5: a checkerboard of smooth bumps."""
    return 1.0 + 0.5 * np.sin(2 * np.pi * 3 * x / nx) * np.sin(np.pi * 2 * y / ny)


class HeatRK3(hpcgpu.FieldModel):
    """Nonlinear heat flow, SSP-RK3, hot floor and insulated lid."""

    name, version, default_steps = "heat_rk3", "1.0", 200
    fields, constant_fields, work_fields = ("u",), ("conductivity",), ("u1", "u2")
    stencils = (euler, blend)
    field_attributes = {"u": {"long_name": "temperature", "units": "1"}}
    checkpointed_values = ("elapsed",)
    time, time_units = property(lambda self: self.elapsed), "1"   # the records' time: dimensionless (grid units)
    graph_unsupported = "each step takes a global maximum on the host (adaptive time step)"
    options = (
        hpcgpu.Option("ny", int, 32, "cells along y (floor to lid)", minimum=1),
        hpcgpu.Option("nx", int, 48, "cells along x (periodic)", minimum=1),
        hpcgpu.Option("floor", float, 1.0, "temperature of the floor T"),
        hpcgpu.Option("amplitude", float, 0.05, "source amplitude S"),
        hpcgpu.Option("period", float, 20.0, "source period P", positive=True),
        hpcgpu.Option("courant", float, 0.4, "fraction of the stability limit per step", positive=True, maximum=1),
    )

    def __init__(self, comm, arch, options):
        ny, nx = options.ny, options.nx
        self.boundary_conditions = hpcgpu.BoundaryConditions({(0, "lower"): hpcgpu.Dirichlet(options.floor),
                                                              (0, "upper"): hpcgpu.ZeroGradient()})
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (ny, nx), dims=options.dims, periodic=(False, True)))
        self.current["conductivity"].set_from_global(lambda y, x: conductivity_pattern(y, x, ny, nx))
        self.largest_conductivity = hpcgpu.global_max(self.current["conductivity"])
        self.elapsed = 0.0
        self.amplitude, self.period, self.courant = options.amplitude, options.period, options.courant

    def source(self, t):
        return self.amplitude * np.sin(2 * np.pi * t / self.period)

    def step(self, timers):
        peak = max(hpcgpu.global_max(self.current["u"]), -hpcgpu.global_min(self.current["u"]))
        dt = self.courant / (4 * self.largest_conductivity * (1 + peak * peak))
        t = self.elapsed
        self.stage(euler, into="u1", params={"dt": dt, "source": self.source(t)}, timers=timers)
        self.stage(blend, into="u2", read={"v": "u1"}, params={"a": 0.75, "dt": dt, "source": self.source(t + dt)},
                   timers=timers)
        self.advance(blend, read={"v": "u2"}, params={"a": 1 / 3, "dt": dt, "source": self.source(t + dt / 2)},
                     timers=timers)
        self.elapsed = t + dt


if __name__ == "__main__":
    raise SystemExit(HeatRK3.main())

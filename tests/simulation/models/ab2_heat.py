"""Heat diffusion stepped with the second-order Adams-Bashforth form, insulated walls along y.

    u(n+1) = u + dt (3/2 L(u) - 1/2 L(u(n-1)))      (the first step: forward Euler)

The tendency of the previous step is a state field of its own (checkpointed with u); the weights are
a parameter that changes with the step.
"""

import numpy as np

import hpcgpu


@hpcgpu.stencil
def ab2(u, previous, alpha, dt, a, b):
    tendency = alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])
    return u[0, 0] + dt * (a * tendency - b * previous[0, 0]), tendency


class AB2Heat(hpcgpu.FieldModel):
    """Heat diffusion, Adams-Bashforth 2, insulated walls."""

    name, version, default_steps = "ab2_heat", "1.0", 20
    fields, stencils = ("u", "previous"), (ab2,)
    boundary_conditions = {"u": hpcgpu.BoundaryConditions.on_axis(0, hpcgpu.ZeroGradient())}
    options = (hpcgpu.Option("ny", int, 14, "cells along y", minimum=1),
               hpcgpu.Option("nx", int, 11, "cells along x", minimum=1),
               hpcgpu.Option("alpha", float, 0.2, "kappa / dx^2", positive=True),
               hpcgpu.Option("dt", float, 0.5, "time step", positive=True))

    def __init__(self, comm, arch, options):
        ny, nx = options.ny, options.nx
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (ny, nx), dims=options.dims, periodic=(False, True)))
        self.current["u"].set_from_global(lambda y, x: np.cos(np.pi * y / ny) + 0.5 * np.sin(2 * np.pi * x / nx))

    def step(self, timers):
        first = self.step_index == 0
        self.advance(ab2, {"a": 1.0 if first else 1.5, "b": 0.0 if first else 0.5}, timers)


if __name__ == "__main__":
    raise SystemExit(AB2Heat.main())

"""Gray-Scott reaction-diffusion on a periodic square (Pearson, Science 261, 1993).

Two chemicals: U is fed in at rate F, V consumes it (U + 2V -> 3V) and is removed at rate F + k::

    du/dt = Du lap(u) - u v^2 + F (1 - u)
    dv/dt = Dv lap(v) + u v^2 - (F + k) v

Explicit Euler steps on a grid of n x n cells, 5-point Laplacian; diffusion coefficients in grid units
(D dt / dx^2). The physics is the one function `gray_scott` below; hpcgpu compiles it for CPUs and GPUs,
splits the grid over the ranks, exchanges halos, checkpoints, writes the fields as netCDF and
builds the command line from the options declared in `GrayScott`.

    python examples/gray_scott.py --steps 2000
    mpiexec -n 4 python examples/gray_scott.py --n 512 --steps 10000 --checkpoint-every 2000 --output gs
    mpiexec -n 2 python examples/gray_scott.py --n 512 --steps 20000 --output gs --restart latest
"""

import numpy as np

import hpcgpu


@hpcgpu.stencil
def gray_scott(u, v, feed, kill, diffusion_u, diffusion_v, dt):
    laplacian_u = u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0]
    laplacian_v = v[-1, 0] + v[1, 0] + v[0, -1] + v[0, 1] - 4 * v[0, 0]
    reaction = u[0, 0] * v[0, 0] * v[0, 0]
    return (u[0, 0] + dt * (diffusion_u * laplacian_u - reaction + feed * (1 - u[0, 0])),
            v[0, 0] + dt * (diffusion_v * laplacian_v + reaction - (feed + kill) * v[0, 0]))


def initial_state(y, x, n):
    """u = 1, v = 0, except in a square of n/5 cells in the middle, seeded with a fixed ripple."""
    seeded = (abs(y - n // 2) < n // 10) & (abs(x - n // 2) < n // 10)
    ripple = 0.01 * np.sin(0.7 * x + 1.3 * y) * np.cos(0.9 * x * y / n)
    return np.where(seeded, 0.5 + ripple, 1.0), np.where(seeded, 0.25 - ripple, 0.0)


class GrayScott(hpcgpu.FieldModel):
    """Gray-Scott reaction-diffusion (2D, periodic)."""

    name, version, default_steps = "gray_scott", "1.0", 1000
    fields, stencils = ("u", "v"), (gray_scott,)
    output_every, output_dtype = 500, "float64"
    field_attributes = {"u": {"long_name": "concentration of U"}, "v": {"long_name": "concentration of V"}}
    options = (
        hpcgpu.Option("n", int, 256, "cells per side", minimum=1),
        hpcgpu.Option("feed", float, 0.037, "feed rate F", positive=True),
        hpcgpu.Option("kill", float, 0.06, "kill rate k", positive=True),
        hpcgpu.Option("diffusion_u", float, 0.2, "Du dt/dx^2", positive=True),
        hpcgpu.Option("diffusion_v", float, 0.1, "Dv dt/dx^2", positive=True),
        hpcgpu.Option("dt", float, 1.0, "time step", positive=True),
    )

    def __init__(self, comm, arch, options):
        n = options.n
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (n, n), dims=options.dims, periodic=True))
        self.current["u"].set_from_global(lambda y, x: initial_state(y, x, n)[0])
        self.current["v"].set_from_global(lambda y, x: initial_state(y, x, n)[1])

    def step(self, timers):
        self.advance(gray_scott, timers=timers)   # parameters: the options of the same names


if __name__ == "__main__":
    raise SystemExit(GrayScott.main())

"""Heat diffusion in a periodic box: the 7-point explicit scheme.

    dT/dt = kappa lap(T)        T(n+1) = T + r (sum of the 6 neighbours - 6 T),   r = kappa dt / dx^2 <= 1/6

Starts from a hot Gaussian blob in a cold box; the mean temperature is conserved (the diagnostic
`mean_T` has the same bits on any number of ranks).

    python examples/diffusion_3d.py --n 64 --steps 200
    mpiexec -n 4 python examples/diffusion_3d.py --n 128 --steps 1000 --dims 2,2,1 --checkpoint-every 250
"""

import numpy as np

import hpcgpu


@hpcgpu.stencil
def diffuse(T, r):
    neighbours = T[-1, 0, 0] + T[1, 0, 0] + T[0, -1, 0] + T[0, 1, 0] + T[0, 0, -1] + T[0, 0, 1]
    return T[0, 0, 0] + r * (neighbours - 6 * T[0, 0, 0])


def hot_blob(z, y, x, n):
    """300 K everywhere, plus 100 K in a Gaussian of width n/10 in the middle of the box."""
    distance2 = (z - n / 2) ** 2 + (y - n / 2) ** 2 + (x - n / 2) ** 2
    return 300.0 + 100.0 * np.exp(-distance2 / (2 * (n / 10) ** 2))


class Diffusion(hpcgpu.FieldModel):
    """3D heat diffusion (7-point stencil, periodic)."""

    name, version, default_steps = "diffusion_3d", "1.0", 200
    fields, stencils = ("T",), (diffuse,)
    field_attributes = {"T": {"units": "K", "long_name": "temperature", "standard_name": "air_temperature"}}
    options = (
        hpcgpu.Option("n", int, 64, "cells per side", minimum=1),
        hpcgpu.Option("r", float, 0.1, "kappa dt / dx^2, stable up to 1/6", positive=True, maximum=1 / 6),
    )

    def __init__(self, comm, arch, options):
        n = options.n
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (n, n, n), dims=options.dims, periodic=True))
        self.current["T"].set_from_global(lambda z, y, x: hot_blob(z, y, x, n))

    def step(self, timers):
        self.advance(diffuse, timers=timers)


if __name__ == "__main__":
    raise SystemExit(Diffusion.main())

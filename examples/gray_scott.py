"""Gray-Scott reaction-diffusion on a periodic square (Pearson, Science 261, 1993).

Two chemicals: U is fed in at rate F, V consumes it (U + 2V -> 3V) and is removed at rate F + k::

    du/dt = Du lap(u) - u v^2 + F (1 - u)
    dv/dt = Dv lap(v) + u v^2 - (F + k) v

Explicit Euler steps on a grid of n x n cells, 5-point Laplacian; diffusion coefficients in grid units
(D dt / dx^2). The physics is the one function `gray_scott` below; hpcgpu compiles it for CPUs and GPUs,
splits the grid over the ranks, exchanges halos, checkpoints and writes the fields as netCDF.

    python examples/gray_scott.py --steps 2000
    mpiexec -n 4 python examples/gray_scott.py --n 512 --steps 10000 --checkpoint-every 2000 --output gs
    mpiexec -n 2 python examples/gray_scott.py --n 512 --steps 20000 --output gs --restart latest
"""

import numpy as np

import hpcgpu
from hpcgpu.app.cli import FrozenOptions, common_parser, non_negative_int, positive_float, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app

VERSION = "1.0"


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
    name, version = "gray_scott", VERSION
    stencils = (gray_scott,)                                     # compiled before the clock starts
    restart_independent_options = frozenset({"output_every"})   # how often to write may change on restart

    def __init__(self, comm, arch, options):
        n = options.n
        grid = hpcgpu.Decomposition(comm, (n, n), dims=options.dims, periodic=True)
        super().__init__(comm, arch, grid, names=("u", "v"), halo_width=gray_scott.halo_width)
        self.current["u"].set_from_global(lambda y, x: initial_state(y, x, n)[0])
        self.current["v"].set_from_global(lambda y, x: initial_state(y, x, n)[1])
        self.params = {"feed": options.feed, "kill": options.kill, "diffusion_u": options.diffusion_u,
                       "diffusion_v": options.diffusion_v, "dt": options.dt}

    def step(self, timers):
        self.advance(gray_scott, self.params, timers)   # halo exchange, interior, rim; swap buffers


def build_parser(rank=0):
    parser = common_parser("gray_scott.py", "Gray-Scott reaction-diffusion (2D, periodic)", rank=rank,
                           default_steps=1000, version=VERSION, grid_axes=2)
    model = parser.add_argument_group("model")
    model.add_argument("--n", type=positive_int, default=256, help="cells per side [256]")
    model.add_argument("--feed", type=positive_float, default=0.037, help="feed rate F [0.037]")
    model.add_argument("--kill", type=positive_float, default=0.06, help="kill rate k [0.06]")
    model.add_argument("--diffusion-u", type=positive_float, default=0.2, help="Du dt/dx^2 [0.2]")
    model.add_argument("--diffusion-v", type=positive_float, default=0.1, help="Dv dt/dx^2 [0.1]")
    model.add_argument("--dt", type=positive_float, default=1.0, help="time step [1.0]")
    model.add_argument("--output-every", type=non_negative_int, default=500, metavar="N",
                       help="write u and v to gray_scott.nc every N steps (0: initial and final only) [500]")
    return parser


def run(options, comm):
    config = FrozenOptions(options)
    arch = hpcgpu.setup_architecture(comm, config)       # --backend, --transport
    model = GrayScott(comm, arch, config)
    output = prepare_output(comm, arch, config)
    fields = hpcgpu.NetCDFOutput(
        "gray_scott.nc", model.state, trigger=hpcgpu.Periodic(config.output_every) | hpcgpu.AtEnd(),
        long_names={"u": "concentration of U", "v": "concentration of V"}, dtype="float64",
        title="Gray-Scott reaction-diffusion")
    return hpcgpu.Simulation(comm, arch, model, config, app="gray_scott", output=output, final_step=config.steps,
                             operations=[fields], nan_check=hpcgpu.Periodic(100), graph=None).run()


def main(argv=None):
    return run_app("gray_scott", build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

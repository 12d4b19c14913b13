"""Heat diffusion in a periodic box: the 7-point explicit scheme.

    dT/dt = kappa lap(T)        T(n+1) = T + r (sum of the 6 neighbours - 6 T),   r = kappa dt / dx^2 <= 1/6

Starts from a hot Gaussian blob in a cold box; the mean temperature is conserved (the diagnostic
`mean_T` has the same bits on any number of ranks).

    python examples/diffusion_3d.py --n 64 --steps 200
    mpiexec -n 4 python examples/diffusion_3d.py --n 128 --steps 1000 --dims 2,2,1 --checkpoint-every 250
"""

import numpy as np

import hpcgpu
from hpcgpu.app.cli import FrozenOptions, common_parser, float_in, non_negative_int, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app

VERSION = "1.0"


@hpcgpu.stencil
def diffuse(T, r):
    neighbours = T[-1, 0, 0] + T[1, 0, 0] + T[0, -1, 0] + T[0, 1, 0] + T[0, 0, -1] + T[0, 0, 1]
    return T[0, 0, 0] + r * (neighbours - 6 * T[0, 0, 0])


def hot_blob(z, y, x, n):
    """300 K everywhere, plus 100 K in a Gaussian of width n/10 in the middle of the box."""
    distance2 = (z - n / 2) ** 2 + (y - n / 2) ** 2 + (x - n / 2) ** 2
    return 300.0 + 100.0 * np.exp(-distance2 / (2 * (n / 10) ** 2))


class Diffusion(hpcgpu.FieldModel):
    name, version = "diffusion_3d", VERSION
    stencils = (diffuse,)
    restart_independent_options = frozenset({"output_every"})

    def __init__(self, comm, arch, options):
        n = options.n
        grid = hpcgpu.Decomposition(comm, (n, n, n), dims=options.dims, periodic=True)
        super().__init__(comm, arch, grid, names=("T",), halo_width=diffuse.halo_width,
                         attributes={"T": {"units": "K"}})
        self.current["T"].set_from_global(lambda z, y, x: hot_blob(z, y, x, n))
        self.r = options.r

    def step(self, timers):
        self.advance(diffuse, {"r": self.r}, timers)


def build_parser(rank=0):
    parser = common_parser("diffusion_3d.py", "3D heat diffusion (7-point stencil, periodic)", rank=rank,
                           default_steps=200, version=VERSION, grid_axes=3)
    model = parser.add_argument_group("model")
    model.add_argument("--n", type=positive_int, default=64, help="cells per side [64]")
    model.add_argument("--r", type=float_in(0, 1 / 6, low_open=True, high_text="1/6"), default=0.1,
                       help="kappa dt / dx^2, stable up to 1/6 [0.1]")
    model.add_argument("--output-every", type=non_negative_int, default=100, metavar="N",
                       help="write T to diffusion_3d.nc every N steps (0: initial and final only) [100]")
    return parser


def run(options, comm):
    config = FrozenOptions(options)
    arch = hpcgpu.setup_architecture(comm, config)
    model = Diffusion(comm, arch, config)
    output = prepare_output(comm, arch, config)
    temperature = hpcgpu.NetCDFOutput(
        "diffusion_3d.nc", model.state, trigger=hpcgpu.Periodic(config.output_every) | hpcgpu.AtEnd(),
        units={"T": "K"}, long_names={"T": "temperature"}, standard_names={"T": "air_temperature"},
        title="3D heat diffusion")
    return hpcgpu.Simulation(comm, arch, model, config, app="diffusion_3d", output=output, final_step=config.steps,
                             operations=[temperature], nan_check=hpcgpu.Periodic(100), graph=None).run()


def main(argv=None):
    return run_app("diffusion_3d", build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

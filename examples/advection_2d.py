"""A tracer carried by a uniform wind over a doubly periodic plane: first-order upwind advection.

    dq/dt + u dq/dx + v dq/dy = 0

With Courant numbers cx = u dt/dx and cy = v dt/dy (|cx| + |cy| <= 1 for stability), the upwind
scheme takes each difference from the side the wind comes from::

    q(n+1) = q - max(cx, 0) (q - q[x-1]) - min(cx, 0) (q[x+1] - q) - (the same along y)

The tracer starts as a square of 1 in a field of 0; its total is conserved.

    python examples/advection_2d.py --n 128 --steps 400
    mpiexec -n 3 python examples/advection_2d.py --courant-x -0.3 --courant-y 0.4 --steps 1000
"""

import hpcgpu
from hpcgpu.app.cli import FrozenOptions, common_parser, float_in, non_negative_int, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.errors import ConfigurationError

VERSION = "1.0"


@hpcgpu.stencil
def upwind(q, cx, cy):
    along_x = max(cx, 0) * (q[0, 0] - q[0, -1]) + min(cx, 0) * (q[0, 1] - q[0, 0])
    along_y = max(cy, 0) * (q[0, 0] - q[-1, 0]) + min(cy, 0) * (q[1, 0] - q[0, 0])
    return q[0, 0] - along_x - along_y


class Advection(hpcgpu.FieldModel):
    name, version = "advection_2d", VERSION
    stencils = (upwind,)
    restart_independent_options = frozenset({"output_every"})

    def __init__(self, comm, arch, options):
        n = options.n
        grid = hpcgpu.Decomposition(comm, (n, n), dims=options.dims, periodic=True)
        super().__init__(comm, arch, grid, names=("q",), halo_width=upwind.halo_width)
        self.current["q"].set_from_global(lambda y, x: 1.0 * ((abs(y - n // 4) < n // 8) & (abs(x - n // 4) < n // 8)))
        self.courant = {"cx": options.courant_x, "cy": options.courant_y}

    def step(self, timers):
        self.advance(upwind, self.courant, timers)


def build_parser(rank=0):
    parser = common_parser("advection_2d.py", "2D upwind advection of a tracer (periodic)", rank=rank,
                           default_steps=400, version=VERSION, grid_axes=2)
    model = parser.add_argument_group("model")
    model.add_argument("--n", type=positive_int, default=128, help="cells per side [128]")
    model.add_argument("--courant-x", type=float_in(-1, 1), default=0.5, help="u dt / dx [0.5]")
    model.add_argument("--courant-y", type=float_in(-1, 1), default=0.25, help="v dt / dy [0.25]")
    model.add_argument("--output-every", type=non_negative_int, default=100, metavar="N",
                       help="write q to advection_2d.nc every N steps (0: initial and final only) [100]")
    return parser


def run(options, comm):
    config = FrozenOptions(options)
    if abs(config.courant_x) + abs(config.courant_y) > 1:
        raise ConfigurationError(f"|--courant-x| + |--courant-y| must be <= 1 for a stable upwind scheme; got "
                                 f"{abs(config.courant_x) + abs(config.courant_y):g}. Reduce one of them.")
    arch = hpcgpu.setup_architecture(comm, config)
    model = Advection(comm, arch, config)
    output = prepare_output(comm, arch, config)
    tracer = hpcgpu.NetCDFOutput("advection_2d.nc", model.state,
                                 trigger=hpcgpu.Periodic(config.output_every) | hpcgpu.AtEnd(),
                                 long_names={"q": "tracer mixing ratio"}, title="2D upwind advection")
    return hpcgpu.Simulation(comm, arch, model, config, app="advection_2d", output=output, final_step=config.steps,
                             operations=[tracer], nan_check=hpcgpu.Periodic(100), graph=None).run()


def main(argv=None):
    return run_app("advection_2d", build_parser, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())

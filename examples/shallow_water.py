"""Shallow water on a beta-plane channel: the scheme of ``python -m apps.stencil --model swe`` on the kernel layer.

C-grid (h at centres, u on west faces, v on south faces, q at south-west corners), periodic in x, free-slip walls
in y, f = f0 + beta (y - Ly/2), Sadourny's energy-conserving vorticity flux, SSP-RK3 steps of::

    dh/dt = -(delta_x U + delta_y V)                           U = h_u u,  V = h_v v
    du/dt = +avg_y(q avg_x V) - delta_x B - nu4 lap lap u      q = (f + dv/dx - du/dy) / h_q
    dv/dt = -avg_x(q avg_y U) - delta_y B - nu4 lap lap v      B = g h + (avg_x u^2 + avg_y v^2) / 2

The app's jet rolls up into eddies in two days. Same expressions in the same order: the state equals the app's bit
for bit (same --nx, --ny, --dx, --steps).      mpiexec -n 4 python examples/shallow_water.py --output sw
"""

import math

import numpy as np

import hpcgpu
from hpcgpu.app.cli import FrozenOptions, common_parser, non_negative_int, positive_float, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.halo import free_slip_channel_walls

GRAVITY, DEPTH, F0, BETA, NU4, CFL = 9.81, 100.0, 2.0e-4, 2.0e-11, 1.0e9, 0.7   # m/s^2, m, 1/s, 1/(m s), m^4/s
SSP_RK3 = ((0.0, 1.0), (0.75, 0.25), (1.0 / 3.0, 2.0 / 3.0))   # stage = a * state + b * (stage + dt L(stage))


@hpcgpu.stencil
def stage(h, u, v, h0, u0, v0, f, f_north, v_open, a, b, dt, gravity, rdx, rdy, rdx2, rdy2, nu4):
    # Mass fluxes U = h_u u on west/east faces (this row, the one south), V = h_v v on south/north faces.
    U_w = (0.5 * (h[0, -1] + h[0, 0])) * u[0, 0]
    U_e = (0.5 * (h[0, 0] + h[0, 1])) * u[0, 1]
    U_sw = (0.5 * (h[-1, -1] + h[-1, 0])) * u[-1, 0]
    U_se = (0.5 * (h[-1, 0] + h[-1, 1])) * u[-1, 1]
    V_s = (0.5 * (h[-1, 0] + h[0, 0])) * v[0, 0]
    V_n = (0.5 * (h[0, 0] + h[1, 0])) * v[1, 0]
    V_sw = (0.5 * (h[-1, -1] + h[0, -1])) * v[0, -1]
    V_nw = (0.5 * (h[0, -1] + h[1, -1])) * v[1, -1]
    dh = -((U_e - U_w) * rdx + (V_n - V_s) * rdy)
    # Potential vorticity at this cell's south-west corner, the one north of it and the one east of it.
    q = (f[0, 0] + ((v[0, 0] - v[0, -1]) * rdx - (u[0, 0] - u[-1, 0]) * rdy)) / (
        0.25 * ((h[-1, -1] + h[-1, 0]) + (h[0, -1] + h[0, 0])))
    q_n = (f_north[0, 0] + ((v[1, 0] - v[1, -1]) * rdx - (u[1, 0] - u[0, 0]) * rdy)) / (
        0.25 * ((h[0, -1] + h[0, 0]) + (h[1, -1] + h[1, 0])))
    q_e = (f[0, 0] + ((v[0, 1] - v[0, 0]) * rdx - (u[0, 1] - u[-1, 1]) * rdy)) / (
        0.25 * ((h[-1, 0] + h[-1, 1]) + (h[0, 0] + h[0, 1])))
    # Bernoulli function g h + kinetic energy at this centre, the one west and the one south.
    B = gravity * h[0, 0] + 0.25 * ((u[0, 0] ** 2 + u[0, 1] ** 2) + (v[0, 0] ** 2 + v[1, 0] ** 2))
    B_w = gravity * h[0, -1] + 0.25 * ((u[0, -1] ** 2 + u[0, 0] ** 2) + (v[0, -1] ** 2 + v[1, -1] ** 2))
    B_s = gravity * h[-1, 0] + 0.25 * ((u[-1, 0] ** 2 + u[-1, 1] ** 2) + (v[-1, 0] ** 2 + v[0, 0] ** 2))
    du = 0.5 * (q * (0.5 * (V_sw + V_s)) + q_n * (0.5 * (V_nw + V_n))) - (B - B_w) * rdx
    dv = -(0.5 * (q * (0.5 * (U_sw + U_w)) + q_e * (0.5 * (U_se + U_e)))) - (B - B_s) * rdy
    # Hyperviscosity: the 5-point Laplacian at the cell and its four neighbours, then of those.
    lu = ((u[0, -1] + u[0, 1]) - 2 * u[0, 0]) * rdx2 + ((u[-1, 0] + u[1, 0]) - 2 * u[0, 0]) * rdy2
    lu_w = ((u[0, -2] + u[0, 0]) - 2 * u[0, -1]) * rdx2 + ((u[-1, -1] + u[1, -1]) - 2 * u[0, -1]) * rdy2
    lu_e = ((u[0, 0] + u[0, 2]) - 2 * u[0, 1]) * rdx2 + ((u[-1, 1] + u[1, 1]) - 2 * u[0, 1]) * rdy2
    lu_s = ((u[-1, -1] + u[-1, 1]) - 2 * u[-1, 0]) * rdx2 + ((u[-2, 0] + u[0, 0]) - 2 * u[-1, 0]) * rdy2
    lu_n = ((u[1, -1] + u[1, 1]) - 2 * u[1, 0]) * rdx2 + ((u[0, 0] + u[2, 0]) - 2 * u[1, 0]) * rdy2
    lv = ((v[0, -1] + v[0, 1]) - 2 * v[0, 0]) * rdx2 + ((v[-1, 0] + v[1, 0]) - 2 * v[0, 0]) * rdy2
    lv_w = ((v[0, -2] + v[0, 0]) - 2 * v[0, -1]) * rdx2 + ((v[-1, -1] + v[1, -1]) - 2 * v[0, -1]) * rdy2
    lv_e = ((v[0, 0] + v[0, 2]) - 2 * v[0, 1]) * rdx2 + ((v[-1, 1] + v[1, 1]) - 2 * v[0, 1]) * rdy2
    lv_s = ((v[-1, -1] + v[-1, 1]) - 2 * v[-1, 0]) * rdx2 + ((v[-2, 0] + v[0, 0]) - 2 * v[-1, 0]) * rdy2
    lv_n = ((v[1, -1] + v[1, 1]) - 2 * v[1, 0]) * rdx2 + ((v[0, 0] + v[2, 0]) - 2 * v[1, 0]) * rdy2
    du = du - nu4 * (((lu_w + lu_e) - 2 * lu) * rdx2 + ((lu_s + lu_n) - 2 * lu) * rdy2)
    dv = (dv - nu4 * (((lv_w + lv_e) - 2 * lv) * rdx2 + ((lv_s + lv_n) - 2 * lv) * rdy2)) * v_open[0, 0]
    return (a * h0[0, 0] + b * (h[0, 0] + dt * dh), a * u0[0, 0] + b * (u[0, 0] + dt * du),
            a * v0[0, 0] + b * (v[0, 0] + dt * dv))


def jet(point, row, column, nx, ny, dx, speed=10.0, width=50.0e3, kick=0.05):
    """h (m), u or v (m/s) of the perturbed Bickley jet in geostrophic balance at global C-grid indices."""
    x = (column + (0.0 if point == "u" else 0.5)) * dx
    y = (row + (0.0 if point == "v" else 0.5)) * dx
    s = (y - 0.5 * (ny * dx)) / width
    if point == "h":
        log_cosh = (np.abs(s) + np.log1p(np.exp(-2.0 * np.abs(s)))) - math.log(2.0)
        return DEPTH - (speed * width / GRAVITY) * (F0 * np.tanh(s) + BETA * width * (s * np.tanh(s) - log_cosh))
    sech2 = 1.0 / np.cosh(s) ** 2
    cos_sum, sin_sum = 0.0, 0.0
    for m in (3, 4, 5, 6, 7):   # nondivergent streamfunction kick * width * sech^2(s) * sum_m cos(k x + phase_m) / k
        k = 2.0 * math.pi * m / (nx * dx)
        phase = k * x + 2.0 * math.pi * ((m * 0.6180339887498949) % 1.0)
        cos_sum, sin_sum = cos_sum + np.cos(phase) / k, sin_sum - np.sin(phase)
    if point == "u":
        return speed * sech2 + kick * (2.0 / width) * sech2 * np.tanh(s) * cos_sum
    return np.where((y > 0) & (y < ny * dx), kick * sech2 * sin_sum, 0.0)


class ShallowWater(hpcgpu.FieldModel):
    name, version = "shallow_water", "1.0"
    restart_independent_options = frozenset({"output_every"})

    def __init__(self, comm, arch, options):
        nx, ny, dx = options.nx, options.ny, options.dx
        grid = hpcgpu.Decomposition(comm, (ny, nx), dims=options.dims, periodic=(False, True))
        super().__init__(comm, arch, grid, names=("h", "u", "v"), halo_width=stage.halo_width)
        for name in "huv":
            self.current[name].set_from_global(lambda row, column: jet(name, row, column, nx, ny, dx))
        self.stages = [{n: hpcgpu.Field(grid, arch, halo_width=2, name=n) for n in "huv"} for _ in range(2)]
        # Read at the cell only, never exchanged: f at its south-west and north-west corners, 0 on the wall v faces.
        self.coefficients = {n: hpcgpu.Field(grid, arch, halo_width=2, name=n) for n in ("f", "f_north", "v_open")}
        self.coefficients["f"].set_from_global(lambda row, column: F0 + BETA * (row * dx - 0.5 * (ny * dx)))
        self.coefficients["f_north"].set_from_global(lambda row, column: F0 + BETA * ((row + 1) * dx - 0.5 * (ny * dx)))
        self.coefficients["v_open"].set_from_global(lambda row, column: ((row > 0) & (row < ny)) * 1.0)
        self.walls = free_slip_channel_walls()   # h, u mirrored; v odd about the wall face, 0 on it
        h, u, v = (arch.to_host(self.current[name].interior) for name in "huv")   # SSP-RK3's stability limit:
        waves = np.abs(u) / dx + np.abs(v) / dx + 2.0 * math.sqrt(1.0 / dx**2 + 1.0 / dx**2) * np.sqrt(GRAVITY * h)
        k2 = 4.0 / dx**2 + 4.0 / dx**2
        self.dt = CFL * (1.0 / (comm.allreduce(float(np.max(waves)), "max") / math.sqrt(3.0) + NU4 * k2 * k2 / 2.51))
        self.params = {"dt": self.dt, "gravity": GRAVITY, "rdx": 1.0 / dx, "rdy": 1.0 / dx, "rdx2": 1.0 / (dx * dx),
                       "rdy2": 1.0 / (dx * dx), "nu4": NU4}

    time = property(lambda self: self.step_index * self.dt)   # s

    def step(self, timers):
        state = self.current
        base = {"h0": state["h"], "u0": state["u"], "v0": state["v"], **self.coefficients}
        for (a, b), old, new in zip(SSP_RK3, [state, *self.stages], [*self.stages, self.spare]):
            stage.update([new[name] for name in "huv"], {**old, **base}, {**self.params, "a": a, "b": b},
                         timers=timers, boundary_conditions=self.walls)
        self.swap()
        self.step_index += 1


def build_parser(rank=0):
    parser = common_parser("shallow_water.py", "Shallow water on a beta-plane channel (C-grid, SSP-RK3)", rank=rank,
                           default_steps=1000, version="1.0", grid_axes=2)
    parser.add_argument("--nx", type=positive_int, default=360, help="cells along x (periodic) [360]")
    parser.add_argument("--ny", type=positive_int, default=180, help="cells along y, wall to wall [180]")
    parser.add_argument("--dx", type=positive_float, default=5000.0, help="grid spacing in m (dx = dy) [5000]")
    parser.add_argument("--output-every", type=non_negative_int, default=0, metavar="N",
                       help="write h, u, v to shallow_water.nc every N steps (0: initial and final only) [0]")
    return parser


def run(options, comm):
    config = FrozenOptions(options)
    arch = hpcgpu.setup_architecture(comm, config)       # --backend, --transport
    model = ShallowWater(comm, arch, config)
    output = prepare_output(comm, arch, config)
    fields = hpcgpu.NetCDFOutput(
        "shallow_water.nc", model.state, trigger=hpcgpu.Periodic(config.output_every) | hpcgpu.AtEnd(),
        units={"h": "m", "u": "m s-1", "v": "m s-1"}, dtype="float64", title="Shallow water on a beta-plane channel")
    return hpcgpu.Simulation(comm, arch, model, config, app="shallow_water", output=output, final_step=config.steps,
                             operations=[fields], nan_check=hpcgpu.Periodic(100), graph=None).run()


if __name__ == "__main__":
    raise SystemExit(run_app("shallow_water", build_parser, run))

"""``apps.stencil``: a climate stencil on many GPUs (shallow water, Jacobi, 3D heat).

This module is the app's configuration: the command line, the defaults each model fills in
(:func:`resolve_options`) and the choice of model. The run loop is :class:`hpcgpu.simulation.Simulation`'s
(its ``run`` docstring gives the order); each step is the model's (rim, halo exchange overlapped with the
interior), its output the model's ``after_step`` and ``finish`` (snapshots, plots).
"""

from __future__ import annotations

import math

from hpcgpu.app.checkpointing import fingerprinted_options
from hpcgpu.app.cli import (FrozenOptions, common_parser, finite_float, float_in, non_negative_float,
                            non_negative_int, positive_float, positive_int)
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.app.memory import MemoryEstimate, refuse_if_too_large
from hpcgpu.errors import ConfigurationError
from hpcgpu.observe.monitor import add_monitor_arguments
from hpcgpu.simulation import Periodic, Simulation, nccl_channel_limit, setup_architecture

MODELS = ("swe", "jacobi", "heat3d")

DESCRIPTION = """\
A climate stencil on many GPUs (one MPI rank per GPU, or NumPy + Numba on CPUs).

models:
  swe      nonlinear shallow water on a beta-plane channel (C-grid, periodic in x, walls in y);
           --init jet (a balanced jet that rolls up into eddies), geostrophic (exact steady state)
           or gaussian (a bump radiating gravity waves) [default model];
           --grid latlon: the same equations on the sphere (lat-lon C-grid, polar filter),
           --init williamson2 | williamson5 | williamson6 (Williamson et al. 1992 test cases)
  jacobi   2D Laplace 5-point Jacobi, the NVIDIA multi-GPU benchmark problem (fp32 by default)
  heat3d   3D 7-point diffusion of one Fourier mode, checked against its exact discrete solution
"""


def build_parser(rank: int = 0):
    parser = common_parser("apps.stencil", DESCRIPTION, rank=rank)
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, default="swe", help="which model to run [swe]")
    model.add_argument("--nx", type=positive_int, help="cells along x [swe 360, jacobi 4096, heat3d 128]")
    model.add_argument("--ny", type=positive_int, help="cells along y [swe 180, jacobi 4096, heat3d 128]")
    model.add_argument("--nz", type=positive_int, help="cells along z (heat3d) [128]")
    model.add_argument("--dims", default=None, help="ranks per axis, slowest first, e.g. '2,2' or '*,1' [automatic]")
    model.add_argument("--precision", choices=("fp32", "fp64"), default=None, help="[jacobi fp32, others fp64]")
    model.add_argument("--norm-every", type=non_negative_int, default=100, metavar="N",
                       help="jacobi: compute the residual norm every N iterations (0: never) [100]")
    model.add_argument("--diffusion-number", type=float_in(0.0, 1 / 6, low_open=True, high_text="1/6"), default=0.1,
                       metavar="R", help="heat3d: kappa dt / dx^2, in (0, 1/6] [0.1]")
    model.add_argument("--modes", type=lambda s: tuple(int(v) for v in s.split(",")), default=(1, 2, 3),
                       help="heat3d: wavenumbers kz,ky,kx of the initial mode [1,2,3]")
    swe = parser.add_argument_group("shallow water (--model swe)")
    swe.add_argument("--grid", choices=("channel", "latlon"), default="channel",
                     help="channel: beta-plane channel; latlon: the sphere (Williamson test cases) [channel]")
    swe.add_argument("--init", choices=("jet", "geostrophic", "gaussian", "williamson2", "williamson5", "williamson6"),
                     default=None, help="initial condition [channel: jet; latlon: williamson2]")
    swe.add_argument("--alpha", type=finite_float, default=0.0,
                     help="latlon williamson2: angle of the flow to the equator in radians [0]")
    swe.add_argument("--filter-latitude", type=float_in(0.0, 90.0, low_open=True), default=60.0, metavar="DEGREES",
                     help="latlon: polar Fourier filter poleward of this latitude, in (0, 90] (90: no filter); "
                          "sets the time step [60]")
    swe.add_argument("--days", type=positive_float, default=None,
                     help="simulated days, > 0 (sets --steps from the time step) [6]")
    swe.add_argument("--dt", type=positive_float, default=None, help="time step in seconds [from the CFL condition]")
    swe.add_argument("--cfl", type=float_in(0.0, 1.0, low_open=True), default=0.7,
                     help="fraction of the stability limit used as time step, in (0, 1] [0.7]")
    swe.add_argument("--dx", type=positive_float, default=5000.0, help="grid spacing in metres (dx = dy) [5000]")
    swe.add_argument("--viscosity", type=non_negative_float, default=None, help="Laplacian viscosity in m^2/s [0]")
    swe.add_argument("--hyperviscosity", type=non_negative_float, default=None,
                     help="biharmonic viscosity in m^4/s; 0 switches it off (the geostrophic convergence test "
                          "does) [1e9: damps the 2 dx noise of the eddies within hours, leaves the jet alone]")
    swe.add_argument("--snapshot-every", type=non_negative_int, default=None, metavar="N",
                     help="write a netCDF snapshot (swe.nc, or latlon.nc on --grid latlon) every N steps "
                          "(0: none) [about 50 per run]")
    swe.add_argument("--snapshot-precision", choices=("float32", "float64"), default="float32",
                     help="precision the snapshot fields are stored in (the model computes in --precision); "
                          "float32 halves the file [float32]")
    swe.add_argument("--no-plot", action="store_true", help="do not write PNG plots")
    perf = parser.add_argument_group("performance")
    perf.add_argument("--nccl-channels", type=non_negative_int, default=1, metavar="N",
                      help="GPU: NCCL channels (thread blocks) for halo exchange; few channels keep NCCL's spinning "
                           "kernel from slowing the overlapped interior update; 0 = NCCL's default. Ignored when "
                           "NCCL_MAX_NCHANNELS is set [1]")
    perf.add_argument("--graph", dest="graph", action="store_const", const=True, default=None,
                      help="GPU: replay the steps as CUDA graphs, and refuse a model that cannot be captured "
                           "[default: graphs wherever the model can be captured, eager otherwise]")
    perf.add_argument("--no-graph", dest="graph", action="store_const", const=False,
                      help="GPU: launch every kernel of every step eagerly (same results)")
    perf.add_argument("--no-overlap", dest="overlap", action="store_false",
                      help="exchange halos after the whole update instead of overlapping it with the interior "
                           "(same results; shows what the overlap hides)")
    perf.add_argument("--peer-halo", action="store_true",
                      help="jacobi on GPUs of one node: after each sweep store the boundary rows straight into the "
                           "neighbours' ghost rows (CUDA IPC over NVLink) instead of exchanging them with NCCL; "
                           "splits the grid into bands of rows (same results)")
    perf.add_argument("--nan-check-every", type=non_negative_int, default=100, metavar="N",
                      help="stop with an error if the state holds NaN/Inf, checked every N steps (0: never) [100]")
    add_monitor_arguments(parser)  # --monitor, --monitor-interval, --profile
    return parser


def parse_dims(text):
    """``--dims`` as a tuple (0: choose), None for automatic; a tuple is returned as it is."""
    if text is None or isinstance(text, tuple):
        return text
    try:
        return tuple(0 if part.strip() in ("*", "0") else int(part) for part in text.split(","))
    except ValueError:
        raise ConfigurationError(f"--dims {text!r}: expected ranks per axis like '2,2' or '*,1'") from None


def model_class(options):
    """The model class the options ask for (its module is imported here, only when chosen)."""
    if options.model == "jacobi":
        from apps.stencil.jacobi.model import JacobiModel

        return JacobiModel
    if options.model == "heat3d":
        from apps.stencil.heat3d.model import Heat3DModel

        return Heat3DModel
    if options.grid == "latlon":
        from apps.stencil.sphere.model import LatLonModel

        return LatLonModel
    from apps.stencil.channel.model import SweModel

    return SweModel


def resolve_options(options) -> FrozenOptions:
    """The options with each model's defaults filled in (``--nx``, ``--init``, ``--precision``, ``--dims``).

    ``options`` itself is left as parsed. Raises ConfigurationError (the same on every rank) for
    combinations that do not exist.
    """
    if options.peer_halo and options.model != "jacobi":
        raise ConfigurationError(f"--peer-halo applies to --model jacobi only, not {options.model}")
    changes = {"dims": parse_dims(options.dims)}
    init = options.init
    if options.model == "swe" and init is None:
        init = changes["init"] = "williamson2" if options.grid == "latlon" else "jet"
    channel_cases, sphere_cases = ("jet", "geostrophic", "gaussian"), ("williamson2", "williamson5", "williamson6")
    if options.model == "swe" and init not in (sphere_cases if options.grid == "latlon" else channel_cases):
        raise ConfigurationError(f"--init {init} does not exist on --grid {options.grid}; choose one of "
                                 f"{', '.join(sphere_cases if options.grid == 'latlon' else channel_cases)}")
    for axis, value in model_class(options).default_shape.items():
        if getattr(options, axis) is None:
            changes[axis] = value
    if options.precision is None:
        changes["precision"] = "fp32" if options.model == "jacobi" else "fp64"
    return FrozenOptions(options, **changes)


def memory_estimate(config, n_ranks: int, on_gpu: bool) -> MemoryEstimate:
    """A lower bound of the bytes the largest rank's model state takes (host, or GPU memory on a GPU).

    The model's ``arrays_per_cell`` full-size arrays of its precision over at least ``cells / n_ranks``
    cells (halos and the decomposition's remainder only add to it).
    """
    model = model_class(config)
    cells = math.prod(getattr(config, axis) for axis in model.default_shape)
    per_rank = -(-cells // n_ranks)
    itemsize = 4 if config.precision == "fp32" else 8
    shape = " x ".join(str(getattr(config, axis)) for axis in model.default_shape)
    return MemoryEstimate(model.arrays_per_cell * itemsize * per_rank, "gpu" if on_gpu else "host",
                          f"{model.name} on {shape} cells: {per_rank:.3g} cells per rank x {model.arrays_per_cell} "
                          f"arrays x {itemsize} bytes")


def make_model(comm, arch, options):
    """Collective: the model of ``options`` (parsed or already resolved), with its initial state."""
    config = options if isinstance(options, FrozenOptions) else resolve_options(options)
    return model_class(config)(comm, arch, config)


def run(options, comm) -> dict:
    """Run the configured model; returns the summary record (on every rank)."""
    config = resolve_options(options)
    with nccl_channel_limit(config.nccl_channels):   # read by NCCL when the first exchange creates its communicator
        arch = setup_architecture(comm, config)   # arch.auto, then the job's transport (--transport)
        refuse_if_too_large(comm, "apps.stencil", memory_estimate(config, comm.size, arch.is_gpu),
                            "use a smaller grid (--nx, --ny, --nz), more ranks or nodes, or --precision fp32")
        model = make_model(comm, arch, config)
        output = prepare_output(comm, arch, config)   # checks every output path (environment.json follows in Simulation.run)
        simulation = Simulation(
            comm, arch, model, config, app="apps.stencil", output=output, final_step=config.steps,
            nan_check=Periodic(config.nan_check_every), graph=config.graph, plot=not config.no_plot,
            fingerprint=fingerprinted_options(config.as_dict()))
        return simulation.run()


def main(argv=None) -> int:
    return run_app("apps.stencil", build_parser, run, argv)

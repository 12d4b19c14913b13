"""``apps.stencil``: a climate stencil on many GPUs (shallow water, Jacobi, 3D heat).

The run loop, in order, on every rank::

    parse options (same on every rank) -> choose backend -> decompose -> initialise the model
    restart from a checkpoint (--restart latest|PATH), any rank count
    repeat: step (rim, halo exchange overlapped with the interior) -> NaN check -> progress
            -> checkpoint every --checkpoint-every steps -> on SIGTERM/SIGUSR1 or near the wall-time
               limit: final checkpoint, exit 75 (requeue)
    diagnostics -> checksum of the global state -> table and JSON summary (rank 0)
"""

from __future__ import annotations

import os
import time


import hpcgpu
from hpcgpu.app.checkpointing import RunControl
from hpcgpu.app.checksum import fields_checksum
from hpcgpu.app.cli import (common_parser, finite_float, float_in, non_negative_float, non_negative_int,
                            positive_float, positive_int)
from hpcgpu.app.environment import files_written, prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.app.plausibility import check_throughput
from hpcgpu.app.progress import Progress, steps_text
from hpcgpu.app.summary import make_summary, write_json
from hpcgpu.app.timers import PhaseTimers, format_timers
from hpcgpu.errors import ConfigurationError, NumericalError
from hpcgpu.transport import auto_transport_name
from hpcgpu.monitor import GpuMonitor, add_monitor_arguments

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
    swe.add_argument("--no-plot", action="store_true", help="do not write PNG plots")
    perf = parser.add_argument_group("performance")
    perf.add_argument("--nccl-channels", type=non_negative_int, default=1, metavar="N",
                      help="GPU: NCCL channels (thread blocks) for halo exchange; few channels keep NCCL's spinning "
                           "kernel from slowing the overlapped interior update; 0 = NCCL's default. Ignored when "
                           "NCCL_MAX_NCHANNELS is set [1]")
    perf.add_argument("--graph", action="store_true", help="GPU: replay steps as CUDA graphs (pays for small grids)")
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
    if text is None:
        return None
    try:
        return tuple(0 if part.strip() in ("*", "0") else int(part) for part in text.split(","))
    except ValueError:
        raise ConfigurationError(f"--dims {text!r}: expected ranks per axis like '2,2' or '*,1'") from None


def make_model(comm, arch, options):
    if options.model == "jacobi":
        from apps.stencil.jacobi.model import JacobiModel as Model
    elif options.model == "heat3d":
        from apps.stencil.heat3d.model import Heat3DModel as Model
    elif options.grid == "latlon":
        from apps.stencil.sphere.model import LatLonModel as Model
    else:
        from apps.stencil.swe.model import SweModel as Model
    if options.peer_halo and options.model != "jacobi":
        raise ConfigurationError(f"--peer-halo applies to --model jacobi only, not {options.model}")
    if options.model == "swe" and options.init is None:
        options.init = "williamson2" if options.grid == "latlon" else "jet"
    channel_cases, sphere_cases = ("jet", "geostrophic", "gaussian"), ("williamson2", "williamson5", "williamson6")
    if options.model == "swe" and options.init not in (sphere_cases if options.grid == "latlon" else channel_cases):
        raise ConfigurationError(f"--init {options.init} does not exist on --grid {options.grid}; choose one of "
                                 f"{', '.join(sphere_cases if options.grid == 'latlon' else channel_cases)}")
    for axis, value in Model.default_shape.items():
        if getattr(options, axis) is None:
            setattr(options, axis, value)
    if options.precision is None:
        options.precision = "fp32" if options.model == "jacobi" else "fp64"
    return Model(comm, arch, options)


def check_finite(comm, model) -> None:
    """Collective: raise NumericalError on every rank if any rank's state holds NaN or Inf."""
    local_ok = all(bool(model.arch.xp.isfinite(f.interior).all()) for f in model.fields)
    if not comm.allreduce(int(local_ok), "min"):
        bad = comm.mpi.allgather(local_ok)
        raise NumericalError(
            f"the {model.name} state holds NaN/Inf at step {model.step_index} (ranks "
            f"{[r for r, ok in enumerate(bad) if not ok]}); expected finite values. The time step is "
            "probably unstable: lower --dt or --cfl, or add --viscosity."
        )


def run(options, comm) -> dict:
    """Run the configured model; returns the summary record (on every rank)."""
    options.dims = parse_dims(options.dims)
    if options.nccl_channels and "NCCL_MAX_NCHANNELS" not in os.environ:
        # Read by NCCL when the first communicator is created (below, on the first exchange).
        os.environ["NCCL_MAX_NCHANNELS"] = str(options.nccl_channels)
    arch = hpcgpu.arch.auto(comm, backend=options.backend, bind_cpus=options.bind_cpus)
    monitor = GpuMonitor.from_options(comm, arch, options)  # --monitor: NVML sampling thread, else a no-op
    model = make_model(comm, arch, options)
    steps = options.steps if options.steps is not None else getattr(model, "steps", None) or model.default_steps
    if hasattr(model, "steps"):
        model.steps = steps   # --steps wins over --days: the header describes the steps that will run
    output = prepare_output(comm, arch, options)   # checks every output path; OUTPUT/environment.json
    loud = comm.rank == 0 and not options.quiet
    if loud:
        print(f"apps.stencil {hpcgpu.__version__}: {model.describe()}")
        print(f"backend: {arch.name} ({arch.reason})")
        print(f"ranks: {comm.size} on {comm.n_nodes} node(s); {model.grid}")
        if options.graph and not arch.is_gpu:
            print("note: --graph has no effect on the CPU")
    control = RunControl(comm, options, app="apps.stencil", output=output, quiet=options.quiet)
    restored = control.restore(fields={f.name: f for f in model.fields})
    if restored is not None:
        model.restore(restored.replicated, restored.step, vars(options))
    first_step = model.step_index   # absolute step this job starts from (0, or the checkpoint's)
    if loud:
        print(f"steps: {steps_text(first_step, steps)}", flush=True)
    timers = PhaseTimers(arch)
    progress = Progress(comm, steps, enabled=not options.quiet, first=model.step_index)
    graph = None
    if hasattr(model, "prepare"):
        model.prepare()  # compile kernels outside the timed loop
    comm.barrier()
    arch.synchronize()
    started = time.perf_counter()
    if hasattr(model, "after_step") and restored is None:
        model.after_step(timers, output, steps)  # output of the initial state
    while model.step_index < steps:
        if graph is None and options.graph and arch.is_gpu and model.step_index >= 2 and model.capturable(2):
            from hpcgpu.app.graph import StepGraph

            graph = StepGraph(arch, model, 2)
        with timers.range(f"step {model.step_index + 1}"):
            if (graph is not None and model.step_index + 2 <= steps and model.capturable(2)
                    and not control.wants_save(model.step_index + 1)):
                graph.launch(timers)
            else:
                model.step(timers)
        if options.nan_check_every and model.step_index % options.nan_check_every == 0:
            check_finite(comm, model)
        progress.update(model.step_index, model.progress_note())
        if hasattr(model, "after_step"):
            model.after_step(timers, output, steps)
        control.after_step(model.step_index, model.checkpoint_state, timers)
    control.finish(model.step_index, model.checkpoint_state)
    arch.synchronize()
    wall = time.perf_counter() - started
    monitor_extra = monitor.finish(comm)  # collective; {} without --monitor
    check_finite(comm, model)
    diagnostics = model.diagnostics()
    checksum = fields_checksum(comm, model.fields)
    timer_summary = timers.summary(comm, wall)
    done = model.step_index - first_step   # the steps this job ran (a restart starts at first_step)
    throughput = model.updates_per_step * done / wall if wall > 0 else 0.0
    # Collective; raises if the rate beats the GPU's copy bandwidth (the steps did not do their work).
    plausibility = check_throughput(comm, arch, throughput, model.unit, getattr(model, "min_bytes_per_update", None))
    summary = make_summary(
        app="apps.stencil", backend=arch.name, comm=comm,
        decomposition={"dims": list(model.grid.dims), "global_shape": list(model.grid.global_shape),
                       "periodic": list(model.grid.periodic)},
        steps=done, wall_seconds=wall, throughput=throughput, unit=model.unit, timers=timer_summary,
        diagnostics=diagnostics, checksum=checksum,
        extra={"first_step": first_step, "final_step": model.step_index,
               "model": model.name, "precision": model.dtype, "updates_per_step": model.updates_per_step,
               "graph": bool(graph), "transport": auto_transport_name(arch), **plausibility, **monitor_extra},
    )
    if hasattr(model, "finish"):
        model.finish(output, summary, plot=not options.no_plot)
    if loud:
        print()
        print(f"{done} steps in {wall:.3f} s: {throughput / 1e9:.3f} G{model.unit} "
              f"({throughput / 1e9 / comm.size:.3f} per rank)")
        print(format_timers(timer_summary, wall))
        monitor.print_table()
        for key, value in diagnostics.items():
            print(f"{key:<24} {value}")
        print(f"checksum {checksum}")
    if comm.rank == 0 and options.summary:
        write_json(options.summary, summary)
    if loud:
        for line in files_written(output, options.summary, control.manager.directory,
                                  control.last_saved_step is not None and control.last_saved_step > first_step):
            print(line)
    return summary


def main(argv=None) -> int:
    return run_app("apps.stencil", build_parser, run, argv)

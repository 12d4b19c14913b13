"""``apps.md``: Lennard-Jones molecular dynamics on many ranks (``mpirun -np 8 lmp`` with ``bench/in.lj``).

The run loop, in order, on every rank::

    parse options (same on every rank) -> choose backend -> box and sub-boxes (3D, periodic)
    -> this rank's atoms (lattice or LAMMPS data file) -> ghosts, neighbour list, forces
    repeat: step (distributed.step: integrate, rebuild/migrate or ghost refresh, forces)
            -> thermo line every --thermo-every steps -> H5MD frame every --dump-every steps -> progress
    final thermo -> checksum (atoms sorted by id) -> data file, plot, table and JSON summary (rank 0)

Checkpoints (``--checkpoint-every``, stop signals, the wall-time limit) hold the owned atoms with their
positions at the last neighbour-list build (``distributed.checkpoint_payload``); ``--restart`` rebuilds
the same ghosts and list from those and continues bitwise with the same rank count, or on any other.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

import hpcgpu
from hpcgpu.app.checkpointing import RunControl
from hpcgpu.app.checksum import hash_arrays
from hpcgpu.app.cli import common_parser, non_negative_int, positive_int
from hpcgpu.app.environment import files_written, prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.app.plausibility import check_throughput
from hpcgpu.app.progress import Progress, steps_text
from hpcgpu.app.summary import make_summary, write_json
from hpcgpu.app.timers import PhaseTimers, format_timers
from hpcgpu.errors import ConfigurationError, NumericalError
from hpcgpu.monitor import GpuMonitor, add_monitor_arguments
from hpcgpu.particles import ParticleDomain

from . import distributed, system
from .potential import lennard_jones
from .serial import EXCHANGES, MDConfig
from .thermo import format_thermo, thermo_header

DESCRIPTION = """\
Lennard-Jones molecular dynamics on many GPUs (one MPI rank per GPU, or NumPy + Numba on CPUs), in
reduced LJ units. The defaults are the LAMMPS benchmark bench/in.lj: fcc lattice at density 0.8442,
20 x 20 x 20 unit cells (32,000 atoms), T 1.44, cutoff 2.5, skin 0.3, dt 0.005, 100 steps, NVE.

Parallel algorithm: 3D spatial decomposition into equal periodic sub-boxes; ghost atoms within
cutoff + skin copied from the 26 neighbouring ranks every step; atoms migrate on neighbour-list
rebuilds, which happen when any atom on any rank moved more than skin/2. Thermo output
(Step Temp E_pair TotEng Press, energies per atom) is the same on any number of ranks.
"""


def _cells(text: str) -> tuple[int, int, int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigurationError(f"--cells {text!r}: expected N or NX,NY,NZ positive integers") from None
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or min(values) < 1:
        raise ConfigurationError(f"--cells {text!r}: expected N or NX,NY,NZ positive integers")
    return tuple(values)


def _dims(text):
    if text is None:
        return None
    try:
        values = tuple(0 if part.strip() in ("*", "0") else int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise ConfigurationError(f"--dims {text!r}: expected ranks along x,y,z like '2,2,2' or '*,*,1'")
    return values


def build_parser(rank: int = 0):
    parser = common_parser("apps.md", DESCRIPTION, rank=rank, default_steps=100)
    atoms = parser.add_argument_group("system")
    atoms.add_argument("--lattice", choices=("fcc", "bcc", "sc"), default="fcc", help="initial lattice [fcc]")
    atoms.add_argument("--density", type=float, default=0.8442, help="reduced number density [0.8442]")
    atoms.add_argument("--cells", default="20", help="unit cells per axis: N or NX,NY,NZ [20]")
    atoms.add_argument("--temperature", type=float, default=1.44,
                       help="initial temperature (velocities: see --velocity) [1.44]")
    atoms.add_argument("--velocity", choices=system.VELOCITY_STYLES, default="lammps-geom",
                       help="initial velocities (lattice, or a data file without Velocities): lammps-geom = LAMMPS "
                            "'velocity all create T SEED loop geom' (uniform, generator seeded per atom from its "
                            "coordinates, zero momentum; bench/in.lj's velocities bit for bit), SEED = "
                            "--velocity-seed; counter = Maxwell-Boltzmann keyed by (--seed, atom id). Both are "
                            "independent of the decomposition [lammps-geom]")
    atoms.add_argument("--velocity-seed", type=positive_int, default=system.IN_LJ_VELOCITY_SEED, metavar="SEED",
                       help="SEED of --velocity lammps-geom, 1..2147483647 (bench/in.lj: 87287) [87287]")
    atoms.add_argument("--data", metavar="FILE", help="start from a LAMMPS data file (atom_style atomic) instead")
    atoms.add_argument("--write-data", metavar="FILE", help="write the final state as a LAMMPS data file")
    model = parser.add_argument_group("interactions and dynamics")
    model.add_argument("--potential", choices=("plain", "shift", "force_shift"), default="plain",
                       help="LJ cut: plain (lj/cut), shift (energy shifted to 0 at the cutoff), force_shift "
                            "(lj/smooth/linear: energy and force continuous) [plain]")
    model.add_argument("--cutoff", type=float, default=2.5, help="pair cutoff (sigma) [2.5]")
    model.add_argument("--tail", action="store_true", help="add tail corrections to E_pair and Press (plain cut)")
    model.add_argument("--dt", type=float, default=0.005, help="time step (tau) [0.005]")
    model.add_argument("--thermostat", choices=("none", "langevin", "nose-hoover"), default="none",
                       help="none (NVE), langevin (NVT, noise keyed by seed/step/atom id), nose-hoover (NVT) [none]")
    model.add_argument("--target-temperature", type=float, default=None,
                       help="thermostat target temperature [--temperature]")
    model.add_argument("--damping", type=float, default=1.0,
                       help="Langevin relaxation time / Nose-Hoover period (tau) [1.0]")
    model.add_argument("--precision", choices=("fp64", "fp32"), default="fp64",
                       help="fp64, or fp32 positions and pair forces with fp64 force/energy accumulation "
                            "(the GPU fast path) [fp64]")
    neighbor = parser.add_argument_group("neighbour lists and decomposition")
    neighbor.add_argument("--skin", type=float, default=0.3, help="neighbour skin (sigma) [0.3]")
    neighbor.add_argument("--rebuild-every", type=positive_int, default=1, metavar="N",
                          help="consider a rebuild every N steps (LAMMPS neigh_modify every N) [1]")
    neighbor.add_argument("--check-interval", type=positive_int, default=None, metavar="N",
                          help="read the device-side skin/2 watch at most every N steps; results are identical to "
                               "checking every step (earlier crossings are replayed); with --resident, the steps "
                               "per graph and per host check [10 on a GPU (25 resident), 1 on the CPU]")
    neighbor.add_argument("--resident", choices=("auto", "on", "off"), default="auto",
                          help="GPU: run whole steps, neighbour-list rebuilds included, on the device as CUDA "
                               "graphs of --check-interval steps -- on one rank with minimum-image distances instead "
                               "of ghost atoms, on several ranks cut into slabs (--dims P,1,1 or a permutation) with "
                               "migration and ghosts on the device (see --exchange) (same physics, equal to rounding; "
                               "needs >= 3 cells of cutoff + skin on every undivided axis, no Nose-Hoover, "
                               "--rebuild-every 1 with checks); auto = on where it applies [auto]")
    neighbor.add_argument("--exchange", choices=EXCHANGES, default="auto",
                          help="resident steps on several GPUs (slabs): how ghost rows and migrating atoms reach the "
                               "neighbouring GPUs -- peer: kernels store them straight into the neighbours' memory "
                               "(CUDA IPC, GPUs of one node); nccl: NCCL send/receive; auto = peer when all ranks "
                               "are on one node (same results either way) [auto]")
    neighbor.add_argument("--graph", choices=("auto", "on", "off"), default="auto",
                          help="GPU, one rank: replay the sync-free parts of each step as CUDA graphs (same results "
                               "bitwise); auto = on where it applies (no Nose-Hoover) [auto]")
    neighbor.add_argument("--no-check", action="store_true",
                          help="rebuild every --rebuild-every steps unconditionally (neigh_modify check no)")
    neighbor.add_argument("--dims", default=None,
                          help="ranks along x,y,z (LAMMPS 'processors'), e.g. '2,2,2' or '*,*,1' [automatic]")
    output = parser.add_argument_group("thermo and trajectory output")
    output.add_argument("--thermo-every", type=non_negative_int, default=50, metavar="N",
                        help="print Step Temp E_pair TotEng Press every N steps (0: first and last only) [50]")
    output.add_argument("--dump-every", type=non_negative_int, default=0, metavar="N",
                        help="write an H5MD frame (OUTPUT/trajectory.h5md) every N steps (0: none) [0]")
    output.add_argument("--no-plot", action="store_true", help="do not write OUTPUT/thermo.png")
    add_monitor_arguments(parser)  # --monitor, --monitor-interval, --profile
    return parser


def make_config(options) -> MDConfig:
    thermostat = {"none": None, "langevin": "langevin", "nose-hoover": "nose_hoover"}[options.thermostat]
    target = options.temperature if options.target_temperature is None else options.target_temperature
    for name, value in (("--dt", options.dt), ("--cutoff", options.cutoff), ("--damping", options.damping)):
        if not value > 0:
            raise ConfigurationError(f"{name}: expected a positive value, found {value}")
    if not options.skin >= 0:
        raise ConfigurationError(f"--skin: expected a value >= 0, found {options.skin}")
    if options.tail and options.potential != "plain":
        raise ConfigurationError(f"--tail: tail corrections assume the plain cut, found --potential {options.potential}; "
                                 "drop --tail or use --potential plain")
    return MDConfig(potential=lennard_jones(cutoff=options.cutoff, variant=options.potential), dt=options.dt,
                    skin=options.skin, rebuild_every=options.rebuild_every, rebuild_check=not options.no_check,
                    thermostat=thermostat, temperature=target, damping=options.damping, seed=options.seed,
                    tail_correction=options.tail, check_interval=options.check_interval,
                    graph={"auto": None, "on": True, "off": False}[getattr(options, "graph", "auto")],
                    resident={"auto": None, "on": True, "off": False}[getattr(options, "resident", "auto")],
                    exchange=getattr(options, "exchange", "auto"))


def build_state(comm, arch, options, config):
    """Collective: domain and initial state from the lattice options or ``--data``; returns (state, atoms)."""
    dims = _dims(options.dims)
    if options.data:
        data = system.read_data_everywhere(comm, options.data)
        if data.masses.size != config.potential.n_types:
            # One LJ type per data-file type, all with epsilon = sigma = 1 (per-type LJ options: future work).
            config = dataclasses.replace(config, potential=lennard_jones(
                cutoff=options.cutoff, variant=options.potential, epsilon=np.ones(data.masses.size),
                sigma=np.ones(data.masses.size)))
        domain = ParticleDomain(comm, data.box, config.ghost_width, dims=dims)
        atoms = system.data_atoms(domain, data, options.temperature, options.seed, velocity=options.velocity,
                                  velocity_seed=options.velocity_seed)
    else:
        cells = _cells(options.cells)
        domain = ParticleDomain(comm, system.lattice_box(options.lattice, options.density, cells),
                                config.ghost_width, dims=dims)
        atoms = system.lattice_atoms(domain, options.lattice, options.density, cells, options.temperature,
                                     options.seed, velocity=options.velocity, velocity_seed=options.velocity_seed)
    dtype = np.float64 if options.precision == "fp64" else np.float32
    state = distributed.init(domain, atoms.positions, atoms.velocities, config, types=atoms.types,
                             masses=atoms.masses, atom_ids=atoms.atom_ids, images=atoms.images, xp=arch.xp,
                             dtype=dtype)
    return state, atoms, config


def run(options, comm) -> dict:
    """Run the configured simulation; returns the summary record (on every rank)."""
    config = make_config(options)
    arch = hpcgpu.arch.auto(comm, backend=options.backend, bind_cpus=options.bind_cpus)
    monitor = GpuMonitor.from_options(comm, arch, options)  # --monitor: NVML sampling thread, else a no-op
    # Checks every output path (--write-data too) before the run, so its results are never lost at the end.
    output = prepare_output(comm, arch, options, files={"--write-data": options.write_data})
    loud = comm.rank == 0 and not options.quiet
    setup_started = time.perf_counter()
    state, atoms, config = build_state(comm, arch, options, config)
    control = RunControl(comm, options, app="apps.md", output=output, quiet=options.quiet)
    restored = control.restore(particles=True, select_fn=_owned_by(state.domain))
    if restored is not None:
        state = _restore(comm, state, restored, config, options, arch)
    setup_seconds = time.perf_counter() - setup_started
    timers = PhaseTimers(arch)
    domain = state.domain
    steps = options.steps if options.steps is not None else 100
    thermo_every = options.thermo_every or max(steps, 1)
    if loud:
        print(f"apps.md {hpcgpu.__version__}: Lennard-Jones MD, {atoms.description}")
        print(f"box {' x '.join(f'{v:.6g}' for v in domain.box)} sigma; {config.potential.variant} cut "
              f"{config.potential.max_cutoff:g}, skin {config.skin:g}, dt {config.dt:g}, "
              f"thermostat {options.thermostat}, {options.precision}"
              f"{' (fp32 pair forces, fp64 accumulation)' if options.precision == 'fp32' else ''}")
        print(f"backend: {arch.name} ({arch.reason})")
        print(f"ranks: {comm.size} on {comm.n_nodes} node(s); {domain.describe()}")
        print(f"steps: {steps_text(state.step, steps)}", flush=True)
        print(thermo_header())
    writer = _open_trajectory(comm, state, output, options, config)
    history, conserved = [], []

    def sample_thermo():
        with timers.phase("thermo"):
            sample = distributed.thermo(state, config)
            conserved.append(distributed.conserved_energy(state, config, sample))
        if not all(math.isfinite(v) for v in sample[1:]):
            raise NumericalError(f"thermo at step {sample.step} is not finite ({format_thermo(sample).strip()}); "
                                 "expected finite energies. The time step is probably too large: lower --dt.")
        history.append(sample)
        if loud:
            print(format_thermo(sample), flush=True)
        return sample

    sample_thermo()
    if writer is not None:
        _dump(comm, state, writer, history[-1], timers)
    first_step = state.step
    progress = Progress(comm, steps, enabled=not options.quiet, first=first_step)

    def checkpoint_state():
        particles, replicated = distributed.checkpoint_payload(state)
        replicated.update({"potential": config.potential.variant, "precision": options.precision,
                           "thermostat": options.thermostat})
        return {"particles": particles, "replicated": replicated}

    distributed.warm_up(state)   # NCCL peer connections are made here, not in the first timed step
    comm.barrier()
    arch.synchronize()
    timers.reset()   # the initial thermo and frame above are set-up: phases cover the timed loop only
    started = time.perf_counter()
    while state.step < steps:
        next_step = state.step + 1
        want_thermo = next_step % thermo_every == 0 or next_step == steps
        with timers.range(f"step {next_step}"):
            distributed.step(state, config, compute_energy=want_thermo, timers=timers)
        sample = sample_thermo() if want_thermo else None
        if writer is not None and options.dump_every and state.step % options.dump_every == 0:
            _dump(comm, state, writer, sample, timers)
        progress.update(state.step)
        control.after_step(state.step, checkpoint_state, timers)
    control.finish(state.step, checkpoint_state)
    distributed.settle(state, config, timers)   # the last steps since a check (replayed if needed)
    arch.synchronize()
    wall = time.perf_counter() - started
    steps_done = state.step - first_step
    monitor_extra = monitor.finish(comm)  # collective; {} without --monitor
    gathered = distributed.gather_by_id(state)   # after the timed loop: not a phase (it is not in wall)
    checksum = hash_arrays([(name, gathered[name]) for name in ("atom_ids", "types", "positions", "images",
                                                                 "velocities")]) if comm.rank == 0 else None
    checksum = comm.broadcast(checksum)
    diagnostics = _diagnostics(comm, state, config, history, conserved)
    diagnostics["setup_seconds"] = setup_seconds
    timer_summary = timers.summary(comm, wall)
    throughput = state.n_atoms * steps_done / wall if wall > 0 else 0.0
    # Collective; a step reads and writes positions and velocities at least once (3 components each).
    itemsize = 8 if options.precision == "fp64" else 4
    plausibility = check_throughput(comm, arch, throughput, "atom-steps/s", 12 * itemsize)
    summary = make_summary(
        app="apps.md", backend=arch.name, comm=comm,
        decomposition={"dims": list(domain.dims), "axes": "x,y,z", "box": domain.box.tolist(), "periodic": [True] * 3},
        steps=steps_done, wall_seconds=wall, throughput=throughput, unit="atom-steps/s", timers=timer_summary,
        diagnostics=diagnostics, checksum=checksum,
        extra={"first_step": first_step, "final_step": state.step,
               "n_atoms": state.n_atoms, "precision": options.precision, "thermostat": options.thermostat,
               "potential": config.potential.variant,
               "thermo": [dict(zip(("step", "temp", "e_pair", "toteng", "press"), s)) for s in history],
               **plausibility, **monitor_extra},
    )
    if comm.rank == 0:
        if writer is not None:
            writer.close()
        if options.write_data:
            system.write_gathered(options.write_data, gathered, domain.box, atoms.masses,
                                  f"LAMMPS data file written by hpcgpu apps.md at step {state.step}",
                                  box_lower=atoms.box_lower, box_upper=atoms.box_upper)
        if not options.no_plot and history:
            from .plot import plot_thermo

            plot_thermo(output / "thermo.png", history, f"apps.md: {state.n_atoms} atoms, {comm.size} rank(s)")
    if loud:
        print()
        print(f"{steps_done} steps of {state.n_atoms} atoms in {wall:.3f} s: {throughput:,.4g} atom-steps/s "
              f"({throughput / comm.size:,.4g} per rank)")
        print(format_timers(timer_summary, wall))
        monitor.print_table()
        for key in ("energy_drift", "neighbor_builds", "neighbor_reallocations", "rebuild_checks", "step_graphs",
                    "resident_steps", "atoms_per_rank",
                    "ghosts_per_rank"):
            print(f"{key:<24} {diagnostics[key]}")
        print(f"checksum {checksum}")
    if comm.rank == 0 and options.summary:
        write_json(options.summary, summary)
    if loud:
        if options.write_data:
            print(f"data file: {options.write_data}")
        for line in files_written(output, options.summary, control.manager.directory,
                                  control.last_saved_step is not None and control.last_saved_step > first_step):
            print(line)
    return summary


def _owned_by(domain):
    """Selection of checkpointed atoms for this rank: those whose reference position lies in its sub-box."""
    def select(rows):
        positions = np.asarray(rows["reference_positions"], dtype=np.float64)
        return domain.subbox.contains(np.mod(positions, domain.box))
    return select


def _restore(comm, fresh, restored, config, options, arch):
    """The state of a checkpoint, after checking that it belongs to this system."""
    replicated = restored.replicated
    expected = {"n_atoms": fresh.n_atoms, "box": [float(v) for v in fresh.box], "potential": config.potential.variant,
                "precision": options.precision, "thermostat": options.thermostat}
    found = {key: replicated[key] for key in expected}
    if found != expected:
        raise ConfigurationError(f"the checkpoint holds {found} but this run is {expected}; restart with the same "
                                 "system options (any number of ranks works)")
    dtype = np.float64 if options.precision == "fp64" else np.float32
    return distributed.restore(fresh.domain, restored.particles, replicated, config, dtype, xp=arch.xp)


def _open_trajectory(comm, state, output, options, config):
    """The H5MD trajectory when --dump-every is set (collective: :class:`apps.md.h5md.Trajectory`)."""
    if not options.dump_every:
        return None
    from .h5md import TRAJECTORY_NAME, Trajectory

    return Trajectory(comm, output / TRAJECTORY_NAME, state, config, options.dump_every)


def _dump(comm, state, writer, sample, timers) -> None:
    with timers.phase("io"):
        writer.dump(state, sample)


def _diagnostics(comm, state, config, history, conserved) -> dict:
    """Thermo at both ends, drift of the conserved energy (TotEng, plus the Nose-Hoover term), counts."""
    first, last = history[0], history[-1]
    elapsed = (last.step - first.step) * config.dt
    change = conserved[-1] - conserved[0]
    counts = comm.mpi.allgather((state.n_local, 0 if state.resident is not None else state.ghosts.n_ghost))
    return {
        "thermo_first": first._asdict(), "thermo_last": last._asdict(),
        "energy_drift": {
            "quantity": "TotEng + Nose-Hoover energy per atom" if config.thermostat == "nose_hoover" else "TotEng per atom",
            "relative": change / abs(conserved[0]) if conserved[0] else 0.0,
            "per_atom_per_tau": change / elapsed if elapsed > 0 else 0.0,
        },
        "neighbor_builds": state.n_builds,
        "neighbor_reallocations": state.n_reallocations,
        "neighbor_capacity": state.neighbor_list.capacity,
        "rebuild_checks": state.watch.summary() if state.watch is not None else {"check_interval": 1},
        "step_graphs": state.graphs.summary() if state.graphs is not None else None,
        "resident_steps": state.resident.summary() if state.resident is not None else None,
        "atoms_per_rank": {"min": min(c[0] for c in counts), "max": max(c[0] for c in counts)},
        "ghosts_per_rank": {"min": min(c[1] for c in counts), "max": max(c[1] for c in counts)},
    }


def main(argv=None) -> int:
    return run_app("apps.md", build_parser, run, argv)

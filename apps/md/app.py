"""``apps.md``: Lennard-Jones molecular dynamics on many ranks (``mpirun -np 8 lmp`` with ``bench/in.lj``).

This module is the app's configuration: the command line, the MD configuration and the initial
state (box and sub-boxes, this rank's atoms from a lattice or a LAMMPS data file, ghosts, neighbour
list, forces). The run loop is :class:`hpcgpu.simulation.Simulation`'s; the model and its outputs
(thermo lines every ``--thermo-every`` steps, H5MD frames every ``--dump-every`` steps, the data file
and plot) are in :mod:`apps.md.simulation_model`; a step is ``distributed.step`` (integrate,
rebuild/migrate or ghost refresh, forces).

Checkpoints (``--checkpoint-every``, stop signals, the wall-time limit) hold the owned atoms with their
positions at the last neighbour-list build (``distributed.checkpoint_payload``); ``--restart`` rebuilds
the same ghosts and list from those and continues bitwise with the same rank count, or on any other.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from hpcgpu.app.cli import common_parser, non_negative_int, positive_int
from hpcgpu.app.environment import prepare_output
from hpcgpu.app.main import run_app
from hpcgpu.app.memory import MemoryEstimate, refuse_if_too_large
from hpcgpu.errors import ConfigurationError
from hpcgpu.observe.monitor import add_monitor_arguments
from hpcgpu.particles import ParticleDomain
from hpcgpu.simulation import Simulation, setup_architecture

from . import distributed, lattice, system
from .potential import lennard_jones
from .serial import EXCHANGES, MDConfig
from .simulation_model import LennardJonesModel, ThermoOutput, TrajectoryOutput

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


def memory_estimate(options, config, n_ranks: int, on_gpu: bool) -> MemoryEstimate | None:
    """A lower bound of the bytes the largest rank's atoms take (host, or GPU memory on a GPU); None for --data.

    Per owned atom: positions, velocities and forces (3 components each, of the run's precision), id,
    image flags and type, and its neighbours (int32 each): on average the lattice's density times the
    volume of the sphere of cutoff + skin. The list's spare capacity and ghost atoms only add to it.
    """
    if options.data:
        return None   # the file's atoms are read already; their count is what it is
    n_atoms = lattice.BASES[options.lattice].shape[0] * math.prod(_cells(options.cells))
    per_rank = -(-n_atoms // n_ranks)
    itemsize = 8 if options.precision == "fp64" else 4
    reach = config.potential.max_cutoff + config.skin
    density = options.density if math.isfinite(options.density) and options.density > 0 else 0.0   # checked later
    neighbours = math.floor(density * 4.0 / 3.0 * math.pi * reach**3)
    per_atom = 3 * 3 * itemsize + 8 + 3 * 4 + 4 + 4 * neighbours
    return MemoryEstimate(per_rank * per_atom, "gpu" if on_gpu else "host",
                          f"{n_atoms:.3g} atoms, {per_rank:.3g} per rank x {per_atom} bytes (state and "
                          f"{neighbours} neighbours each)")


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
    steps = options.steps if options.steps is not None else 100
    arch = setup_architecture(comm, options)   # arch.auto, then the job's transport (--transport)
    estimate = memory_estimate(options, config, comm.size, arch.is_gpu)
    if estimate is not None:
        refuse_if_too_large(comm, "apps.md", estimate, "use fewer --cells, more ranks or nodes, or --precision fp32")
    setup_started = time.perf_counter()
    state, atoms, config = build_state(comm, arch, options, config)   # refuses a bad lattice, temperature, data file
    # Only now, with every option accepted: check every output path (--write-data too), so the results
    # are never lost at the end, and lock the output and checkpoint directories for this job.
    output = prepare_output(comm, arch, options, files={"--write-data": options.write_data})
    model = LennardJonesModel(comm, arch, state, atoms, config, options, final_step=steps,
                              setup_seconds=time.perf_counter() - setup_started)
    operations = [ThermoOutput(model)]
    if options.dump_every:
        operations.append(TrajectoryOutput(model, options.dump_every))
    # --graph is MD's own (graphs of the sync-free parts of a step, apps.md.step_graph): not the driver's.
    simulation = Simulation(comm, arch, model, options, app="apps.md", output=output, final_step=steps,
                            operations=operations, graph=False, plot=not options.no_plot)
    return simulation.run()


def main(argv=None) -> int:
    return run_app("apps.md", build_parser, run, argv)

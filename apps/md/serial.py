"""A serial LJ driver over a state record: ``state = init(...)`` then ``step(state, config)``.

One step (the order of :func:`step`)::

    1. Nose-Hoover half step, v *= scale                       (thermostat "nose_hoover")
    2. v += dt/2 f/m ; x += dt v                                velocity_verlet_first_half
    3. every ``rebuild_every`` steps: if ``rebuild_check`` is False, or an atom moved more than skin/2,
       rebuild = wrap into the box, sort atoms by cell (every ``sort_every`` rebuilds), periodic ghosts,
       cell binning, neighbour list; otherwise refresh the ghost positions from their owners
    4. forces (+ E_pair and virial when asked)
    5. Langevin friction and noise added to the forces          (thermostat "langevin")
    6. v += dt/2 f/m                                            velocity_verlet_second_half
    7. Nose-Hoover half step, v *= scale                       (thermostat "nose_hoover")

The state lives on one backend (NumPy or CuPy arrays, float64 or float32) and is mutated in place: on a
GPU nothing is copied between steps. The distributed app replaces the ghost and wrap calls of step 3 by
migration and ghost exchange between ranks and the global sums by allreduces; everything else is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpcgpu.errors import ConfigurationError

from ._arrays import array_module, to_numpy
from .cells import bin_atoms, make_cell_grid
from .forces import compute_forces
from .ghosts import make_periodic_ghosts, update_ghost_positions, wrap_positions
from .lammps_data import LammpsData
from .integrate import (NoseHooverState, langevin_forces, nose_hoover_energy, nose_hoover_half_step,
                        velocity_verlet_first_half, velocity_verlet_second_half)
from .neighbors import NeighborList, needs_rebuild, rebuild_neighbor_list
from .potential import LennardJones, tail_corrections
from .thermo import Thermo, degrees_of_freedom, kinetic_energy, thermo_sample

THERMOSTATS = (None, "langevin", "nose_hoover")
#: Ways the slab driver moves ghost rows and migrants between GPUs (MDConfig.exchange).
EXCHANGES = ("auto", "peer", "nccl")


@dataclass(frozen=True)
class MDConfig:
    """Run parameters (reduced LJ units).

    Attributes
    ----------
    potential : LennardJones
    dt : float -- time step (tau)
    skin : float -- neighbour skin (sigma)
    rebuild_every : int -- consider a rebuild every this many steps (LAMMPS ``neigh_modify every``)
    rebuild_check : bool -- rebuild only if an atom moved > skin/2 (``check yes``); else always rebuild
    sort_every : int -- sort owned atoms by cell every this many rebuilds (0: never)
    thermostat : None, "langevin" or "nose_hoover"
    temperature : float -- thermostat target (epsilon / k_B)
    damping : float -- Langevin relaxation time / Nose-Hoover period (tau)
    seed : int -- Langevin noise seed
    tail_correction : bool -- add LAMMPS-style tail corrections to E_pair and pressure (plain cut only)
    check_interval : int or None -- distributed driver: at most this many steps between host reads of the
        device-side displacement watch (results identical to checking every step, :mod:`apps.md.watch`);
        None = 10 on a GPU, 1 (plain every-step check) on the CPU
    graph : bool or None -- distributed driver on one GPU: replay the sync-free parts of a step as CUDA
        graphs (:mod:`apps.md.step_graph`; bitwise the same results); None = on wherever it applies
        (GPU, one rank, no Nose-Hoover), False = off
    resident : bool or None -- distributed driver on one GPU: run whole steps, neighbour-list rebuilds
        included, on the device as graphs of ``check_interval`` (default 25) steps (:mod:`apps.md.resident`;
        the same physics, equal to rounding); None = wherever it applies, True = required (an error
        says why it cannot), False = off (then ``graph`` decides)
    exchange : "auto", "peer" or "nccl" -- device-resident steps on several GPUs (slabs,
        :mod:`apps.md.resident_slab`): how ghost rows and migrating atoms reach the neighbours. "peer": kernels
        store them straight into the neighbours' memory (CUDA IPC, GPUs of one node); "nccl": NCCL
        send/receive of fixed-size messages; "auto": peer when every rank is on one node. Same results.
    """

    potential: LennardJones
    dt: float = 0.005
    skin: float = 0.3
    rebuild_every: int = 1
    rebuild_check: bool = True
    sort_every: int = 1
    thermostat: str | None = None
    temperature: float = 1.0
    damping: float = 1.0
    seed: int = 12345
    tail_correction: bool = False
    check_interval: int | None = None
    graph: bool | None = None
    resident: bool | None = None
    exchange: str = "auto"

    def __post_init__(self):
        if self.thermostat not in THERMOSTATS:
            raise ConfigurationError(f"thermostat: expected one of {THERMOSTATS}, found {self.thermostat!r}")
        if self.exchange not in EXCHANGES:
            raise ConfigurationError(f"exchange: expected one of {EXCHANGES}, found {self.exchange!r}")
        if self.check_interval is not None and not int(self.check_interval) >= 1:
            raise ConfigurationError(f"check_interval: expected an integer >= 1 or None, found {self.check_interval}")
        if not (self.dt > 0 and self.skin >= 0 and self.rebuild_every >= 1 and self.sort_every >= 0):
            raise ConfigurationError(
                f"MDConfig: expected dt > 0, skin >= 0, rebuild_every >= 1, sort_every >= 0; found dt={self.dt}, "
                f"skin={self.skin}, rebuild_every={self.rebuild_every}, sort_every={self.sort_every}")
        if self.tail_correction and self.potential.variant != "plain":
            raise ConfigurationError("tail_correction: only valid with the plain LJ cut; set it False or use variant='plain'")

    @property
    def ghost_width(self) -> float:
        return self.potential.max_cutoff + self.skin


@dataclass
class MDState:
    """Everything that changes during a run. Rows ``[:n_local]`` are owned atoms, the rest ghosts.

    positions (n_total, 3), velocities/forces (n_local, 3), masses (n_local,), types (n_total,) int32
    0-based, atom_ids (n_local,) int64, images (n_local, 3) int32; ``box`` (3,) float64 on the host.
    """

    positions: object
    velocities: object
    forces: object
    masses: object
    types: object
    atom_ids: object
    images: object
    box: np.ndarray
    n_local: int
    pair_table: object
    ghost_source: object = None
    ghost_shifts: object = None
    neighbor_list: NeighborList | None = None
    step: int = 0
    nose_hoover: NoseHooverState = field(default_factory=NoseHooverState)
    energy_virial: object = None     # [E_pair, W] of step ``energy_step``
    energy_step: int = -1
    n_builds: int = 0
    n_reallocations: int = 0


def init(positions, velocities, box, config: MDConfig, types=None, masses=None, atom_ids=None, images=None,
         xp=np, dtype=np.float64) -> MDState:
    """Create the state, build ghosts and neighbour list, compute the initial forces and energy.

    Parameters
    ----------
    positions, velocities : array_like, shape (n_atoms, 3) -- sigma, sigma/tau (host or device)
    box : array_like, shape (3,) -- box lengths (sigma), box at the origin
    config : MDConfig
    types : array_like, shape (n_atoms,), 0-based ints; default all 0
    masses : array_like, shape (n_types,) per-type masses (m); default 1
    atom_ids : array_like, shape (n_atoms,), default 1..n_atoms
    images : array_like, shape (n_atoms, 3), default 0
    xp : module -- ``numpy`` or ``cupy``; dtype -- float64 (default) or float32 (GPU fast path)
    """
    positions = to_numpy(positions)
    n_atoms = positions.shape[0]
    types = np.zeros(n_atoms, np.int32) if types is None else to_numpy(types).astype(np.int32)
    if types.size and (types.min() < 0 or types.max() >= config.potential.n_types):
        raise ConfigurationError(
            f"types: expected 0-based types below {config.potential.n_types}, found range "
            f"[{types.min()}, {types.max()}]; give the potential one entry per type")
    per_type_mass = np.ones(config.potential.n_types) if masses is None else np.asarray(masses, np.float64)
    atom_ids = np.arange(1, n_atoms + 1, dtype=np.int64) if atom_ids is None else to_numpy(atom_ids).astype(np.int64)
    images = np.zeros((n_atoms, 3), np.int32) if images is None else to_numpy(images).astype(np.int32)
    state = MDState(
        positions=xp.asarray(positions, dtype=dtype), velocities=xp.asarray(to_numpy(velocities), dtype=dtype),
        forces=xp.zeros((n_atoms, 3), dtype=dtype), masses=xp.asarray(per_type_mass[types], dtype=dtype),
        types=xp.asarray(types), atom_ids=xp.asarray(atom_ids), images=xp.ascontiguousarray(xp.asarray(images)),
        box=np.asarray(box, dtype=np.float64), n_local=n_atoms,
        pair_table=xp.asarray(config.potential.pair_table(dtype=dtype)))
    rebuild(state, config, sort=config.sort_every > 0)
    state.energy_virial = compute_forces(state.positions, state.types, state.neighbor_list, state.pair_table,
                                         state.forces, compute_energy=True)
    state.energy_step = state.step
    return state


def step(state: MDState, config: MDConfig, compute_energy: bool = False) -> None:
    """Advance ``state`` by one time step in place (order in the module docstring). Returns None.

    ``compute_energy=True`` also stores ``[E_pair, W]`` of the new positions in ``state.energy_virial``.
    """
    dt = config.dt
    n_dof = degrees_of_freedom(state.n_local)
    if config.thermostat == "nose_hoover":
        _nose_hoover_scale(state, config, n_dof)
    velocity_verlet_first_half(state.positions, state.velocities, state.forces, state.masses, dt)
    state.step += 1
    if state.step % config.rebuild_every == 0 and (
            not config.rebuild_check or needs_rebuild(state.positions, state.neighbor_list)):
        sort = config.sort_every > 0 and (state.n_builds % config.sort_every == 0)
        rebuild(state, config, sort=sort)
    else:
        update_ghost_positions(state.positions, state.n_local, state.ghost_source, state.ghost_shifts)
    energy_virial = compute_forces(state.positions, state.types, state.neighbor_list, state.pair_table,
                                   state.forces, compute_energy=compute_energy)
    if compute_energy:
        state.energy_virial, state.energy_step = energy_virial, state.step
    if config.thermostat == "langevin":
        langevin_forces(state.forces, state.velocities, state.masses, state.atom_ids, config.temperature,
                        config.damping, dt, config.seed, state.step)
    velocity_verlet_second_half(state.velocities, state.forces, state.masses, dt)
    if config.thermostat == "nose_hoover":
        _nose_hoover_scale(state, config, n_dof)


def rebuild(state: MDState, config: MDConfig, sort: bool = True) -> None:
    """Wrap owned atoms, optionally sort them by cell, rebuild ghosts, cells and the neighbour list."""
    xp = array_module(state.positions)
    n_local = state.n_local
    owned = xp.ascontiguousarray(state.positions[:n_local])
    wrap_positions(owned, state.images, state.box)
    cutoff = config.ghost_width
    if sort and n_local > 0:
        # Cell order of the owned atoms, from the same counting sort as the neighbour search.
        order = bin_atoms(owned, make_cell_grid(np.zeros(3), state.box, 0.0, cutoff)).cell_atoms
        owned = owned[order]
        for name in ("velocities", "forces", "masses", "atom_ids", "images"):
            setattr(state, name, xp.ascontiguousarray(getattr(state, name)[order]))
        state.types = xp.ascontiguousarray(state.types[:n_local][order])
    ghosts = make_periodic_ghosts(owned, state.box, cutoff)
    state.positions = xp.ascontiguousarray(xp.concatenate([owned, ghosts.positions]))
    state.types = xp.ascontiguousarray(xp.concatenate([state.types[:n_local], state.types[ghosts.source]]))
    state.ghost_source, state.ghost_shifts = ghosts.source, ghosts.shifts
    rebuild_neighbor_list(state, n_local, make_cell_grid(np.zeros(3), state.box, cutoff, cutoff), config.potential,
                          config.skin)


def thermo(state: MDState, config: MDConfig) -> Thermo:
    """Thermo sample of the current state (recomputes E_pair and W if the last step did not)."""
    if state.energy_step != state.step:
        scratch = array_module(state.forces).empty_like(state.forces)  # keep Langevin-augmented forces intact
        state.energy_virial = compute_forces(state.positions, state.types, state.neighbor_list,
                                             state.pair_table, scratch, compute_energy=True)
        state.energy_step = state.step
    pair_energy, virial = (float(value) for value in to_numpy(state.energy_virial))
    volume = float(np.prod(state.box))
    energy_tail = pressure_tail = 0.0
    if config.tail_correction:
        counts = np.bincount(to_numpy(state.types[:state.n_local]), minlength=config.potential.n_types)
        energy_tail, pressure_tail = tail_corrections(config.potential, counts, volume)
    return thermo_sample(state.step, kinetic_energy(state.velocities, state.masses), pair_energy, virial,
                         state.n_local, volume, energy_tail, pressure_tail)


def thermostat_energy_per_atom(nose_hoover: NoseHooverState, n_atoms: int, config: MDConfig) -> float:
    """The Nose-Hoover thermostat's energy per atom (epsilon); 0 for other thermostats."""
    if config.thermostat != "nose_hoover":
        return 0.0
    return nose_hoover_energy(nose_hoover, degrees_of_freedom(n_atoms), config.temperature, config.damping) / n_atoms


def conserved_energy(state: MDState, config: MDConfig) -> float:
    """Total energy per atom plus the Nose-Hoover thermostat energy per atom (epsilon)."""
    return thermo(state, config).total_energy + thermostat_energy_per_atom(state.nose_hoover, state.n_local, config)


def host_arrays_by_id(state: MDState) -> dict:
    """Owned-atom arrays on the host, sorted by atom id (for checksums, output and comparisons)."""
    order = np.argsort(to_numpy(state.atom_ids), kind="stable")
    return {
        "atom_ids": to_numpy(state.atom_ids)[order],
        "types": to_numpy(state.types[:state.n_local])[order],
        "positions": to_numpy(state.positions[:state.n_local])[order],
        "images": to_numpy(state.images)[order],
        "velocities": to_numpy(state.velocities)[order],
    }


def init_from_lammps_data(data: LammpsData, config: MDConfig, xp=np, dtype=np.float64) -> MDState:
    """:func:`init` from a :class:`~apps.md.lammps_data.LammpsData` (box moved to the origin; zero
    velocities if the file has none)."""
    velocities = np.zeros_like(data.positions) if data.velocities is None else data.velocities
    return init(data.positions - data.box_lower, velocities, data.box, config, types=data.types,
                masses=data.masses, atom_ids=data.atom_ids, images=data.images, xp=xp, dtype=dtype)


def to_lammps_data(state: MDState, masses_per_type) -> LammpsData:
    """Owned atoms of ``state`` (sorted by id) as a :class:`~apps.md.lammps_data.LammpsData`."""
    arrays = host_arrays_by_id(state)
    return LammpsData(box_lower=np.zeros(3), box_upper=state.box.copy(), masses=np.asarray(masses_per_type, np.float64),
                      atom_ids=arrays["atom_ids"], types=arrays["types"].astype(np.int32),
                      positions=arrays["positions"].astype(np.float64), images=arrays["images"],
                      velocities=arrays["velocities"].astype(np.float64))


def _nose_hoover_scale(state, config, n_dof):
    kinetic = kinetic_energy(state.velocities, state.masses)
    state.nose_hoover, scale = nose_hoover_half_step(state.nose_hoover, kinetic, n_dof, config.temperature,
                                                     config.damping, config.dt)
    state.velocities *= state.velocities.dtype.type(scale)

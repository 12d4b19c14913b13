"""The state of the distributed LJ driver (:mod:`apps.md.distributed`) and how it is built.

:class:`DistributedState` is one rank's :class:`~apps.md.serial.MDState` plus its domain, ghost exchange
and the optional step machinery (rebuild watch, step graphs, device-resident driver). :func:`init`
builds it from owned atoms, :func:`restore` from a checkpoint; both go through :func:`rebuild` (wrap,
migrate, sort, ghosts, neighbour list) and attach the machinery that suits the run. The step functions
that advance it are in :mod:`apps.md.distributed`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from hpcgpu.arch import is_device_array
from hpcgpu.particles import GhostExchange, ParticleDomain, migrate

from ._arrays import array_module, to_numpy
from .cells import bin_atoms, make_cell_grid
from .forces import compute_forces, compute_forces_per_atom
from .ghosts import wrap_positions
from .integrate import NoseHooverState
from .neighbors import rebuild_neighbor_list
from .resident import ResidentSteps, resident_applies
from .resident_slab import SlabResidentSteps
from .serial import MDConfig, MDState
from .step_graph import StepGraphs, graphs_apply
from .watch import RebuildWatch

_MIGRATED = ("velocities", "masses", "types", "atom_ids", "images")


class _NoTimers:
    def phase(self, name, stream=None):
        return contextlib.nullcontext()


@dataclass
class DistributedState(MDState):
    """:class:`~apps.md.serial.MDState` of one rank plus its domain and ghost exchange.

    ``n_atoms`` is the global atom count; ``per_atom_energy`` holds this rank's per-atom shares of
    (E_pair, W) of step ``energy_step``, two (n_local,) float64 arrays on the state's backend.
    """

    domain: ParticleDomain | None = None
    ghosts: GhostExchange | None = None
    watch: RebuildWatch | None = None
    graphs: StepGraphs | None = None
    resident: ResidentSteps | None = None
    n_atoms: int = 0
    per_atom_energy: tuple | None = None

    @property
    def is_gpu(self) -> bool:
        return is_device_array(self.positions)


def init(domain: ParticleDomain, positions, velocities, config: MDConfig, types=None, masses=None,
         atom_ids=None, images=None, xp=np, dtype=np.float64) -> DistributedState:
    """Collective: this rank's state from its owned atoms; builds ghosts, neighbour list, forces, energy.

    Parameters
    ----------
    domain : hpcgpu.particles.ParticleDomain -- its box is the simulation box (sigma)
    positions, velocities : array_like, shape (n_local, 3) -- atoms of this rank (any rank may hold any
        atom: the first rebuild migrates them to their owners), sigma and sigma/tau
    types : (n_local,) 0-based ints, default 0; masses : (n_types,) per-type masses, default 1
    atom_ids : (n_local,) int64 global ids (required with more than one rank); images : (n_local, 3) int32
    xp : numpy or cupy ; dtype : float64 or float32
    """
    positions = to_numpy(positions)
    n_local = positions.shape[0]
    types = np.zeros(n_local, np.int32) if types is None else to_numpy(types).astype(np.int32)
    per_type_mass = np.ones(config.potential.n_types) if masses is None else np.asarray(masses, np.float64)
    if atom_ids is None:  # consecutive ids, rank by rank
        atom_ids = np.arange(1, n_local + 1, dtype=np.int64) + (domain.comm.mpi.exscan(n_local) or 0)
    atom_ids = to_numpy(atom_ids).astype(np.int64)
    images = np.zeros((n_local, 3), np.int32) if images is None else to_numpy(images).astype(np.int32)
    bad_type = bool(types.size) and (types.min() < 0 or types.max() >= config.potential.n_types)
    domain.comm.check(not bad_type, f"atom types: expected 0-based types below {config.potential.n_types}, found "
                      f"range [{types.min() if types.size else 0}, {types.max() if types.size else 0}]")
    state = DistributedState(
        positions=xp.asarray(positions, dtype=dtype), velocities=xp.asarray(to_numpy(velocities), dtype=dtype),
        forces=xp.zeros((n_local, 3), dtype=dtype), masses=xp.asarray(per_type_mass[types], dtype=dtype),
        types=xp.asarray(types), atom_ids=xp.asarray(atom_ids), images=xp.ascontiguousarray(xp.asarray(images)),
        box=domain.box.copy(), n_local=n_local, pair_table=xp.asarray(config.potential.pair_table(dtype=dtype)),
        domain=domain, n_atoms=int(domain.comm.allreduce(n_local)))
    rebuild(state, config, sort=config.sort_every > 0)
    _forces(state, compute_energy=True)
    _attach_watch(state, config)
    return state

def check_interval(config: MDConfig, is_gpu: bool) -> int:
    """Steps between host reads of the rebuild watch: ``config.check_interval``, or 10 on a GPU and 1
    (every step, no watch) on the CPU when it is None."""
    if config.check_interval is not None:
        return int(config.check_interval)
    return 10 if is_gpu else 1


def _attach_watch(state: DistributedState, config: MDConfig) -> None:
    """The device-resident driver when it applies (:mod:`apps.md.resident`), else lazy checks when they
    apply (a checked list and an interval above 1; the state is verified now) and step graphs."""
    state.resident = None
    if resident_applies(state, config):
        state.watch = state.graphs = None
        if state.domain.comm.size == 1:
            state.resident = ResidentSteps(state, config)
        else:
            state.resident = SlabResidentSteps(state, config)
        return
    interval = check_interval(config, state.is_gpu)
    state.watch = None
    if config.rebuild_check and interval > 1:
        state.watch = RebuildWatch(state.positions, config.skin, interval)
        state.watch.config = config   # settle() replays with it when called without a config
        state.watch.build_step = state.step
        state.watch.verified(state, None)
    state.graphs = StepGraphs(state.positions.dtype) if graphs_apply(state, config) else None


def rebuild(state: DistributedState, config: MDConfig, sort: bool = True, timers=None, carried=None) -> dict:
    """Collective: wrap, migrate, optionally sort by cell, exchange ghosts, bin and build the neighbour list.

    ``carried``: extra per-owned-atom arrays ``{name: (n_local, ...)}`` that must follow the atoms through
    migration and sorting; returned reordered (an empty dict without them).
    """
    timers = timers or _NoTimers()
    xp = array_module(state.positions)
    domain = state.domain
    width = config.ghost_width
    with timers.phase("compute"):
        owned = xp.ascontiguousarray(state.positions[:state.n_local])
        wrap_positions(owned, state.images, state.box)
    with timers.phase("communication"):
        arrays = {name: getattr(state, name) for name in _MIGRATED}
        arrays["types"] = state.types[:state.n_local]
        extra_names = sorted(carried or {})
        arrays.update({f"carried:{name}": carried[name] for name in extra_names})
        owned, arrays = migrate(domain, owned, arrays)
        n_local = owned.shape[0]
    with timers.phase("neighbor"):
        if sort and n_local > 0:
            # Cell order of the owned atoms (same counting sort as the neighbour search): cache locality.
            order = bin_atoms(owned, make_cell_grid(domain.subbox.lower, domain.subbox.upper, 0.0, width)).cell_atoms
            owned = xp.ascontiguousarray(owned[order])
            arrays = {name: xp.ascontiguousarray(values[order]) for name, values in arrays.items()}
    carried = {name: arrays.pop(f"carried:{name}") for name in extra_names}
    for name, values in arrays.items():
        setattr(state, name, values)
    state.n_local = n_local
    state.forces = xp.zeros((n_local, 3), dtype=owned.dtype)
    with timers.phase("communication"):
        state.ghosts = GhostExchange(domain, owned, width, carried={"types": state.types})
    with timers.phase("neighbor"):
        state.positions = xp.ascontiguousarray(xp.concatenate([owned, state.ghosts.positions]))
        state.types = xp.ascontiguousarray(xp.concatenate([state.types, state.ghosts.carried["types"]]))
        grid = make_cell_grid(domain.subbox.lower, domain.subbox.upper, width, width)
        rebuild_neighbor_list(state, n_local, grid, config.potential, config.skin)
    return carried

def restore(domain: ParticleDomain, particles: dict, replicated: dict, config: MDConfig, pair_table_dtype,
            xp=np) -> DistributedState:
    """Collective: the state saved by :func:`checkpoint_payload` (this rank's rows of it, any rank count).

    With the rank count of the writer the result is bitwise the interrupted state; with another one the
    atoms migrate to their new owners and the neighbour order differs (results agree to rounding).
    """
    dtype = pair_table_dtype
    n_local = particles["atom_ids"].shape[0]
    as_array = lambda name, kind=dtype: xp.asarray(particles[name], dtype=kind)  # noqa: E731
    state = DistributedState(
        positions=as_array("reference_positions"), velocities=as_array("velocities"),
        forces=xp.zeros((n_local, 3), dtype=dtype), masses=as_array("masses"),
        types=xp.asarray(particles["types"], dtype=np.int32), atom_ids=xp.asarray(particles["atom_ids"], dtype=np.int64),
        images=xp.ascontiguousarray(xp.asarray(particles["images"], dtype=np.int32)), box=np.asarray(replicated["box"]),
        n_local=n_local, pair_table=xp.asarray(config.potential.pair_table(dtype=dtype)), domain=domain,
        n_atoms=int(replicated["n_atoms"]))
    total = int(domain.comm.allreduce(n_local))
    domain.comm.check(total == state.n_atoms, f"the checkpoint holds {state.n_atoms} atoms but {total} were read")
    # Rebuild from the reference positions (no sort: the saved order is the order the list was built in).
    carried = rebuild(state, config, sort=False, carried={"positions": as_array("positions"), "forces": as_array("forces")})
    state.positions[:state.n_local] = carried["positions"]
    state.ghosts.forward(state.positions)
    state.forces = xp.ascontiguousarray(carried["forces"])
    state.step = int(replicated["step"])
    state.n_builds = int(replicated["n_builds"])
    state.nose_hoover = NoseHooverState(*replicated["nose_hoover"])
    state.energy_step = -1
    _attach_watch(state, config)
    return state


def _forces(state: DistributedState, compute_energy: bool, forces=None) -> None:
    forces = state.forces if forces is None else forces
    if compute_energy:
        # Per-atom (E_pair, W) shares (device arrays on the GPU), summed by thermo().
        state.per_atom_energy = compute_forces_per_atom(state.positions, state.types, state.neighbor_list,
                                                        state.pair_table, forces)
        state.energy_step = state.step
        return
    compute_forces(state.positions, state.types, state.neighbor_list, state.pair_table, forces, compute_energy=False)

def owned_arrays(state: DistributedState) -> dict:
    """This rank's owned atoms as host arrays (the checkpoint payload; order: local)."""
    n_local = state.n_local
    return {
        "atom_ids": to_numpy(state.atom_ids), "types": to_numpy(state.types[:n_local]),
        "positions": to_numpy(state.positions[:n_local]), "images": to_numpy(state.images),
        "velocities": to_numpy(state.velocities), "masses": to_numpy(state.masses),
    }

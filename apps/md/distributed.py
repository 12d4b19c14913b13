"""The distributed LJ driver: ``state = init(...)`` then ``step(state, config)``, one sub-box per rank.

The same physics as :mod:`apps.md.serial` (same kernels, same :class:`~apps.md.serial.MDConfig`); only the
periodic boundaries differ: instead of one rank making periodic images of its own atoms, atoms migrate
between ranks and ghosts come from neighbouring ranks (:mod:`hpcgpu.particles`). One step, in order::

    1. Nose-Hoover half step, v *= scale (global kinetic energy: allreduce)     (thermostat "nose_hoover")
    2. v += dt/2 f/m ; x += dt v                                               velocity_verlet_first_half
    3. every ``rebuild_every`` steps: if ``rebuild_check`` is False, or an atom on ANY rank moved more
       than skin/2 (one allreduce of the flag; with a lazy check, ``state.watch``, the flag is kept on
       the device and read every few steps, replaying from the last check when a crossing was missed:
       :mod:`apps.md.watch`), rebuild:
           wrap into the box -> migrate to the owning ranks -> sort by cell -> ghost exchange (build)
           -> cell binning -> neighbour list (grown and redone on overflow)
       otherwise ghost positions are refreshed along the same lists (GhostExchange.forward)
    4. forces (+ per-atom E_pair and virial shares when asked)
    5. Langevin friction and noise, keyed by (seed, step, atom id): identical on any decomposition
    6. v += dt/2 f/m
    7. Nose-Hoover half step

Thermo sums (kinetic energy, E_pair, virial) are sums of per-atom float64 terms. On the CPU they are
exact over all atoms of all ranks (:mod:`apps.md.reduction`), so 1..N ranks print the same thermo up to
the last-bit differences of the per-atom forces (neighbour order depends on the local binning), which
stay far below 1e-10 over the first hundreds of steps. On the GPU the per-atom terms never leave the
device: each rank sums them with a fixed-order tree reduction (deterministic run to run, rounding error
~1e-16 relative, i.e. decomposition-dependent only far below the 1e-10 target), and the rank totals are
added exactly; a thermo sample copies 24 bytes to the host.

On GPUs :func:`init` hands the state to a device-resident driver when one applies (``state.resident``):
whole steps, rebuilds included, run as CUDA graphs -- on one GPU on owned atoms only (minimum-image
distances, no ghosts: :mod:`apps.md.resident`), on several GPUs cut into slabs with migration and ghosts
on the device through NCCL (:mod:`apps.md.resident_slab`). :func:`step`, :func:`settle` and
:func:`thermo` delegate to it, and everything else here reads the same state fields.

Checkpoint hook: the whole dynamical state is ``owned_arrays(state)`` (positions, velocities, ids, types,
masses, images of the owned atoms) plus ``state.step`` and ``state.nose_hoover``; :func:`init` rebuilds
everything else (ghosts, neighbour list, forces) from those arrays on any decomposition.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.transport import collectives

from ._arrays import array_module, to_numpy
from .distributed_state import DistributedState, _forces, _NoTimers, check_interval, init, owned_arrays, rebuild, restore
from .integrate import langevin_forces, nose_hoover_half_step, velocity_verlet_first_half, velocity_verlet_second_half
from .neighbors import needs_rebuild
from .potential import tail_corrections
from .reduction import global_sums
from .serial import MDConfig, thermostat_energy_per_atom
from .thermo import Thermo, degrees_of_freedom, kinetic_energy, kinetic_energy_per_atom, thermo_sample
from .watch import first_half_and_watch

# The driver's API; the state record and its construction (init, restore, rebuild) live in
# apps/md/distributed_state.py and are re-exported here for the apps, tests and benchmarks that call them.
__all__ = ["DistributedState", "init", "restore", "rebuild", "check_interval", "owned_arrays", "step", "settle",
           "warm_up", "thermo", "conserved_energy", "checkpoint_payload", "gather_by_id"]


# How one step decides about the neighbour list (see apps.md.watch for the lazy scheme).
_EAGER = "eager"       # check on the host every step (check_interval 1): a sync + allreduce per step
_WATCH = "watch"       # record displacements on the device, do not read them
_VERIFY = "verify"     # record, then read (collective): rebuild now, or report an earlier exceedance
_TRUSTED = "trusted"   # replay of a step known to need no rebuild
_REBUILD = "rebuild"   # replay of the step where the list must be rebuilt


def step(state: DistributedState, config: MDConfig, compute_energy: bool = False, timers=None) -> None:
    """Collective: advance ``state`` by one time step in place (order in the module docstring). Returns None.

    With a lazy rebuild check (``state.watch``, GPU default) the host reads the displacement watch only
    on check steps (always when ``compute_energy``); if an earlier step had already crossed skin/2 the
    steps since the last check are run again from the saved state with the rebuild where it belongs,
    so the result is the one of an every-step check (:mod:`apps.md.watch`).
    """
    timers = timers or _NoTimers()
    if state.resident is not None:   # one GPU: whole steps on the device (apps.md.resident)
        state.resident.step(state, compute_energy, timers)
        return
    watch = state.watch
    if watch is None:
        _advance(state, config, compute_energy, timers, _EAGER)
        return
    target = state.step + 1
    mode = _VERIFY if (compute_energy or target >= watch.next_check) else _WATCH
    first = _advance(state, config, compute_energy, timers, mode)
    if first is not None:
        _replay(state, config, target, first, compute_energy, timers)


def settle(state: DistributedState, config: MDConfig | None = None, timers=None) -> None:
    """Collective: verify the steps run since the last check (replaying them if needed). Returns None.

    Call before using the state outside :func:`step` (thermo, output, checkpoints, the end of a run);
    :func:`thermo`, :func:`gather_by_id` and :func:`checkpoint_payload` call it themselves.
    """
    if state.resident is not None:
        state.resident.settle(state, timers)
        return
    watch = state.watch
    if watch is None or watch.verified_step >= state.step:
        return
    timers = timers or _NoTimers()
    with timers.phase("communication"):
        first, largest = watch.read(state.domain.comm)
    if first > state.step:
        watch.verified(state, largest)
        return
    _replay(state, config or watch.config, state.step, first, state.energy_step == state.step, timers)


def _replay(state, config, target, rebuild_at, compute_energy, timers) -> None:
    """Back to the last verified state, then run to step ``target`` again with the rebuild at ``rebuild_at``."""
    watch = state.watch
    while True:
        watch.restore(state)
        outcome = None
        while state.step < target:
            n = state.step + 1
            last = n == target
            mode = _TRUSTED if n < rebuild_at else _REBUILD if n == rebuild_at else _VERIFY if last else _WATCH
            watch.n_replayed_steps += 1
            outcome = _advance(state, config, compute_energy and last, timers, mode)
            if outcome is not None:
                break
        if outcome is None:
            return
        rebuild_at = outcome   # a later step of the replay crossed skin/2 too: back to that rebuild


def _advance(state, config, compute_energy, timers, mode):
    """One step; returns None, or (``_VERIFY`` only) the earlier step whose exceedance needs a replay."""
    comm = state.domain.comm
    dt = config.dt
    watch = state.watch
    if config.thermostat == "nose_hoover":
        _nose_hoover_scale(state, config, timers)
    new_step = state.step + 1
    on_schedule = new_step % config.rebuild_every == 0
    watching = mode in (_WATCH, _VERIFY) and on_schedule and config.rebuild_check
    graphs = state.graphs
    with timers.phase("compute"):
        if watching and graphs is not None:
            graphs.first_half(state, dt, watch)   # counter -> new_step, first half + watch: one graph launch
        elif watching:
            first_half_and_watch(state.positions, state.velocities, state.forces, state.masses, dt,
                                 state.neighbor_list.reference_positions, watch.threshold_sq, new_step, watch.values)
        else:
            velocity_verlet_first_half(state.positions, state.velocities, state.forces, state.masses, dt)
    state.step = new_step
    largest = None
    if not config.rebuild_check:
        rebuild_now = on_schedule
    elif mode == _EAGER:
        rebuild_now = False
        if on_schedule:
            with timers.phase("compute"):
                moved = needs_rebuild(state.positions, state.neighbor_list)
            with timers.phase("communication"):
                rebuild_now = bool(comm.allreduce(int(moved), "max"))   # any rank's atom => every rank rebuilds
    elif mode == _VERIFY:
        with timers.phase("communication"):
            first, largest = watch.read(comm)
        if first < new_step:
            return first
        rebuild_now = first == new_step
    else:
        rebuild_now = mode == _REBUILD
    if rebuild_now:
        sort = config.sort_every > 0 and (state.n_builds % config.sort_every == 0)
        rebuild(state, config, sort=sort, timers=timers)
        if watch is not None:
            watch.reset(new_step)
            largest = None
    elif graphs is not None and not compute_energy:
        # Ghost refresh, forces, Langevin, second half: one graph launch (timed as compute).
        with timers.phase("compute"):
            graphs.second_half(state, config)
        if watch is not None and mode == _VERIFY:
            watch.verified(state, largest)
        return None
    else:
        with timers.phase("communication"):
            state.ghosts.forward(state.positions)
    # The CPU times the pair forces apart (LAMMPS's "Pair"); the GPU keeps them in "compute".
    with timers.phase("compute" if state.is_gpu else "forces"):
        _forces(state, compute_energy)
    with timers.phase("compute"):
        if config.thermostat == "langevin":
            langevin_forces(state.forces, state.velocities, state.masses, state.atom_ids, config.temperature,
                            config.damping, dt, config.seed, state.step)
        velocity_verlet_second_half(state.velocities, state.forces, state.masses, dt)
    if config.thermostat == "nose_hoover":
        _nose_hoover_scale(state, config, timers)
    if watch is not None and (rebuild_now or mode == _VERIFY):
        watch.verified(state, largest)
    return None

def checkpoint_payload(state: DistributedState) -> tuple[dict, dict]:
    """What a checkpoint holds: ``(particles, replicated)``.

    ``particles`` are this rank's owned atoms in their current order, with the positions at the last
    neighbour-list build (``reference_positions``) and the current forces: a restart rebuilds the very
    same ghosts and neighbour list from the reference positions, then puts back the current positions
    and forces, so it continues bitwise as if never stopped (same rank count).
    """
    settle(state)
    particles = owned_arrays(state)
    particles["reference_positions"] = to_numpy(state.neighbor_list.reference_positions)
    particles["forces"] = to_numpy(state.forces)
    replicated = {"step": state.step, "n_builds": state.n_builds, "n_atoms": state.n_atoms,
                  "nose_hoover": [float(state.nose_hoover.xi), float(state.nose_hoover.eta)],
                  "box": [float(v) for v in state.box]}
    return particles, replicated

def warm_up(state: DistributedState) -> None:
    """Collective: refresh the ghost rows once, before the timed loop.

    The first NCCL send/receive between two GPUs sets up their peer connection, a one-time cost of
    tens to hundreds of milliseconds that would otherwise land in the first step's "communication".
    Harmless to the trajectory: every step refreshes the ghosts after its first half before anything
    reads them, and the thermo of the current step is taken before this call. Nothing to do for the
    device-resident driver (no ghosts, no peers).
    """
    if state.resident is None:
        state.ghosts.forward(state.positions)


def thermo(state: DistributedState, config: MDConfig) -> Thermo:
    """Collective: thermo sample of the current state (sums: see the module docstring).

    On the GPU everything stays on the device but three float64 rank totals (one 24-byte copy).
    """
    settle(state, config)
    if state.energy_step != state.step:
        scratch = array_module(state.forces).empty_like(state.forces)  # keep Langevin-augmented forces intact
        if state.resident is not None:
            state.resident.energy(state, scratch)
        else:
            _forces(state, compute_energy=True, forces=scratch)
    kinetic_terms = kinetic_energy_per_atom(state.velocities, state.masses)
    energy_terms, virial_terms = state.per_atom_energy
    comm = state.domain.comm
    if state.is_gpu:
        xp = array_module(state.velocities)
        # Rank totals by CuPy's fixed-order tree reduction (same bits on every run), then exactly
        # rounded across ranks; one small device-to-host copy instead of the per-atom arrays.
        totals = np.zeros(3)
        if state.n_local:
            totals = xp.stack([kinetic_terms, energy_terms, virial_terms]).sum(axis=1).get()
        columns = [float(v) for v in totals]
    else:
        columns = [kinetic_terms, energy_terms, virial_terms]
    kinetic, pair_energy, virial = global_sums(comm, columns)
    volume = float(np.prod(state.box))
    energy_tail = pressure_tail = 0.0
    if config.tail_correction:
        xp = array_module(state.types)
        counts = to_numpy(xp.bincount(state.types[:state.n_local], minlength=config.potential.n_types))
        counts = comm.allreduce(counts.astype(np.int64))
        energy_tail, pressure_tail = tail_corrections(config.potential, counts, volume)
    return thermo_sample(state.step, kinetic, pair_energy, virial, state.n_atoms, volume, energy_tail, pressure_tail)


def conserved_energy(state: DistributedState, config: MDConfig, sample: Thermo | None = None) -> float:
    """Collective: total energy per atom plus the Nose-Hoover thermostat energy per atom (epsilon)."""
    sample = sample or thermo(state, config)
    return sample.total_energy + thermostat_energy_per_atom(state.nose_hoover, state.n_atoms, config)

def gather_by_id(state: DistributedState, root: int = 0) -> dict | None:
    """Collective: all owned atoms on ``root``, sorted by atom id (None on the other ranks).

    Positions are wrapped into ``[0, L)`` with the image flags updated to match (between rebuilds atoms
    may have drifted out of the box; ``positions + images * box`` is unchanged), so output and checksums
    see one canonical form.
    """
    settle(state)
    merged = _gather_rows(state.domain.comm, owned_arrays(state), root)
    if merged is None:
        return None
    order = np.argsort(merged["atom_ids"], kind="stable")
    merged = {name: values[order] for name, values in merged.items()}
    box = state.box.astype(merged["positions"].dtype)
    crossings = np.floor(merged["positions"] / box)
    positions = merged["positions"] - crossings * box
    at_edge = positions >= box            # rounding can give exactly L: keep the half-open interval
    positions[at_edge] -= np.broadcast_to(box, positions.shape)[at_edge]
    merged["positions"] = positions
    merged["images"] = (merged["images"] + crossings.astype(np.int32) + at_edge.astype(np.int32)).astype(np.int32)
    return merged


def _gather_rows(comm, arrays: dict, root: int) -> dict | None:
    """Collective: each host array of ``arrays`` concatenated over the ranks in rank order on ``root``
    (None elsewhere). The row counts travel as small host values, the rows by MPI Gatherv through the
    host collectives of the job's transport."""
    movers = collectives(comm, on_device=False)
    rows = comm.mpi.allgather([len(values) for values in arrays.values()])   # per rank, per array
    merged = {}
    for number, (name, values) in enumerate(arrays.items()):
        values = np.ascontiguousarray(values)
        per_row = int(np.prod(values.shape[1:], dtype=np.int64))
        counts = [int(rank_rows[number]) * per_row for rank_rows in rows]
        out = None
        if comm.rank == root:
            out = np.empty((sum(rank_rows[number] for rank_rows in rows),) + values.shape[1:], dtype=values.dtype)
        merged[name] = movers.gatherv(values, out, counts, root=root)
    return merged if comm.rank == root else None


def _nose_hoover_scale(state, config, timers):
    with timers.phase("compute"):
        local = kinetic_energy(state.velocities, state.masses)
    with timers.phase("communication"):
        kinetic = state.domain.comm.allreduce(float(local))
    state.nose_hoover, scale = nose_hoover_half_step(state.nose_hoover, kinetic, degrees_of_freedom(state.n_atoms),
                                                     config.temperature, config.damping, config.dt)
    state.velocities *= state.velocities.dtype.type(scale)

"""Device-resident MD steps on one GPU: whole steps, neighbour-list rebuilds included, as CUDA graphs.

At 32,000 atoms a step is some 30 us of GPU work. The default driver (:mod:`apps.md.distributed`) runs
each rebuild from the host (binning, ghost lists, capacity checks: ~1 ms of round trips) and costs
~150 us of Python per step, so the GPU waits most of the time. With one rank on one GPU every decision
can stay on the device, and the step becomes a fixed chain of kernels::

    begin         counter += 1; clear the rebuild flag left by the previous step; zero the cell counts
    first half    v += dt/2 f/m; x += dt v; raise the flag if an atom moved more than skin/2 since the
                  last build (apps.md.watch's kernel: the flag is its "first step exceeded" word)
    bin           [flag] wrap into the box (image flags), reference := positions, append to cell slots
    sort cells    [flag] ascending atom index in every cell (the appends used atomics)
    neighbours    [flag] full list over the 27 periodic neighbour cells, minimum-image distances
    forces        LJ with minimum-image distances (+ per-atom E_pair and W on thermo steps)
    [Langevin]    noise keyed by (seed, step from the device counter, atom id)
    second half   v += dt/2 f/m

Kernels marked [flag] return at once unless the first half raised the flag (in the captured graphs they
also sit in a CUDA graph IF node, :data:`apps.md.chunked_graphs.GRAPH_CONDITIONALS`, skipped as a whole on
steps without a rebuild), so every step launches the same kernels with the same arguments, and a *chunk* of steps
(``check_interval``, 25 by default) is captured once and replayed as one CUDA graph: one host call and
one device-to-host read per chunk. The read of a chunk's control words happens when the next chunk is
launched (or at :meth:`ResidentSteps.settle`), so the host queues the next steps while the GPU runs;
each graph starts by copying what it changes (positions, velocities, forces, images, reference
positions, control words) into snapshot buffers.

No ghost atoms: periodic images come from the minimum-image convention, valid when the box is at least
three cells of ``cutoff + skin`` on every axis (then the 27 neighbour cells are distinct); smaller boxes,
several ranks, Nose-Hoover (a host scalar per step) and rebuild schedules other than "check every step"
use the default driver.

Capacity overflow is never silent: cell slots and the neighbour list have fixed capacities; the kernels
keep counting past them (writing nothing) and record the largest count. When the host reads those
counts after an overflow, it grows the arrays, puts back the snapshot taken at the chunk start,
rebuilds the list that was in force then from its reference positions (same input, same deterministic
kernels: the same list) and runs the chunk again, so results are those of a run that had enough room
from the start.

Results: the physics of the default driver. Neighbour order and the periodic arithmetic (minimum image
instead of ghost coordinates) differ, so thermo agrees with it and with the CPU to rounding (GPU tests:
<= 1e-10 relative over 100 fp64 steps), and runs are bitwise reproducible.
"""

from __future__ import annotations

import math

import numpy as np

from hpcgpu.errors import ConfigurationError

from . import forces, integrate, watch
from ._arrays import THREADS_PER_BLOCK, blocks_for, raw_kernel
from .cells import make_cell_grid
from .chunked_graphs import DEFAULT_CHUNK, ChunkedGraphSteps, _phase, graph_conditionals_here, rebuild_skip
from .forces import compute_forces_periodic, lanes_per_atom
from .integrate import langevin_forces, velocity_verlet_second_half
from .neighbors import GROWTH, NeighborList
from .resident_kernels import _CUDA_SOURCE, _NAMES, _kernel
from .slab_plan import slab_problems
from .watch import NOT_EXCEEDED, first_half_and_watch

#: Control words on the device: builds so far, largest neighbour count, largest cell count.
_BUILDS, _NEIGHBORS_NEEDED, _CELL_NEEDED = range(3)


def cells_per_axis(box, cutoff: float) -> tuple:
    """Periodic cells per axis: as many as fit with edges of at least ``cutoff`` (sigma); the shape of
    :func:`apps.md.cells.make_cell_grid` over the box without a ghost shell."""
    return make_cell_grid(np.zeros(3), box, 0.0, cutoff).shape


def resident_problems(state, config) -> list:
    """Why the device-resident driver cannot run ``state`` (an empty list: it can): one GPU, or several
    cut into slabs (:mod:`apps.md.resident_slab`).

    The same verdict on every rank (it depends on the configuration, the box and the decomposition only).
    """
    problems = []
    if not state.is_gpu:
        problems.append("it needs a GPU (--backend cupy)")
    if config.thermostat not in (None, "langevin"):
        problems.append("Nose-Hoover needs the kinetic energy on the host every step")
    if config.rebuild_every != 1 or not config.rebuild_check:
        problems.append("it checks the skin/2 displacement every step (--rebuild-every 1, no --no-check)")
    if state.domain.comm.size > 1:   # several GPUs: the slab driver's own conditions
        return problems + slab_problems(state, config)
    cells = cells_per_axis(state.box, config.ghost_width)
    if min(cells) < 3:
        problems.append(f"the box must span at least 3 cells of cutoff + skin = {config.ghost_width:g} sigma per "
                        f"axis (minimum image); it spans {cells}")
    return problems


def resident_applies(state, config) -> bool:
    """True if ``state`` runs device-resident: ``config.resident`` True, or None (automatic) and possible.

    Raises ConfigurationError when it is requested (True) but not possible, saying why.
    """
    wanted = getattr(config, "resident", None)
    if wanted is False:
        return False
    problems = resident_problems(state, config)
    if wanted and problems:
        raise ConfigurationError("--resident on cannot be used: " + "; ".join(problems) + ". Use --resident auto.")
    return not problems

class ResidentSteps(ChunkedGraphSteps):
    """Owns the device arrays of the resident driver and runs chunks of steps as CUDA graphs.

    Takes over a :class:`~apps.md.distributed.DistributedState` built by the default driver (owned
    atoms first, its neighbour list built at ``neighbor_list.reference_positions``): the ghost rows are
    dropped, and the list in force is rebuilt with minimum-image distances from the same reference
    positions. ``state.forces`` are kept as they are (a restart continues from the saved forces).

    Parameters
    ----------
    state : DistributedState -- one rank, on the GPU
    config : MDConfig

    Attributes
    ----------
    chunk : int -- steps per graph and per host check
    n_chunks, n_redone, n_captures : int -- chunks run, chunks run again after an overflow, graphs captured
    """

    def __init__(self, state, config):
        import cupy

        self.config = config
        self.chunk = int(config.check_interval) if config.check_interval is not None else DEFAULT_CHUNK
        n = state.n_local
        dtype = state.positions.dtype
        self.real = dtype.type
        self.box = np.asarray(state.box, dtype=np.float64)
        self.cutoff = float(config.ghost_width)
        self.cells = cells_per_axis(self.box, self.cutoff)
        self.n_cells = int(np.prod(self.cells))
        state.positions = cupy.ascontiguousarray(state.positions[:n])
        state.types = cupy.ascontiguousarray(state.types[:n])
        self.reference = cupy.array(state.neighbor_list.reference_positions, copy=True)
        mean_per_cell = n / self.n_cells
        self.cell_capacity = int(math.ceil(1.5 * mean_per_cell)) + 8
        self.neighbor_capacity = int(state.neighbor_list.capacity)
        self.cell_count = cupy.zeros(self.n_cells, dtype=cupy.int32)
        self.cell_atoms = cupy.empty(self.n_cells * self.cell_capacity, dtype=cupy.int32)
        self.neighbors = cupy.empty((self.neighbor_capacity, n), dtype=cupy.int32)
        self.counts = cupy.zeros(n, dtype=cupy.int32)
        self.watch = cupy.asarray(np.array([NOT_EXCEEDED, 0], dtype=np.int32))
        self._skip = rebuild_skip(None, self.watch)   # plain launches outside a capture
        self.control = cupy.zeros(3, dtype=cupy.int32)
        self.counter = cupy.full(1, state.step, dtype=cupy.int64)
        self.per_atom = cupy.zeros((2, n), dtype=cupy.float64)
        # Threads per atom: the force kernel's share an atom's neighbours; the build uses a whole warp per
        # atom then (no diverging groups inside a warp), one thread per atom for large systems.
        self.lanes = lanes_per_atom(n)
        self.build_lanes = 32 if self.lanes > 1 else 1
        self.builds_base = int(state.n_builds)
        self.reallocations = 0
        self.pending = 0
        self.n_chunks = self.n_redone = self.n_captures = 0
        self._state = state    # the state whose arrays the chunks change (snapshot and restore)
        self._unverified = None   # (first step, steps, energy on the last, step after) of the chunk not yet checked
        self._saved = {name: array.copy() for name, array in self._state_arrays().items()}
        self._graphs = {}
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._load_kernels(dtype)
        self._build_from_reference(state)
        # Capture the usual chunks now (setup), not in the first steps: a capture costs milliseconds of
        # Python while the GPU waits.
        for energy_last in (False, True):
            self._graph(self.chunk, energy_last)

    # -- the host-side step ----------------------------------------------------------------------
    def _chunk_launched(self, state, energy_last: bool) -> None:
        if energy_last:
            state.per_atom_energy, state.energy_step = (self.per_atom[0], self.per_atom[1]), state.step

    def _verify(self, state, timers=None) -> None:
        """Read the control words of the last launched chunk; after an overflow, grow and run it again."""
        if self._unverified is None:
            return
        start_step, n_steps, energy_last, _ = self._unverified
        while True:
            control = self.control.get()   # waits for the chunk: the one synchronisation per chunk
            if control[_NEIGHBORS_NEEDED] <= self.neighbor_capacity and control[_CELL_NEEDED] <= self.cell_capacity:
                break
            self.n_redone += 1
            self._grow(control)
            self._restore(start_step)
            self._build_from_reference(state)
            with _phase(timers, "compute"):
                self._launch(state, n_steps, energy_last)
        self._unverified = None
        state.n_builds = self.builds_base + int(control[_BUILDS])
        state.n_reallocations = self.reallocations

    def energy(self, state, forces) -> None:
        """Per-atom E_pair and W of the current positions (into ``state.per_atom_energy``); forces into
        ``forces`` (a scratch array: the state's forces may carry Langevin terms)."""
        self.settle(state)
        compute_forces_periodic(state.positions, state.types, state.neighbor_list, state.pair_table, forces,
                                self.box, per_atom=self.per_atom, lanes=self.lanes)
        state.per_atom_energy, state.energy_step = (self.per_atom[0], self.per_atom[1]), state.step

    def summary(self) -> dict:
        return {"chunk": self.chunk, "chunks": self.n_chunks, "chunks_redone": self.n_redone, "lanes_per_atom": self.lanes,
                "graphs_captured": self.n_captures, "cells": list(self.cells), "cell_capacity": self.cell_capacity,
                "graph_conditionals": graph_conditionals_here()}

    # -- kernels -----------------------------------------------------------------------------------
    def _load_kernels(self, dtype) -> None:
        """Compile and load every kernel a graph holds now: no module loading while a stream captures."""
        real = "float" if np.dtype(dtype) == np.float32 else "double"
        for name in _NAMES:
            if "<" not in name or name.endswith(f"<{real}>"):
                raw_kernel(_CUDA_SOURCE, _NAMES, name)
        raw_kernel(watch._CUDA_SOURCE, watch._NAMES, f"md_first_half_watch<{real}>")
        raw_kernel(forces._CUDA_SOURCE, forces._NAMES, f"md_lj_forces<{real}>")
        for name in ("md_langevin", "md_second_half"):
            raw_kernel(integrate._CUDA_SOURCE, integrate._NAMES, f"{name}<{real}>")

    def _geometry(self):
        real = self.real
        box = tuple(real(v) for v in self.box)
        per_length = tuple(real(c / v) for c, v in zip(self.cells, self.box))
        return box, per_length, tuple(np.int32(c) for c in self.cells)

    def _rebuild_if_flagged(self, state, wrap: bool, count_build: bool) -> None:
        """Queue bin -> sort cells -> neighbours (each returns at once unless the watch flag is raised)."""
        n = state.n_local
        box, per_length, shape = self._geometry()
        _kernel("md_resident_bin", state.positions.dtype)(
            (blocks_for(n),), (THREADS_PER_BLOCK,),
            (state.positions, state.images, self.reference, np.int32(n), np.int32(wrap), *box, *per_length, *shape,
             self.cell_count, self.cell_atoms, np.int32(self.cell_capacity), self.watch, self.control))
        _kernel("md_resident_sort_cells")(
            (blocks_for(32 * self.n_cells),), (THREADS_PER_BLOCK,),
            (self.watch, self.cell_count, np.int32(self.n_cells), np.int32(self.cell_capacity), self.cell_atoms))
        inverse = tuple(self.real(1.0 / v) for v in self.box)
        _kernel("md_resident_neighbors", state.positions.dtype)(
            (blocks_for(n * self.build_lanes),), (THREADS_PER_BLOCK,),
            (self.reference, np.int32(n), *box, *inverse, *per_length, *shape, self.cell_count, self.cell_atoms,
             np.int32(self.cell_capacity), self.real(self.cutoff * self.cutoff), np.int32(self.neighbor_capacity),
             self.neighbors, self.counts, self.watch, self.control, np.int32(count_build),
             np.int32(self.build_lanes.bit_length() - 1), *(self.real(0),) * 3, np.int32(7), np.uint64(0)))

    def _record_step(self, energy: bool) -> None:
        """Queue one whole step of the state taken over (the chain in the module docstring)."""
        config, state = self.config, self._state
        _kernel("md_resident_begin")((blocks_for(max(self.n_cells, 1)),), (THREADS_PER_BLOCK,),
                                     (self.counter, self.watch, self.cell_count, np.int32(self.n_cells)))
        first_half_and_watch(state.positions, state.velocities, state.forces, state.masses, config.dt, self.reference,
                             (0.5 * config.skin) ** 2, 0, self.watch, step_counter=self.counter)
        with self._skip.body():
            self._rebuild_if_flagged(state, wrap=True, count_build=True)
        compute_forces_periodic(state.positions, state.types, state.neighbor_list, state.pair_table, state.forces,
                                self.box, per_atom=self.per_atom if energy else None, lanes=self.lanes)
        if config.thermostat == "langevin":
            langevin_forces(state.forces, state.velocities, state.masses, state.atom_ids, config.temperature,
                            config.damping, config.dt, config.seed, 0, step_counter=self.counter)
        velocity_verlet_second_half(state.velocities, state.forces, state.masses, config.dt)

    # -- builds, overflow and redo -----------------------------------------------------------------
    def _build_from_reference(self, state) -> None:
        """Build the list of the reference positions now (not counted as a rebuild), growing until it fits."""
        while True:
            self.cell_count.fill(0)
            self.watch[0] = 0   # raise the flag: the [flag] kernels run
            self.control[_NEIGHBORS_NEEDED] = 0
            self.control[_CELL_NEEDED] = 0
            self._rebuild_if_flagged(state, wrap=False, count_build=False)
            self.watch[0] = NOT_EXCEEDED
            control = self.control.get()
            if control[_NEIGHBORS_NEEDED] <= self.neighbor_capacity and control[_CELL_NEEDED] <= self.cell_capacity:
                break
            self._grow(control)
        state.neighbor_list = NeighborList(neighbors=self.neighbors, counts=self.counts, cutoff=self.cutoff,
                                           skin=float(self.config.skin), reference_positions=self.reference,
                                           n_reallocations=self.reallocations)

    def _grow(self, control) -> None:
        """Larger neighbour and/or cell arrays after an overflow (graphs hold the old pointers: dropped)."""
        import cupy

        n = self.counts.shape[0]
        if control[_NEIGHBORS_NEEDED] > self.neighbor_capacity:
            self.neighbor_capacity = int(math.ceil(control[_NEIGHBORS_NEEDED] * GROWTH)) + 8
            self.neighbors = cupy.empty((self.neighbor_capacity, n), dtype=cupy.int32)
        if control[_CELL_NEEDED] > self.cell_capacity:
            self.cell_capacity = int(math.ceil(control[_CELL_NEEDED] * GROWTH)) + 8
            self.cell_atoms = cupy.empty(self.n_cells * self.cell_capacity, dtype=cupy.int32)
        self.reallocations += 1
        self._graphs.clear()

    def _record_save(self) -> None:
        """Queue copies of what a chunk changes into the snapshot buffers (the first nodes of each graph)."""
        for name, array in self._state_arrays().items():
            self._saved[name].data.copy_from_device_async(array.data, array.nbytes)

    def _restore(self, start_step: int) -> None:
        for name, array in self._state_arrays().items():
            array[...] = self._saved[name]
        self.counter.fill(start_step)
        self.watch[0] = NOT_EXCEEDED

    def _state_arrays(self) -> dict:
        state = self._state
        return {"positions": state.positions, "velocities": state.velocities, "forces": state.forces,
                "images": state.images, "reference": self.reference, "control": self.control}

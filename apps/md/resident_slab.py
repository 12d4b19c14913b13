"""Device-resident MD steps on several GPUs cut into slabs: migration and ghosts on the device, as graphs.

The one-GPU driver (:mod:`apps.md.resident`) keeps every decision on the device. With several ranks the
default driver (:mod:`apps.md.distributed`) takes the host into every rebuild (migration and ghost lists
through MPI) and every step (ghost refresh launches), and 2 GPUs ran at about half the speed of one.
Here the ranks cut the box along ONE axis (``--dims P,1,1`` or a permutation: slabs), and a whole step is
again a fixed chain of kernels and NCCL calls, captured once and replayed as a CUDA graph::

    begin          counter += 1; clear the rebuild flag; zero the cell counts
    first half     v += dt/2 f/m; x += dt v; raise the flag if an owned atom moved > skin/2 (watch)
    allreduce      NCCL min of the flag word: every rank rebuilds when any rank must
    classify       [flag] wrap into the box; stays / leaves low / leaves high, counted per block
    scan, scatter  [flag] the leaving rows, in row order (stable compaction: deterministic)
    pack, fill     [flag] leaving atoms into the migrant messages; staying tail rows fill their gaps
    exchange       [flag] migrant messages to both slab neighbours (the count travels inside)
    unpack         [flag] arrivals appended after the staying atoms; the owned count on the device
    select         [flag] owned atoms within cutoff + skin of each slab face -> ghost send lists
    pack ghosts    positions (+ a box length across the periodic boundary) and types of the send lists
    exchange       into the ghost rows of the neighbours (every step: refresh or new ghosts)
    bin, sort      [flag] owned + ghost rows into the cells of the slab plus its ghost shells
    neighbours     [flag] full list; minimum image on the two undivided (periodic) axes
    forces, [Langevin], second half   on the owned rows (the owned count read on the device)

Kernels marked [flag] return at once on steps without a rebuild; in the captured graphs they also sit in
IF nodes (CUDA 12.4+ conditional nodes, :mod:`hpcgpu.runtime.graph_conditional`), each after a one-thread
kernel that opens it only on rebuild steps, so a quiet step does not pay a node launch for each of
them (with the NCCL exchange the migration chain stays outside: its NCCL calls run every step).

The two exchanges (``MDConfig.exchange``): **peer** (default when every rank is on one node) -- the pack
kernels store the ghost rows and migrant records straight into the neighbours' arrays, mapped with CUDA
IPC, then a one-thread kernel raises a flag in each neighbour's memory and another waits for the
neighbours' flags (monotonic sequence numbers; a wait gives up after PEER_TIMEOUT_SECONDS and the host
raises). Only the atoms that move cross NVLink, and a step without a rebuild sends no migrant bytes.
No buffer is overwritten early: a neighbour writes this rank's ghost rows and migrant buffer for step n
only after the flag allreduce of step n, which this rank joins after its forces (the last reader) of step
n - 1. **nccl** -- NCCL send/receive of fixed-size messages (their capacity; the counts travel inside),
every step, for ranks on several nodes. Both move the same bytes into the same rows: the same results,
bit for bit. Arrays have fixed capacities (owned rows, ghost rows per side,
migrants per side, cell slots, list length); kernels record what they would have needed, the host reads
those words once per chunk (one MPI allreduce of eight integers), and after an overflow on ANY rank every
rank puts back the snapshot taken at the chunk start, grows what was short (message sizes on all ranks
alike), rebuilds the list in force from the saved reference positions (ghost rows keep theirs) and runs
the chunk again: the result is that of a run that had room from the start. Chunks are checked one
behind, as on one GPU.

Results: the physics of the default driver; the list order follows the row order here (staying rows keep
their order, arrivals follow in the senders' order), so thermo agrees with one rank and with the CPU to
rounding (GPU tests: <= 1e-10 relative over 100 fp64 steps) and runs are bitwise reproducible.

Kernels: :mod:`apps.md.resident_slab_kernels`; shared with one GPU: begin, sort, neighbours
(:mod:`apps.md.resident`), first half + watch, forces, Langevin, second half (each reads the owned count
from the device word ``words[W_OWNED]``).
"""

from __future__ import annotations

import atexit
import math
import weakref

import numpy as np

from hpcgpu.runtime.capture import when_not_capturing

from . import resident_slab_kernels
from ._arrays import THREADS_PER_BLOCK, blocks_for, raw_kernel
from .cells import make_cell_grid
from .forces import lanes_per_atom
from .neighbors import GROWTH, NeighborList
from .resident import DEFAULT_CHUNK, ChunkedGraphSteps, _phase, graph_conditionals_here, rebuild_skip
from .watch import NOT_EXCEEDED

#: Device words (``words`` array; the kernels' #defines): see resident_slab_kernels.
W_BUILDS, W_NEIGHBORS_NEEDED, W_CELL_NEEDED, W_OWNED_NEEDED, W_GHOSTS_NEEDED, W_MIGRANTS_NEEDED, W_LOST, \
    W_PEER_TIMEOUT = range(8)
W_OWNED, W_STAY, W_SEND, W_LEAVE, W_LEAVE_ALL, W_RECEIVED = 8, 9, 10, 12, 14, 16
N_WORDS = 20
#: Doubles per migrant record (x y z vx vy vz m ix iy iz id type).
MIGRANT_WORDS = 12
#: Threads per block of the compaction kernels (their TILE) and the most blocks they use.
TILE, MAX_BLOCKS = 256, 1024
#: Tests set {"rows": .., "ghost_rows": .., "migrants": ..} to start below what a run needs (overflow redo).
INITIAL_CAPACITIES = None
#: Peer exchange: a wait kernel gives up after this many seconds without its neighbours' signal.
PEER_TIMEOUT_SECONDS = 60.0
#: Peer exchange flags and sequence numbers (uint64 words): migrants from low / high, ghosts from low / high;
#: sequences: migrants sent / expected, ghosts sent / expected.
F_MIGRANTS, F_GHOSTS = 0, 2


def slab_axis(domain) -> int | None:
    """The axis the ranks divide (dims ``P`` there and 1 on the others), or None if not slabs."""
    divided = [axis for axis, d in enumerate(domain.dims) if d > 1]
    return divided[0] if len(divided) == 1 else None


def slab_problems(state, config) -> list:
    """Why the slab driver cannot run ``state`` on several ranks (an empty list: it can). Same on every rank."""
    from hpcgpu.transport.nccl import nccl_available

    domain = state.domain
    problems = []
    axis = slab_axis(domain)
    if axis is None:
        problems.append(f"several ranks need a slab decomposition (ranks on one axis only, e.g. --dims "
                        f"{domain.comm.size},1,1); this one is {'x'.join(map(str, domain.dims))}")
    if state.is_gpu and not nccl_available():
        problems.append("several GPUs need NCCL (cupy.cuda.nccl)")
    width = config.ghost_width
    for other in range(3):
        if other == axis:
            continue
        if math.floor(state.box[other] / width) < 3:
            problems.append(f"the box must span at least 3 cells of cutoff + skin = {width:g} sigma on the undivided "
                            f"axes (minimum image); axis {'xyz'[other]} is {state.box[other]:g} sigma")
    if axis is not None and state.box[axis] / domain.dims[axis] < width:
        problems.append(f"each slab must be at least cutoff + skin = {width:g} sigma thick; it is "
                        f"{state.box[axis] / domain.dims[axis]:g}")
    return problems


def _kernel(name, dtype=None):
    source, names = resident_slab_kernels._CUDA_SOURCE, resident_slab_kernels._NAMES
    if dtype is None:
        return raw_kernel(source, names, name)
    real = "float" if np.dtype(dtype) == np.float32 else "double"
    return raw_kernel(source, names, f"{name}<{real}>")


class SlabResidentSteps(ChunkedGraphSteps):
    """Owns the fixed-capacity device arrays of one slab and runs chunks of steps as CUDA graphs.

    Takes over a :class:`~apps.md.distributed.DistributedState` built by the default driver (owned atoms
    first, their positions at the last build in ``neighbor_list.reference_positions``): the ghosts of that
    build are exchanged again from the reference positions and the list in force is rebuilt from them;
    positions, velocities and forces are kept (a restart continues bitwise). Collective (NCCL set-up).

    After every verified chunk the state's arrays are views of the first ``n_owned`` rows (positions,
    velocities, forces, masses, types, atom_ids, images; ``state.n_local`` the owned count), so thermo,
    output and checkpoints read them as they read the default driver's.
    """

    def __init__(self, state, config):
        import cupy

        from hpcgpu.transport.nccl import nccl_communicator

        self.config = config
        self.chunk = int(config.check_interval) if config.check_interval is not None else DEFAULT_CHUNK
        domain = state.domain
        self.comm = domain.comm
        self.nccl = nccl_communicator(self.comm)
        self.axis = axis = slab_axis(domain)
        dtype = state.positions.dtype
        self.real = dtype.type
        self.box = np.asarray(state.box, dtype=np.float64)
        self.width = float(config.ghost_width)
        n_slabs, coordinate = domain.dims[axis], domain.coords[axis]
        neighbour_coordinate = {"low": (coordinate - 1) % n_slabs, "high": (coordinate + 1) % n_slabs}
        offsets = {"low": (-1, 0, 0), "high": (1, 0, 0)}
        self.peer = {}
        for side, offset in offsets.items():
            offset = tuple(int(v) for v in np.roll(offset, axis))
            self.peer[side] = next(n.rank for n in domain.neighbors if n.offset == offset)
        edges = domain.edges[axis]
        self.bounds = tuple(self.real(v) for v in (
            edges[coordinate], edges[coordinate + 1],
            edges[neighbour_coordinate["low"]], edges[neighbour_coordinate["low"] + 1],
            edges[neighbour_coordinate["high"]], edges[neighbour_coordinate["high"] + 1]))
        lower, upper = float(edges[coordinate]), float(edges[coordinate + 1])
        self.ghost_limits = (self.real(lower + self.width), self.real(upper - self.width))
        self.shifts = (self.real(self.box[axis] if coordinate == 0 else 0.0),
                       self.real(-self.box[axis] if coordinate == n_slabs - 1 else 0.0))
        # Cell grid: the slab plus a ghost shell of one cutoff + skin on the divided axis, the box elsewhere.
        slab_grid = make_cell_grid(domain.subbox.lower, domain.subbox.upper, self.width, self.width)
        box_grid = make_cell_grid(np.zeros(3), self.box, 0.0, self.width)
        self.origin = np.array([slab_grid.origin[a] if a == axis else 0.0 for a in range(3)])
        self.cells = tuple(int(slab_grid.shape[a] if a == axis else box_grid.shape[a]) for a in range(3))
        self.cell_size = np.array([(slab_grid if a == axis else box_grid).cell_size[a] for a in range(3)])
        self.n_cells = int(np.prod(self.cells))
        # Capacities (the same on every rank where messages depend on them).
        n = state.n_local
        largest = int(self.comm.allreduce(n, "max"))
        per_length = state.n_atoms / self.box[axis]   # atoms per sigma along the divided axis
        first_guess = {"rows": int(1.15 * largest) + 256, "ghost_rows": int(1.3 * per_length * self.width) + 256,
                       "migrants": max(int(per_length * 0.5 * config.skin), self._near_faces(state, config.skin))
                       + 256}
        first_guess.update(INITIAL_CAPACITIES or {})
        self.row_capacity = max(int(first_guess["rows"]), largest)
        self.ghost_capacity = int(first_guess["ghost_rows"])
        self.migrant_capacity = int(first_guess["migrants"])
        self.cell_capacity = int(math.ceil(1.5 * (largest + 2 * per_length * self.width) / self.n_cells)) + 8
        self.neighbor_capacity = int(state.neighbor_list.capacity)
        self.lanes = lanes_per_atom(largest)
        self.build_lanes = 32 if self.lanes > 1 else 1
        self.builds_base = int(state.n_builds)
        self.reallocations = 0
        self.pending = 0
        self.n_chunks = self.n_redone = self.n_captures = 0
        self._unverified = None
        self._graphs = {}
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._state = state
        self.counter = cupy.full(1, state.step, dtype=cupy.int64)
        self.watch = cupy.asarray(np.array([NOT_EXCEEDED, 0], dtype=np.int32))
        self._skip = rebuild_skip(None, self.watch)   # plain launches outside a capture
        self._allocate_atoms(state, n)
        self._allocate_lists()
        self._load_kernels(dtype)
        self.peer_flags = cupy.zeros(4, dtype=cupy.uint64)      # written by the neighbours only
        self.peer_sequence = cupy.zeros(4, dtype=cupy.uint64)   # this rank's counts of signals and waits
        self.peer_exchange = self._choose_exchange(config.exchange)
        self._nccl_warm_up()
        self._initial_ghosts_and_list()
        self._publish(state, int(n))
        for energy_last in (False, True):
            self._graph(self.chunk, energy_last)
        _LIVE.add(self)

    def _near_faces(self, state, distance: float) -> int:
        """Collective: the most owned atoms within ``distance`` of one slab face, over faces and ranks.

        A lattice start puts whole lattice planes on the slab faces: about half of such a plane crosses at
        the first rebuild, several times the migrants of a liquid (and a chunk redone, graphs captured
        again, if the messages were sized for a liquid)."""
        edges, coordinate = state.domain.edges[self.axis], state.domain.coords[self.axis]
        lower, upper = float(edges[coordinate]), float(edges[coordinate + 1])
        along = state.positions[:state.n_local, self.axis]
        near = max(int((along < lower + distance).sum()), int((along >= upper - distance).sum()))
        return int(self.comm.allreduce(near, "max"))

    # -- the host-side step, the chunks' graphs: ChunkedGraphSteps (collective here) -------------------------
    def energy(self, state, forces) -> None:
        """Per-atom E_pair and W of the current positions into ``state.per_atom_energy``.

        ``forces`` (the caller's owned-rows scratch) is not used: the kernel writes a row-capacity array of
        its own, ``_scratch_forces``, and the state's forces (Langevin terms included) stay as they are."""
        self.settle(state)
        self._forces(self._scratch_forces, energy=True)
        n = state.n_local
        state.per_atom_energy, state.energy_step = (self.per_atom[0, :n], self.per_atom[1, :n]), state.step

    def close(self) -> None:
        """Drop the graphs once the device has finished them (they hold NCCL operations: they must go while
        the NCCL communicator lives, not in the interpreter's teardown). Also run for every live instance at
        exit, and by the finaliser. While another driver captures a graph, the device synchronisation this
        needs would break that capture: the graphs are then dropped right after it
        (:func:`hpcgpu.runtime.capture.when_not_capturing`)."""
        graphs, self._graphs = self._graphs, {}
        if graphs:
            stream = self.__dict__.get("_stream")   # and its stream, when the finaliser is letting it go too
            when_not_capturing(lambda: _drop_after_device(graphs, stream))

    def __del__(self):
        # NCCL waits in ncclCommDestroy for the graphs that captured its operations; when this object and
        # the communicator become garbage together (the state and this object refer to each other), the
        # finaliser runs first and the graphs go before the communicator. The garbage collector may run it
        # in the middle of another instance's capture: close() then waits for that capture's end.
        try:
            self.close()
        except Exception:   # noqa: BLE001 -- interpreter teardown: CuPy may be gone already
            pass

    def summary(self) -> dict:
        return {"driver": "slab", "axis": "xyz"[self.axis], "exchange": "peer" if self.peer_exchange else "nccl",
                "chunk": self.chunk, "chunks": self.n_chunks, "graph_conditionals": graph_conditionals_here(),
                "chunks_redone": self.n_redone, "lanes_per_atom": self.lanes, "graphs_captured": self.n_captures,
                "cells": list(self.cells), "capacities": {
                    "rows": self.row_capacity, "ghost_rows_per_side": self.ghost_capacity,
                    "migrants_per_side": self.migrant_capacity, "cell": self.cell_capacity,
                    "neighbors": self.neighbor_capacity}}

    # -- verification, overflow and redo ----------------------------------------------------------------
    def _verify(self, state, timers=None) -> None:
        if self._unverified is None:
            return
        start_step, n_steps, energy_last, end_step = self._unverified
        while True:
            words = self.words.get()   # waits for the chunk
            needed = self._needed(words)
            with _phase(timers, "communication"):
                needed = self._global_max(needed)
            self._check_peer_timeout(needed)
            if not self._overflowed(needed):
                if needed[6] > 0:   # after an overflow the chunk is redone: only a chunk that fitted counts
                    from hpcgpu.errors import ConfigurationError

                    raise ConfigurationError(f"{int(needed[6])} atom(s) moved further than a neighbouring slab "
                                             "between two neighbour-list builds (a blown-up run: check dt and the "
                                             "initial state)")
                break
            self.n_redone += 1
            self._restore(start_step)
            self._grow(needed)
            self._build_from_reference()
            with _phase(timers, "compute"):
                self._launch(state, n_steps, energy_last)
        self._unverified = None
        self._publish(state, int(words[W_OWNED]))
        state.n_builds = self.builds_base + int(words[W_BUILDS])
        if energy_last:
            n = state.n_local
            state.per_atom_energy, state.energy_step = (self.per_atom[0, :n], self.per_atom[1, :n]), end_step

    def _needed(self, words) -> np.ndarray:
        """[neighbours, cell slots, rows, ghost rows, migrants, 0, lost, peer wait timed out]: what this rank's
        chunk needed beyond its capacities (0 where it fitted), atoms lost, a failed peer exchange."""
        needed = np.zeros(8, dtype=np.int64)
        if words[W_NEIGHBORS_NEEDED] > self.neighbor_capacity:
            needed[0] = words[W_NEIGHBORS_NEEDED]
        if words[W_CELL_NEEDED] > self.cell_capacity:
            needed[1] = words[W_CELL_NEEDED]
        needed[2], needed[3], needed[4] = words[W_OWNED_NEEDED], words[W_GHOSTS_NEEDED], words[W_MIGRANTS_NEEDED]
        needed[6], needed[7] = words[W_LOST], words[W_PEER_TIMEOUT]
        return needed

    def _global_max(self, needed) -> np.ndarray:
        """Collective: the element-wise largest of every rank's ``needed`` (int64, shape (8,))."""
        from mpi4py import MPI

        self.comm.mpi.Allreduce(MPI.IN_PLACE, needed, op=MPI.MAX)
        return needed

    @staticmethod
    def _check_peer_timeout(needed) -> None:
        if needed[7] > 0:
            from hpcgpu.errors import HaloError

            raise HaloError(f"a slab neighbour's signal did not come within {PEER_TIMEOUT_SECONDS:g} s (peer "
                            "exchange over CUDA IPC); rerun with --exchange nccl and report this")

    @staticmethod
    def _overflowed(needed) -> bool:
        return bool(np.any(needed[:5] > 0))

    def _grow(self, needed) -> None:
        """Larger arrays for what overflowed (rows, ghost rows and migrants: the same sizes on every rank)."""
        import cupy

        grown = lambda count: int(math.ceil(count * GROWTH)) + 8  # noqa: E731
        if needed[0] > self.neighbor_capacity:
            self.neighbor_capacity = grown(needed[0])
        if needed[1] > self.cell_capacity:
            self.cell_capacity = grown(needed[1])
        rows = max(self.row_capacity, grown(needed[2]) if needed[2] else 0)
        ghosts = max(self.ghost_capacity, grown(needed[3]) if needed[3] else 0)
        migrants = max(self.migrant_capacity, grown(needed[4]) if needed[4] else 0)
        if (rows, ghosts) != (self.row_capacity, self.ghost_capacity):
            self._relayout(rows, ghosts)
        self.migrant_capacity = migrants
        self._allocate_lists()
        self.reallocations += 1
        self._graphs.clear()
        cupy.cuda.get_current_stream().synchronize()
        if self.peer_exchange:
            self._map_peers()   # collective: every rank grows at once

    def _relayout(self, rows: int, ghosts: int) -> None:
        """Copy the atom arrays into larger ones: owned rows stay, each ghost segment moves to its new start."""
        import cupy

        old_rows, old_ghosts = self.row_capacity, self.ghost_capacity
        for name in ("positions", "reference", "types"):
            old = getattr(self, name)
            new = cupy.zeros((rows + 2 * ghosts,) + old.shape[1:], dtype=old.dtype)
            new[:old_rows] = old[:old_rows]
            for side in range(2):
                new[rows + side * ghosts:rows + side * ghosts + old_ghosts] = \
                    old[old_rows + side * old_ghosts:old_rows + (side + 1) * old_ghosts]
            setattr(self, name, new)
        for name in ("velocities", "forces", "masses", "images", "atom_ids"):
            old = getattr(self, name)
            new = cupy.zeros((rows,) + old.shape[1:], dtype=old.dtype)
            new[:old_rows] = old
            setattr(self, name, new)
        for name in ("send_low", "send_high"):
            old = getattr(self, name)
            new = cupy.zeros(ghosts, dtype=cupy.int32)
            new[:old_ghosts] = old
            setattr(self, name, new)
        self.row_capacity, self.ghost_capacity = rows, ghosts
        self._saved = {name: array.copy() for name, array in self._snapshot_arrays().items()}
        self._scratch_forces = cupy.zeros_like(self.forces)
        self.per_atom = cupy.zeros((2, rows), dtype=cupy.float64)
        self.masks = cupy.zeros(rows, dtype=cupy.int32)

    # -- arrays ------------------------------------------------------------------------------------------
    def _allocate_atoms(self, state, n: int) -> None:
        import cupy

        rows, ghosts = self.row_capacity, self.ghost_capacity
        dtype = state.positions.dtype
        self.positions = cupy.zeros((rows + 2 * ghosts, 3), dtype=dtype)
        self.reference = cupy.zeros((rows + 2 * ghosts, 3), dtype=dtype)
        self.types = cupy.zeros(rows + 2 * ghosts, dtype=cupy.int32)
        self.velocities = cupy.zeros((rows, 3), dtype=dtype)
        self.forces = cupy.zeros((rows, 3), dtype=dtype)
        self.masses = cupy.ones(rows, dtype=dtype)
        self.images = cupy.zeros((rows, 3), dtype=cupy.int32)
        self.atom_ids = cupy.zeros(rows, dtype=cupy.int64)
        self.positions[:n] = state.positions[:n]
        self.reference[:n] = state.neighbor_list.reference_positions[:n]
        self.types[:n] = state.types[:n]
        self.velocities[:n] = state.velocities[:n]
        self.forces[:n] = state.forces[:n]
        self.masses[:n] = state.masses[:n]
        self.images[:n] = state.images[:n]
        self.atom_ids[:n] = state.atom_ids[:n]
        self.send_low = cupy.zeros(ghosts, dtype=cupy.int32)
        self.send_high = cupy.zeros(ghosts, dtype=cupy.int32)
        self.words = cupy.zeros(N_WORDS, dtype=cupy.int32)
        self.words[W_OWNED] = n
        self.masks = cupy.zeros(rows, dtype=cupy.int32)
        self.per_atom = cupy.zeros((2, rows), dtype=cupy.float64)
        self._scratch_forces = cupy.zeros_like(self.forces)
        self._saved = {name: array.copy() for name, array in self._snapshot_arrays().items()}

    def _allocate_lists(self) -> None:
        """Cell slots, neighbour list, compaction and message buffers at the current capacities."""
        import cupy

        rows = self.row_capacity
        self.n_blocks = min(MAX_BLOCKS, max(1, -(-rows // TILE)))
        self.block_counts = cupy.zeros(4 * self.n_blocks, dtype=cupy.int32)
        self.leaving_low = cupy.zeros(self.migrant_capacity, dtype=cupy.int32)
        self.leaving_high = cupy.zeros(self.migrant_capacity, dtype=cupy.int32)
        self.leaving = cupy.zeros(2 * self.migrant_capacity, dtype=cupy.int32)
        message = 1 + MIGRANT_WORDS * self.migrant_capacity
        self.migrants_out = cupy.zeros((2, message), dtype=cupy.float64)
        self.migrants_in = cupy.zeros((2, message), dtype=cupy.float64)
        self.ghost_positions_out = cupy.zeros((2, self.ghost_capacity, 3), dtype=self.positions.dtype)
        self.ghost_types_out = cupy.zeros((2, self.ghost_capacity), dtype=cupy.int32)
        self.ghost_counts_out = cupy.zeros(2, dtype=cupy.int32)
        self.cell_count = cupy.zeros(self.n_cells, dtype=cupy.int32)
        self.cell_atoms = cupy.zeros(self.n_cells * self.cell_capacity, dtype=cupy.int32)
        self.neighbors = cupy.zeros((self.neighbor_capacity, rows), dtype=cupy.int32)
        self.counts = cupy.zeros(rows, dtype=cupy.int32)

    def _snapshot_arrays(self) -> dict:
        return {name: getattr(self, name) for name in (
            "positions", "reference", "types", "velocities", "forces", "masses", "images", "atom_ids",
            "send_low", "send_high", "words")}

    def _publish(self, state, n: int) -> None:
        """Point the state at the first ``n`` rows (the owned atoms) of the arrays."""
        state.n_local = n
        for name in ("positions", "velocities", "forces", "masses", "types", "atom_ids", "images"):
            setattr(state, name, getattr(self, name)[:n])
        state.n_reallocations = self.reallocations
        state.neighbor_list = NeighborList(neighbors=self.neighbors, counts=self.counts[:n], cutoff=self.width,
                                           skin=float(self.config.skin), reference_positions=self.reference[:n],
                                           n_reallocations=self.reallocations)

    def _restore(self, start_step: int) -> None:
        for name, array in self._snapshot_arrays().items():
            array[...] = self._saved[name]
        self.counter.fill(start_step)
        self.watch[0] = NOT_EXCEEDED

    # -- kernels -------------------------------------------------------------------------------------------
    def _load_kernels(self, dtype) -> None:
        """Compile and load every kernel a graph holds now: no module loading while a stream captures."""
        from . import forces, integrate, resident, watch

        real = "float" if np.dtype(dtype) == np.float32 else "double"
        for name in resident_slab_kernels._NAMES:
            if "<" not in name or name.endswith(f"<{real}>"):
                _kernel(name.split("<")[0], dtype if "<" in name else None)
        for name in ("md_resident_begin", "md_resident_sort_cells"):
            resident._kernel(name)
        resident._kernel("md_resident_neighbors", dtype)
        raw_kernel(watch._CUDA_SOURCE, watch._NAMES, f"md_first_half_watch<{real}>")
        raw_kernel(forces._CUDA_SOURCE, forces._NAMES, f"md_lj_forces<{real}>")
        for name in ("md_langevin", "md_second_half"):
            raw_kernel(integrate._CUDA_SOURCE, integrate._NAMES, f"{name}<{real}>")

    def _compaction_launch(self, kernel, arguments) -> None:
        kernel((self.n_blocks,), (TILE,), arguments)

    def _scan(self, totals) -> None:
        _kernel("slab_scan")((1,), (MAX_BLOCKS,), (self.block_counts, np.int32(self.n_blocks), self.words,
                                                   *(np.int32(t) for t in totals), self.watch))

    def _scatter(self, outputs) -> None:
        arguments = []
        for array, capacity in outputs:
            arguments += [np.uint64(0) if array is None else array, np.int32(capacity)]
        self._compaction_launch(_kernel("slab_scatter"), (self.masks, self.words, np.int32(self.row_capacity),
                                                          self.block_counts, *arguments, self.watch))

    def _record_migration(self, mark=None) -> None:
        """[flag] classify -> leaving lists -> pack, fill gaps -> NCCL -> arrivals."""
        mark = mark or (lambda name: None)
        dtype, real = self.positions.dtype, self.real
        rows, capacity = self.row_capacity, self.migrant_capacity
        self._compaction_launch(_kernel("slab_classify", dtype), (
            self.positions, self.images, self.words, np.int32(rows), *(real(v) for v in self.box), np.int32(self.axis),
            *self.bounds, self.masks, self.block_counts, self.watch))
        self._scan((W_STAY, W_LEAVE, W_LEAVE + 1, W_LEAVE_ALL))
        self._scatter(((None, 0), (self.leaving_low, capacity), (self.leaving_high, capacity),
                       (self.leaving, 2 * capacity)))
        atoms = (self.positions, self.velocities, self.masses, self.images, self.atom_ids, self.types)
        if self.peer_exchange:   # straight into the neighbours' receive buffers
            destinations = tuple(np.uint64(self._remote[side]["migrants"]) for side in range(2))
        else:
            destinations = (self.migrants_out[0], self.migrants_out[1])
        _kernel("slab_pack_migrants", dtype)((blocks_for(2 * capacity),), (THREADS_PER_BLOCK,), (
            self.positions, self.velocities, self.masses, self.images, self.atom_ids, self.types, self.leaving_low,
            self.leaving_high, self.words, np.int32(capacity), *destinations, self.watch))
        _kernel("slab_fill_gaps", dtype)((blocks_for(2 * capacity),), (THREADS_PER_BLOCK,), (
            *atoms, self.leaving, np.int32(2 * capacity), self.words, self.watch))
        mark("[flag] classify, leaving lists, pack")
        if self.peer_exchange:
            self._signal_and_wait(F_MIGRANTS, only_on_rebuild=True)
        else:
            self._exchange([(self.migrants_out[side], self.migrants_in[side]) for side in range(2)])
        mark("migrants exchanged")
        _kernel("slab_unpack_migrants", dtype)((blocks_for(2 * capacity),), (THREADS_PER_BLOCK,), (
            *atoms, self.migrants_in[0], self.migrants_in[1], np.int32(capacity), self.words, np.int32(rows),
            self.watch))
        mark("[flag] unpack migrants")

    def _record_ghost_lists(self, source) -> None:
        """[flag] owned rows near the slab faces (of ``source``) -> the two ghost send lists."""
        self._compaction_launch(_kernel("slab_select_ghosts", source.dtype), (
            source, self.words, np.int32(self.row_capacity), np.int32(self.axis), *self.ghost_limits, self.masks,
            self.block_counts, self.watch))
        self._scan((W_SEND, W_SEND + 1, -1, -1))
        self._scatter(((self.send_low, self.ghost_capacity), (self.send_high, self.ghost_capacity), (None, 0),
                       (None, 0)))

    def _record_ghost_exchange(self, source, mark=None) -> None:
        """Every step: pack the send lists' rows of ``source`` and receive the neighbours' into the ghost rows."""
        mark = mark or (lambda name: None)
        capacity, rows = self.ghost_capacity, self.row_capacity
        if self.peer_exchange:   # straight into the neighbours' ghost rows (of positions, as NCCL receives)
            destinations = [np.uint64(self._remote[side][key]) for key in ("positions", "types", "count")
                            for side in range(2)]
        else:
            destinations = [self.ghost_positions_out[0], self.ghost_positions_out[1], self.ghost_types_out[0],
                            self.ghost_types_out[1], self.ghost_counts_out[0:1], self.ghost_counts_out[1:2]]
        _kernel("slab_pack_ghosts", source.dtype)((blocks_for(2 * capacity),), (THREADS_PER_BLOCK,), (
            source, self.types, self.send_low, self.send_high, self.words, np.int32(capacity), np.int32(self.axis),
            *self.shifts, *destinations))
        mark("pack ghosts")
        if self.peer_exchange:
            self._signal_and_wait(F_GHOSTS, only_on_rebuild=False)
            mark("ghosts exchanged")
            return
        pairs = []
        for side in range(2):
            start = rows + side * capacity
            pairs.append([(self.ghost_positions_out[side], self.positions[start:start + capacity]),
                          (self.ghost_types_out[side], self.types[start:start + capacity]),
                          (self.ghost_counts_out[side:side + 1], self.words[W_RECEIVED + side:W_RECEIVED + side + 1])])
        self._exchange(pairs)
        mark("ghosts exchanged")

    def _signal_and_wait(self, kind: int, only_on_rebuild: bool) -> None:
        """Peer exchange: tell both neighbours that this rank's stores into their memory are done, then wait
        for theirs (``kind``: F_MIGRANTS or F_GHOSTS)."""
        sequence, flags = self.peer_sequence, self.peer_flags
        _kernel("slab_signal")((1,), (1,), (sequence[kind:], np.uint64(self._remote[0][f"flag{kind}"]),
                                            np.uint64(self._remote[1][f"flag{kind}"]), np.int32(only_on_rebuild),
                                            self.watch))
        _kernel("slab_wait")((1,), (1,), (sequence[kind + 1:], flags[kind:], np.int32(only_on_rebuild), self.watch,
                                          self.words, np.float64(PEER_TIMEOUT_SECONDS)))

    def _choose_exchange(self, mode: str) -> bool:
        """Collective: True for the peer exchange (stores into the neighbours' memory, mapped with CUDA IPC:
        all ranks on one node), False for NCCL send/receive. ``mode``: "auto", "peer" or "nccl"."""
        from hpcgpu.errors import ConfigurationError

        if mode == "nccl":
            return False
        if self.comm.n_nodes > 1:
            if mode == "peer":
                raise ConfigurationError(f"exchange 'peer' maps the neighbours' GPU memory (CUDA IPC): every rank "
                                         f"must run on one node, this job has {self.comm.n_nodes}; use auto or nccl")
            return False
        try:
            self._map_peers()   # the same outcome on every rank
        except RuntimeError as error:
            if mode == "peer":
                raise ConfigurationError(f"exchange 'peer': CUDA IPC mapping failed ({error}); use nccl") from error
            return False
        return True

    def _map_peers(self) -> None:
        """Collective: map each neighbour's receiving memory (its ghost rows of positions, ghost types,
        received-count word, migrant buffer and flags, on the side facing this rank). Again after every
        growth (new arrays). Raises the same error on every rank when any rank fails."""
        import cupy

        from hpcgpu.transport.cuda_ipc import export_pointer, open_peer_pointer

        def on_every_rank(work):
            """Run ``work()`` here, then agree: every rank gets [results] or the same RuntimeError."""
            try:
                result, failure = work(), ""
            except Exception as error:   # noqa: BLE001 -- reported on every rank below
                result, failure = None, f"rank {self.comm.rank}: {type(error).__name__}: {error}"
            everyone = self.comm.mpi.allgather((result, failure))
            failures = [f for _, f in everyone if f]
            if failures:
                raise RuntimeError(failures[0])
            return [r for r, _ in everyone]

        rows, capacity = self.row_capacity, self.ghost_capacity
        flag_bytes = self.peer_flags.itemsize

        def export():
            mine = []
            for side in range(2):   # what a neighbour on this side writes into
                first_ghost = rows + side * capacity
                mine.append({
                    "positions": self.positions.data.ptr + first_ghost * 3 * self.positions.itemsize,
                    "types": self.types.data.ptr + first_ghost * self.types.itemsize,
                    "count": self.words.data.ptr + (W_RECEIVED + side) * self.words.itemsize,
                    "migrants": self.migrants_in[side].data.ptr,
                    f"flag{F_MIGRANTS}": self.peer_flags.data.ptr + (F_MIGRANTS + side) * flag_bytes,
                    f"flag{F_GHOSTS}": self.peer_flags.data.ptr + (F_GHOSTS + side) * flag_bytes})
            return [{key: export_pointer(address) for key, address in entry.items()} for entry in mine]

        everyone = on_every_rank(export)
        # this rank's low neighbour receives what goes low on ITS high side, and the other way round
        self._remote = on_every_rank(lambda: [
            {key: open_peer_pointer(value) for key, value in everyone[self.peer[name]][1 - side].items()}
            for side, name in enumerate(("low", "high"))])[self.comm.rank]
        cupy.cuda.Device().synchronize()
        self.comm.barrier()

    def _exchange(self, per_side) -> None:
        """One NCCL group: ``per_side[0]`` goes to the low neighbour and its receive buffers fill from the low
        neighbour, likewise ``per_side[1]`` with the high one. Each entry: (send, receive) or a list of them.

        Sends go high first, receives come from low first: with two slabs both neighbours are one rank,
        NCCL matches a pair's messages in posting order, and this rank's high message is that rank's
        message from low (and the other way round)."""
        import cupy
        from cupy.cuda import nccl

        from hpcgpu.transport.nccl import _type_and_count

        stream = cupy.cuda.get_current_stream().ptr
        sides = [entry if isinstance(entry, list) else [entry] for entry in per_side]
        nccl.groupStart()
        for side, peer in ((1, self.peer["high"]), (0, self.peer["low"])):
            for send, _ in sides[side]:
                nccl_type, count = _type_and_count(send)
                self.nccl.send(send.data.ptr, count, nccl_type, peer, stream)
        for side, peer in ((0, self.peer["low"]), (1, self.peer["high"])):
            for _, receive in sides[side]:
                nccl_type, count = _type_and_count(receive)
                self.nccl.recv(receive.data.ptr, count, nccl_type, peer, stream)
        nccl.groupEnd()

    def _record_build(self, copy_owned: bool, copy_ghosts: bool, count_build: bool) -> None:
        """[flag] bin owned + ghost rows -> sort cells -> neighbour list (from the reference positions)."""
        from . import resident

        dtype, real = self.positions.dtype, self.real
        rows, ghosts = self.row_capacity, self.ghost_capacity
        per_length = tuple(real(1.0 / v) for v in self.cell_size)
        shape = tuple(np.int32(c) for c in self.cells)
        origin = tuple(real(v) for v in self.origin)
        _kernel("slab_bin", dtype)((blocks_for(rows + 2 * ghosts),), (THREADS_PER_BLOCK,), (
            self.positions, self.reference, self.words, np.int32(rows), np.int32(ghosts), np.int32(copy_owned),
            np.int32(copy_ghosts), *origin, *per_length, *shape, self.cell_count, self.cell_atoms,
            np.int32(self.cell_capacity), self.watch, self.words))
        resident._kernel("md_resident_sort_cells")((blocks_for(32 * self.n_cells),), (THREADS_PER_BLOCK,), (
            self.watch, self.cell_count, np.int32(self.n_cells), np.int32(self.cell_capacity), self.cell_atoms))
        box, inverse = self._periodic_box()
        resident._kernel("md_resident_neighbors", dtype)((blocks_for(rows * self.build_lanes),), (THREADS_PER_BLOCK,), (
            self.reference, np.int32(rows), *box, *inverse, *per_length, *shape, self.cell_count, self.cell_atoms,
            np.int32(self.cell_capacity), real(self.width ** 2), np.int32(self.neighbor_capacity), self.neighbors,
            self.counts, self.watch, self.words, np.int32(count_build), np.int32(self.build_lanes.bit_length() - 1),
            *origin, np.int32(7 & ~(1 << self.axis)), self.words[W_OWNED:]))

    def _periodic_box(self):
        """Box and inverse lengths for the minimum image: 0 on the divided axis (ghost coordinates there)."""
        real = self.real
        box = tuple(real(0.0 if a == self.axis else self.box[a]) for a in range(3))
        inverse = tuple(real(0.0 if a == self.axis else 1.0 / self.box[a]) for a in range(3))
        return box, inverse

    def _forces(self, forces, energy: bool) -> None:
        from . import forces as forces_module

        dtype = self.positions.dtype
        table = self._state.pair_table
        box, inverse = self._periodic_box()
        raw_kernel(forces_module._CUDA_SOURCE, forces_module._NAMES, f"md_lj_forces<{_real_name(dtype)}>")(
            (blocks_for(self.row_capacity * self.lanes),), (THREADS_PER_BLOCK,), (
                self.positions, self.types, self.neighbors, self.counts, np.int32(self.row_capacity),
                np.int32(self.neighbor_capacity), table, np.int32(table.shape[0]), forces, np.int32(energy),
                self.per_atom if energy else np.uint64(0), np.int32(1), *box, *inverse,
                np.int32(self.lanes.bit_length() - 1), np.int32(self.lanes > 1), self.words[W_OWNED:]))

    def _record_step(self, energy: bool, mark=None) -> None:
        """Queue one whole step (the chain in the module docstring). ``mark(name)``, if given, is called after
        each part (benchmarks/md_slab_profile.py records CUDA events there; never inside a capture)."""
        import cupy
        from cupy.cuda import nccl

        from . import integrate, resident, watch

        mark = mark or (lambda name: None)
        config = self.config
        dtype = self.positions.dtype
        real_name = _real_name(dtype)
        rows = self.row_capacity
        active = self.words[W_OWNED:]
        resident._kernel("md_resident_begin")((blocks_for(max(self.n_cells, 1)),), (THREADS_PER_BLOCK,),
                                              (self.counter, self.watch, self.cell_count, np.int32(self.n_cells)))
        raw_kernel(watch._CUDA_SOURCE, watch._NAMES, f"md_first_half_watch<{real_name}>")(
            (blocks_for(rows),), (THREADS_PER_BLOCK,), (
                self.positions, self.velocities, self.forces, self.masses, np.int32(rows), dtype.type(config.dt),
                self.reference, np.float64((0.5 * config.skin) ** 2), np.int32(0), self.watch, self.counter, active))
        mark("begin + first half")
        stream = cupy.cuda.get_current_stream().ptr
        self.nccl.allReduce(self.watch.data.ptr, self.watch.data.ptr, 1, nccl.NCCL_INT32, nccl.NCCL_MIN, stream)
        mark("allreduce of the flag")
        skip = self._skip   # IF nodes in a capture: the [flag] kernels skipped on steps without a rebuild
        if self.peer_exchange:
            with skip.body():
                self._record_migration(mark)
                self._record_ghost_lists(self.positions)
        else:   # NCCL calls stay out of IF bodies
            self._record_migration(mark)
            with skip.body():
                self._record_ghost_lists(self.positions)
        mark("[flag] ghost lists")
        self._record_ghost_exchange(self.positions, mark)
        with skip.body():
            self._record_build(copy_owned=True, copy_ghosts=True, count_build=True)
        mark("[flag] bin, sort, neighbours")
        self._forces(self.forces, energy)
        mark("forces")
        integrate_source, integrate_names = integrate._CUDA_SOURCE, integrate._NAMES
        if config.thermostat == "langevin":
            noise_scale = math.sqrt(2.0 * config.temperature / (config.damping * config.dt))
            raw_kernel(integrate_source, integrate_names, f"md_langevin<{real_name}>")(
                (blocks_for(rows),), (THREADS_PER_BLOCK,), (
                    self.forces, self.velocities, self.masses, self.atom_ids, np.int32(rows),
                    np.float64(1.0 / config.damping), np.float64(noise_scale), np.int64(config.seed), np.int64(0),
                    self.counter, active))
        raw_kernel(integrate_source, integrate_names, f"md_second_half<{real_name}>")(
            (blocks_for(rows),), (THREADS_PER_BLOCK,), (
                self.velocities, self.forces, self.masses, np.int32(rows), dtype.type(config.dt), active))
        mark("Langevin + second half")

    def _record_save(self) -> None:
        for name, array in self._snapshot_arrays().items():
            self._saved[name].data.copy_from_device_async(array.data, array.nbytes)

    # -- builds outside the graphs ----------------------------------------------------------------------------
    def _nccl_warm_up(self) -> None:
        """Eager NCCL calls before any capture: peer connections and collective channels are set up here
        (set-up inside a stream capture would fail)."""
        import cupy
        from cupy.cuda import nccl

        stream = cupy.cuda.get_current_stream().ptr
        probe = cupy.zeros(1, dtype=cupy.int32)
        self.nccl.allReduce(probe.data.ptr, probe.data.ptr, 1, nccl.NCCL_INT32, nccl.NCCL_MIN, stream)
        if not self.peer_exchange:
            self._exchange([(self.migrants_out[side], self.migrants_in[side]) for side in range(2)])
        cupy.cuda.get_current_stream().synchronize()

    def _initial_ghosts_and_list(self) -> None:
        """Collective: the ghosts of the last build (from the reference positions), the list of that build,
        then the ghosts' current positions. Grows (on every rank alike) until everything fits."""
        import cupy

        while True:
            self._raise_flag()
            self._record_ghost_lists(self.reference)
            self._record_ghost_exchange(self.reference)
            self._record_build(copy_owned=False, copy_ghosts=True, count_build=False)
            self.watch[0] = NOT_EXCEEDED
            if self.peer_exchange:   # the build above reads the ghost rows the neighbours write next
                cupy.cuda.Device().synchronize()
                self.comm.barrier()
            self._record_ghost_exchange(self.positions)
            needed = self._global_max(self._needed(self.words.get()))
            self._check_peer_timeout(needed)
            if not self._overflowed(needed):
                break
            self._grow(needed)

    def _build_from_reference(self) -> None:
        """Local: the list of the reference positions (owned and ghost rows), growing until it fits."""
        while True:
            self._raise_flag()
            self._record_build(copy_owned=False, copy_ghosts=False, count_build=False)
            self.watch[0] = NOT_EXCEEDED
            words = self.words.get()
            if words[W_NEIGHBORS_NEEDED] <= self.neighbor_capacity and words[W_CELL_NEEDED] <= self.cell_capacity:
                break
            self._grow(np.array([words[W_NEIGHBORS_NEEDED], words[W_CELL_NEEDED], 0, 0, 0, 0, 0, 0]))

    def _raise_flag(self) -> None:
        """Before a build outside the graphs: empty cells, no recorded needs, the rebuild flag raised."""
        self.cell_count.fill(0)
        self.words[W_NEIGHBORS_NEEDED:W_LOST + 1] = 0
        self.watch[0] = 0


_LIVE = weakref.WeakSet()


@atexit.register
def _close_live_instances() -> None:
    for steps in list(_LIVE):
        steps.close()


def _drop_after_device(graphs: dict, stream=None) -> None:
    """Wait until the device is idle, then let ``graphs`` go (see :meth:`SlabResidentSteps.close`); ``stream``
    is only kept alive until then."""
    import cupy

    cupy.cuda.Device().synchronize()
    graphs.clear()
    del stream


def _real_name(dtype) -> str:
    return "float" if np.dtype(dtype) == np.float32 else "double"

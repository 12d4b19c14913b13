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

Modules: :mod:`apps.md.slab_plan` (which decompositions, device words), :mod:`apps.md.slab_capacity`
(fixed-capacity arrays, overflow check and growth), :mod:`apps.md.slab_exchange` (migrants and ghosts by
NCCL or peer memory), this one (the step, its graphs, builds). Kernels: :mod:`apps.md.resident_slab_kernels`;
shared with one GPU: begin, sort, neighbours
(:mod:`apps.md.resident`), first half + watch, forces, Langevin, second half (each reads the owned count
from the device word ``words[W_OWNED]``).
"""

from __future__ import annotations

import atexit
import math
import weakref

import numpy as np

from hpcgpu.runtime.capture import when_not_capturing
from hpcgpu.errors import BackendError
from hpcgpu.transport import collectives

from . import forces as forces_module
from . import integrate, resident_kernels, resident_slab_kernels, watch
from ._arrays import THREADS_PER_BLOCK, blocks_for, raw_kernel
from .cells import make_cell_grid
from .forces import lanes_per_atom
from .chunked_graphs import DEFAULT_CHUNK, ChunkedGraphSteps, graph_conditionals_here, rebuild_skip
from .slab_capacity import SlabCapacities
from .slab_exchange import SlabExchange
from .slab_plan import (  # noqa: F401  (re-exported: the driver's words, sizes and checks)
    F_GHOSTS,
    F_MIGRANTS,
    MAX_BLOCKS,
    MIGRANT_WORDS,
    N_WORDS,
    PEER_TIMEOUT_SECONDS,
    TILE,
    W_BUILDS,
    W_CELL_NEEDED,
    W_GHOSTS_NEEDED,
    W_LEAVE,
    W_LEAVE_ALL,
    W_LOST,
    W_MIGRANTS_NEEDED,
    W_NEIGHBORS_NEEDED,
    W_OWNED,
    W_OWNED_NEEDED,
    W_PEER_TIMEOUT,
    W_RECEIVED,
    W_SEND,
    W_STAY,
    real_name,
    slab_axis,
    slab_kernel,
    slab_problems,
)
from .watch import NOT_EXCEEDED

#: Tests set {"rows": .., "ghost_rows": .., "migrants": ..} to start below what a run needs (overflow redo).
INITIAL_CAPACITIES = None

_kernel = slab_kernel
_real_name = real_name


class SlabResidentSteps(SlabCapacities, SlabExchange, ChunkedGraphSteps):
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

        self.config = config
        self.chunk = int(config.check_interval) if config.check_interval is not None else DEFAULT_CHUNK
        domain = state.domain
        self.comm = domain.comm
        # The job's device collectives (NCCL: slab_problems refuses the others): queued on the stream,
        # capturable in the chunks' graphs.
        self.movers = collectives(self.comm, on_device=True)
        if not self.movers.capturable:
            raise BackendError(f"the slab driver's steps are CUDA graphs holding their exchanges: it needs the nccl "
                               f"transport, this job's is {self.movers.name}; choose --transport nccl, or run "
                               "the default driver (--resident off)")
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

    # -- kernels (verification, overflow and arrays: SlabCapacities; exchanges: SlabExchange) ----------------
    def _load_kernels(self, dtype) -> None:
        """Compile and load every kernel a graph holds now: no module loading while a stream captures."""
        real = "float" if np.dtype(dtype) == np.float32 else "double"
        for name in resident_slab_kernels._NAMES:
            if "<" not in name or name.endswith(f"<{real}>"):
                _kernel(name.split("<")[0], dtype if "<" in name else None)
        for name in ("md_resident_begin", "md_resident_sort_cells"):
            resident_kernels._kernel(name)
        resident_kernels._kernel("md_resident_neighbors", dtype)
        raw_kernel(watch._CUDA_SOURCE, watch._NAMES, f"md_first_half_watch<{real}>")
        raw_kernel(forces_module._CUDA_SOURCE, forces_module._NAMES, f"md_lj_forces<{real}>")
        for name in ("md_langevin", "md_second_half"):
            raw_kernel(integrate._CUDA_SOURCE, integrate._NAMES, f"{name}<{real}>")

    def _record_build(self, copy_owned: bool, copy_ghosts: bool, count_build: bool) -> None:
        """[flag] bin owned + ghost rows -> sort cells -> neighbour list (from the reference positions)."""
        dtype, real = self.positions.dtype, self.real
        rows, ghosts = self.row_capacity, self.ghost_capacity
        per_length = tuple(real(1.0 / v) for v in self.cell_size)
        shape = tuple(np.int32(c) for c in self.cells)
        origin = tuple(real(v) for v in self.origin)
        _kernel("slab_bin", dtype)((blocks_for(rows + 2 * ghosts),), (THREADS_PER_BLOCK,), (
            self.positions, self.reference, self.words, np.int32(rows), np.int32(ghosts), np.int32(copy_owned),
            np.int32(copy_ghosts), *origin, *per_length, *shape, self.cell_count, self.cell_atoms,
            np.int32(self.cell_capacity), self.watch, self.words))
        resident_kernels._kernel("md_resident_sort_cells")((blocks_for(32 * self.n_cells),), (THREADS_PER_BLOCK,), (
            self.watch, self.cell_count, np.int32(self.n_cells), np.int32(self.cell_capacity), self.cell_atoms))
        box, inverse = self._periodic_box()
        resident_kernels._kernel("md_resident_neighbors", dtype)((blocks_for(rows * self.build_lanes),), (THREADS_PER_BLOCK,), (
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
        mark = mark or (lambda name: None)
        config = self.config
        dtype = self.positions.dtype
        real_name = _real_name(dtype)
        rows = self.row_capacity
        active = self.words[W_OWNED:]
        resident_kernels._kernel("md_resident_begin")((blocks_for(max(self.n_cells, 1)),), (THREADS_PER_BLOCK,),
                                              (self.counter, self.watch, self.cell_count, np.int32(self.n_cells)))
        raw_kernel(watch._CUDA_SOURCE, watch._NAMES, f"md_first_half_watch<{real_name}>")(
            (blocks_for(rows),), (THREADS_PER_BLOCK,), (
                self.positions, self.velocities, self.forces, self.masses, np.int32(rows), dtype.type(config.dt),
                self.reference, np.float64((0.5 * config.skin) ** 2), np.int32(0), self.watch, self.counter, active))
        mark("begin + first half")
        flag = self.watch[:1]
        self.movers.allreduce(flag, out=flag, op="min")   # on the current stream, in place, capturable
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

    # -- builds outside the graphs ----------------------------------------------------------------------------
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

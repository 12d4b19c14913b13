"""The slab driver's fixed-capacity device arrays: allocation, the overflow check of a chunk, growth.

A mixin of :class:`apps.md.resident_slab.SlabResidentSteps`. Kernels record in ``words`` what they would
have needed; after each chunk :meth:`SlabCapacities._verify` reads those words (one MPI allreduce of eight
integers), and after an overflow on ANY rank every rank restores the snapshot of the chunk start, grows
what was short (message sizes alike on all ranks) and runs the chunk again.
"""

from __future__ import annotations

import math

import numpy as np

from hpcgpu.errors import ConfigurationError, HaloError
from hpcgpu.transport import collectives

from .neighbors import GROWTH, NeighborList
from .chunked_graphs import _phase
from .slab_plan import MAX_BLOCKS, MIGRANT_WORDS, N_WORDS, PEER_TIMEOUT_SECONDS, TILE, W_BUILDS, W_CELL_NEEDED, \
    W_GHOSTS_NEEDED, W_LOST, W_MIGRANTS_NEEDED, W_NEIGHBORS_NEEDED, W_OWNED, W_OWNED_NEEDED, W_PEER_TIMEOUT
from .watch import NOT_EXCEEDED


class SlabCapacities:
    """Arrays at fixed capacities, their snapshot, verification and growth (mixin; module docstring)."""

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
        """Collective: the element-wise largest of every rank's ``needed`` (int64, shape (8,)), in place
        (host collectives of the job's transport: MPI)."""
        return collectives(self.comm, on_device=False).allreduce(needed, out=needed, op="max")

    @staticmethod
    def _check_peer_timeout(needed) -> None:
        if needed[7] > 0:
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

    def _record_save(self) -> None:
        for name, array in self._snapshot_arrays().items():
            self._saved[name].data.copy_from_device_async(array.data, array.nbytes)

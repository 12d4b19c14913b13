"""The slab driver's exchanges: migrants and ghost rows to both slab neighbours, by NCCL or peer memory.

A mixin of :class:`apps.md.resident_slab.SlabResidentSteps` (it reads that object's arrays and
capacities). Two ways, chosen once (:meth:`SlabExchange._choose_exchange`; see the module docstring of
:mod:`apps.md.resident_slab`): **peer** -- the pack kernels store straight into the neighbours' arrays,
mapped with CUDA IPC (:mod:`hpcgpu.transport.peer_memory`), then ``slab_signal`` / ``slab_wait``
order the stores (device-side sequence numbers, only on rebuild steps for migrants, with a time-out);
**nccl** -- one NCCL group of fixed-size messages per exchange, through the job's collectives
(:meth:`hpcgpu.transport.nccl_collectives.NcclCollectives.exchange`: queued on the current stream, capturable). Both
move the same bytes into the same rows.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport.peer_memory import export_addresses, on_every_rank, open_addresses, ready_for_peer_stores

from ._arrays import THREADS_PER_BLOCK, blocks_for
from .slab_plan import F_GHOSTS, F_MIGRANTS, MAX_BLOCKS, PEER_TIMEOUT_SECONDS, TILE, W_LEAVE, W_LEAVE_ALL, \
    W_RECEIVED, W_SEND, W_STAY, slab_kernel as _kernel


class SlabExchange:
    """Recording of the migration and ghost exchanges of one slab (mixin; see the module docstring)."""

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
        growth (new arrays). Raises the same PeerAccessError (a RuntimeError) on every rank when any rank
        fails (:func:`hpcgpu.transport.peer_memory.on_every_rank`)."""
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
            return [export_addresses(entry) for entry in mine]

        everyone = on_every_rank(self.comm, export)
        # this rank's low neighbour receives what goes low on ITS high side, and the other way round
        self._remote = on_every_rank(self.comm, lambda: [
            open_addresses(everyone[self.peer[name]][1 - side]) for side, name in enumerate(("low", "high"))
        ])[self.comm.rank]
        ready_for_peer_stores(self.comm)

    def _exchange(self, per_side) -> None:
        """One NCCL group: ``per_side[0]`` goes to the low neighbour and its receive buffers fill from the low
        neighbour, likewise ``per_side[1]`` with the high one. Each entry: (send, receive) or a list of them.

        Sends go high first, receives come from low first: with two slabs both neighbours are one rank,
        messages between two ranks pair up in listing order (per direction: NCCL's rule, which every
        transport follows), and this rank's high message is that rank's message from low (and the other
        way round). Queued on the current stream (``self.movers`` is NCCL's: capturable, no host wait)."""
        sides = [entry if isinstance(entry, list) else [entry] for entry in per_side]
        sends = [(send, peer) for side, peer in ((1, self.peer["high"]), (0, self.peer["low"]))
                 for send, _ in sides[side]]
        receives = [(receive, peer) for side, peer in ((0, self.peer["low"]), (1, self.peer["high"]))
                    for _, receive in sides[side]]
        self.movers.send_receive(sends, receives)

    def _nccl_warm_up(self) -> None:
        """Eager NCCL calls before any capture: peer connections and collective channels are set up here
        (set-up inside a stream capture would fail)."""
        import cupy

        probe = cupy.zeros(1, dtype=cupy.int32)
        self.movers.allreduce(probe, out=probe, op="min")   # on the current stream, as the step's flag
        if not self.peer_exchange:
            self._exchange([(self.migrants_out[side], self.migrants_in[side]) for side in range(2)])
        cupy.cuda.get_current_stream().synchronize()

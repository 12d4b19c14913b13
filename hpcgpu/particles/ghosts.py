"""Ghost particles: copies of neighbours' particles within ``width`` of this rank's sub-box.

Built on rebuild steps (after :func:`~hpcgpu.particles.migrate`), then refreshed every step::

    ghosts = GhostExchange(domain, owned_positions, width, carried={"types": types})   # collective
    positions = concatenate([owned_positions, ghosts.positions])                        # owned, then ghosts
    ...                                                                                 # owned atoms move
    ghosts.forward(positions)          # collective: ghost rows re-sent along the same lists, in place

Send lists: for each of the 26 directions ``d`` (faces, edges, corners) a particle goes to the neighbour
in direction ``d`` if, on every axis where ``d`` is non-zero, it lies within ``width`` of that face::

    d_x = +1:  x >= upper_x - width        d_x = -1:  x < lower_x + width        d_x = 0: any x

so a particle near a corner is sent to the 3 face, 3 edge and 1 corner neighbours around it: every
receiver gets exactly the particles (or periodic images) inside its ``[lower - width, upper + width)``.
The sender adds the periodic shift of the direction (``+-L`` across the box boundary) before sending.
Every copy comes from an *owned* particle, so no second hop is needed -- which requires sub-boxes at
least ``width`` wide (:class:`~hpcgpu.particles.ParticleDomain` guarantees it; a narrower sub-box is an
error suggesting fewer ranks). Ghosts are ordered by direction, then by the sender's order.

``forward`` is LAMMPS' ``comm->forward_comm``: only positions travel, with the message sizes known from
the build. Its cost per step is one gather + shift on the sender, one message per direction and one
contiguous write on the receiver.

Every message between ranks goes through the job's transport (:func:`hpcgpu.transport.collectives`,
:mod:`hpcgpu.particles.messages`): the 26 counts of a build as host integers, the rows in the
positions' kind of memory. With NumPy arrays that is MPI. With CuPy arrays everything stays on the
device (:mod:`hpcgpu.particles.device_ghosts`): the build selects rows with one kernel and a prefix
sum; a refresh is one pack kernel for the rows other ranks need, one exchange of those rows, and one
gather kernel for periodic images of this rank's own particles and the received rows. On ``nccl`` the
exchange is one NCCL group queued on the current stream (nothing synchronises the host); on
``mpi-cuda`` and ``mpi-staged`` the stream is synchronised and MPI moves the rows (device pointers, or
pinned host copies). A build's rows travel the same way, like a refresh. On one rank nothing travels:
the ghosts are that gather kernel alone.
Ghost arrays are allocated to the exact sizes exchanged at each build, so nothing can overflow.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.arch import array_module, is_device_array
from hpcgpu.errors import DecompositionError
from hpcgpu.particles.device_ghosts import gather_ghosts, pack_rows, select_send_rows
from hpcgpu.particles.messages import exchange_counts, exchange_rows, exchange_rows_into
from hpcgpu.transport import Message, collectives
from hpcgpu.transport.planned_exchange import PlannedExchange

# MPI tags (each plus the message's index per peer, at most 25): a build's counts and positions, the
# refreshes, and carried array number a at _CARRIED_TAG + 32 * a.
_GHOST_TAG = 7100
_FORWARD_TAG = 7164
_CARRIED_TAG = 7200


class GhostExchange:
    """Ghost copies of owned particles near the faces, edges and corners of the sub-boxes.

    Parameters
    ----------
    domain : hpcgpu.particles.ParticleDomain
    positions : array, shape (n_local, 3), float32/float64 (NumPy or CuPy) -- owned particles, inside the
        sub-box (after migration)
    width : float -- ghost shell thickness (normally cutoff + skin); at most the smallest sub-box length
    carried : dict of name -> array with ``n_local`` rows, optional -- per-particle values copied to the
        ghosts once, at build (types, ids, charges); they do not change between rebuilds

    Attributes
    ----------
    n_local, n_ghost : int
    positions : array, shape (n_ghost, 3) -- ghost positions (in this rank's frame, shifts applied)
    carried : dict of name -> array with ``n_ghost`` rows
    send_counts, receive_counts : list of 26 int -- per direction of :attr:`ParticleDomain.neighbors`
    sources : list of 26 int -- the rank whose direction-k message arrives here (the neighbour at ``-k``)
    movers : hpcgpu.transport.Collectives or None -- what moves the rows (None on one rank with CuPy
        arrays: nothing travels)
    """

    def __init__(self, domain, positions, width: float, carried: dict | None = None):
        self.domain = domain
        self.width = float(width)
        if np.any(domain.box / np.array(domain.dims) < self.width * (1 - 1e-12)):
            raise DecompositionError(
                f"sub-boxes of {(domain.box / np.array(domain.dims)).tolist()} (x, y, z) are thinner than the "
                f"ghost width {self.width:g}; expected every sub-box to be at least that wide so ghosts come "
                "from adjacent ranks only. Use fewer ranks or a larger system.")
        self.n_local = int(positions.shape[0])
        self.dtype = np.dtype(positions.dtype)
        self.is_cupy = is_device_array(positions)
        xp = array_module(positions)
        me = domain.comm.rank
        lower, upper = domain.subbox.lower, domain.subbox.upper
        if self.is_cupy:
            # One flag kernel + prefix sum on the device: same rows, same order as the host loop below.
            self.send_index, send_direction, self.send_counts = select_send_rows(
                positions, lower, upper, self.width, [n.offset for n in domain.neighbors])
            shift_table = xp.asarray(np.array([n.shift for n in domain.neighbors]).reshape(-1, 3), dtype=self.dtype)
            self.send_shift = xp.ascontiguousarray(shift_table[send_direction])
        else:
            near_lower = positions < xp.asarray(lower + self.width, dtype=positions.dtype)   # (n_local, 3)
            near_upper = positions >= xp.asarray(upper - self.width, dtype=positions.dtype)
            indices, shifts = [], []
            for neighbor in domain.neighbors:
                selected = xp.ones(self.n_local, dtype=bool)
                for axis, d in enumerate(neighbor.offset):
                    if d:
                        selected &= (near_upper if d > 0 else near_lower)[:, axis]
                index = xp.nonzero(selected)[0]
                indices.append(index)
                shifts.append(neighbor.shift)
            self.send_counts = [int(index.shape[0]) for index in indices]
            self.send_index = xp.concatenate(indices) if indices else xp.zeros(0, dtype=xp.int64)
            self.send_shift = xp.asarray(np.repeat(np.array(shifts).reshape(-1, 3), self.send_counts, axis=0),
                                         dtype=self.dtype)
        self.send_offsets = np.concatenate([[0], np.cumsum(self.send_counts)]).astype(np.int64)
        # Direction k is sent to neighbors[k].rank; the matching message arrives from the rank in
        # direction -k (the one for which this rank lies in direction k). Both sides list their messages
        # in direction order, so the k-th message between two ranks pairs with the k-th.
        index_of = {n.offset: k for k, n in enumerate(domain.neighbors)}
        self.sources = [domain.neighbors[index_of[tuple(-d for d in n.offset)]].rank for n in domain.neighbors]
        self.destinations = [n.rank for n in domain.neighbors]
        self.all_local = all(n.rank == me for n in domain.neighbors)
        if self.all_local and self.is_cupy:
            # Every message goes to this rank itself: direction k's ghosts are its send rows, so the
            # ghosts are a device gather -- nothing travels.
            self.movers = None
            self.receive_counts = list(self.send_counts)
            self.receive_offsets = self.send_offsets.copy()
            self.n_ghost = int(self.receive_offsets[-1])
            self.positions = xp.ascontiguousarray(positions[self.send_index] + self.send_shift)
            self.carried = {name: xp.ascontiguousarray(values[self.send_index])
                            for name, values in (carried or {}).items()}
            self._plan_device_forward()
            return
        # Collective on the first call of a job for device arrays: the job's transport, chosen once.
        self.movers = collectives(domain.comm, on_device=self.is_cupy)
        if self.is_cupy:
            self._build_on_device(positions, carried or {})
            return
        packed = self._pack(positions)
        received = exchange_rows(domain.comm, self.movers,
                                 list(zip(self._by_direction(packed, self.send_offsets), self.destinations)),
                                 self.sources, self.dtype, (3,), _GHOST_TAG)
        self.receive_counts = [len(buffer) for buffer in received]
        self.receive_offsets = np.concatenate([[0], np.cumsum(self.receive_counts)]).astype(np.int64)
        self.n_ghost = int(self.receive_offsets[-1])
        self.positions = np.ascontiguousarray(np.concatenate(received) if received else np.zeros((0, 3), self.dtype))
        self.carried = {}
        for number, (name, values) in enumerate((carried or {}).items()):
            rows = np.asarray(values[self.send_index])
            ghost_rows = np.empty((self.n_ghost,) + rows.shape[1:], dtype=rows.dtype)
            exchange_rows_into(domain.comm, self.movers,
                               list(zip(self._by_direction(rows, self.send_offsets), self.destinations)),
                               list(zip(self._by_direction(ghost_rows, self.receive_offsets), self.sources)),
                               _CARRIED_TAG + 32 * number)
            self.carried[name] = ghost_rows

    @staticmethod
    def _by_direction(rows, offsets) -> list:
        """The 26 contiguous blocks ``rows[offsets[k]:offsets[k + 1]]`` of a direction-ordered array."""
        return [rows[offsets[k]:offsets[k + 1]] for k in range(len(offsets) - 1)]

    def _build_on_device(self, positions, carried: dict) -> None:
        """GPU build between ranks: the 26 counts travel as host integers, the rows on the device through
        the job's transport (no host staging on ``nccl``).

        The ghost rows are then exactly what :meth:`forward` would write: the owned positions go
        through one refresh, and each carried array through the same messages without shifts.
        """
        import cupy

        self.receive_counts = exchange_counts(self.domain.comm, self.send_counts, self.destinations, self.sources,
                                              _GHOST_TAG)
        self.receive_offsets = np.concatenate([[0], np.cumsum(self.receive_counts)]).astype(np.int64)
        self.n_ghost = int(self.receive_offsets[-1])
        self._plan_device_forward()
        padded = cupy.empty((self.n_local + self.n_ghost, 3), dtype=self.dtype)
        padded[:self.n_local] = positions
        self._forward_device(padded)
        self.positions = padded[self.n_local:]
        self.carried = {name: self._ghost_rows_of(values, _CARRIED_TAG + 32 * number)
                        for number, (name, values) in enumerate(carried.items())}

    def _ghost_rows_of(self, values, tag: int):
        """Ghost rows of a per-particle device array ``values`` (n_local, ...): same sources as the
        positions, no periodic shift (build only: two host synchronisations for the masks)."""
        import cupy

        values = cupy.ascontiguousarray(values)
        row_shape = values.shape[1:]
        send = cupy.ascontiguousarray(values[self.remote_send_index])
        n_received = sum(count for _, _, count in self.remote_receives)
        received = cupy.empty((max(n_received, 1),) + row_shape, dtype=values.dtype)
        if self.remote_sends or self.remote_receives:
            self.movers.send_receive(*self._row_messages(send, received), tag=tag)
        source = self.gather_source
        rows = cupy.empty((self.n_ghost,) + row_shape, dtype=values.dtype)
        own = source >= 0
        rows[own] = values[source[own]]
        rows[~own] = received[-1 - source[~own]]
        return rows

    def _plan_device_forward(self) -> None:
        """Index maps of :meth:`forward` on the GPU (see :mod:`hpcgpu.particles.device_ghosts`).

        Ghost rows from this rank itself gather ``positions[source] + shift``; rows from other ranks
        arrive in one receive buffer (``source = -1 - row``), through the job's transport.
        """
        import cupy

        me = self.domain.comm.rank
        if self.all_local:
            self.gather_source, self.gather_shift = self.send_index, self.send_shift
            self.remote_sends, self.remote_receives = [], []
            self.receive_buffer = cupy.empty((1, 3), dtype=self.dtype)
            return
        sources, shifts, remote_sends, remote_receives = [], [], [], []
        n_received = 0
        for k, neighbor in enumerate(self.domain.neighbors):
            start, stop = int(self.receive_offsets[k]), int(self.receive_offsets[k + 1])
            send_start, send_stop = int(self.send_offsets[k]), int(self.send_offsets[k + 1])
            if self.sources[k] == me:   # a periodic image of this rank's own particles (direction k's own rows)
                sources.append(self.send_index[send_start:send_stop])
                shifts.append(self.send_shift[send_start:send_stop])
            else:
                sources.append(cupy.arange(-1 - n_received, -1 - n_received - (stop - start), -1, dtype=cupy.int64))
                shifts.append(cupy.zeros((stop - start, 3), dtype=self.dtype))
                remote_receives.append((self.sources[k], n_received, stop - start))
                n_received += stop - start
            if neighbor.rank != me:
                remote_sends.append((neighbor.rank, send_start, send_stop - send_start))
        self.gather_source = cupy.ascontiguousarray(cupy.concatenate(sources))
        self.gather_shift = cupy.ascontiguousarray(cupy.concatenate(shifts))
        # Remote sends are packed into one buffer, in direction order (the order the messages pair up in).
        send_rows = [cupy.arange(start, start + count, dtype=cupy.int64) for _, start, count in remote_sends]
        rows = cupy.concatenate(send_rows) if send_rows else cupy.zeros(0, cupy.int64)
        self.remote_send_index = cupy.ascontiguousarray(self.send_index[rows])
        self.remote_send_shift = cupy.ascontiguousarray(self.send_shift[rows])
        self.remote_sends, self.remote_receives = [], remote_receives
        offset = 0
        for peer, _, count in remote_sends:
            self.remote_sends.append((peer, offset, count))
            offset += count
        self.send_buffer = cupy.empty((offset, 3), dtype=self.dtype)
        self.receive_buffer = cupy.empty((max(n_received, 1), 3), dtype=self.dtype)
        # The buffers never change until the next build: the refresh's messages are resolved once.
        self._forward_exchange = PlannedExchange(self.movers, *self._row_messages(self.send_buffer,
                                                                                  self.receive_buffer),
                                                 tag=_FORWARD_TAG)

    def _pack(self, positions) -> np.ndarray:
        """Owned rows to send, shifted (NumPy), shape (n_send, 3)."""
        return positions[self.send_index] + self.send_shift

    def forward(self, positions) -> None:
        """Collective: refresh the ghost rows ``positions[n_local:]`` from their owners. Returns None.

        Parameters
        ----------
        positions : array, shape (n_local + n_ghost, 3) -- owned rows first (as at build), then ghosts
        """
        if positions.shape != (self.n_local + self.n_ghost, 3) or np.dtype(positions.dtype) != self.dtype:
            raise DecompositionError(
                f"GhostExchange.forward: expected positions of shape ({self.n_local + self.n_ghost}, 3) and dtype "
                f"{self.dtype}, found {tuple(positions.shape)} {np.dtype(positions.dtype)}; rebuild the exchange "
                "after migration")
        if self.is_cupy:
            self._forward_device(positions)
            return
        packed = self._pack(positions[:self.n_local])
        target = positions[self.n_local:]   # contiguous rows: receive straight into the array
        exchange_rows_into(self.domain.comm, self.movers,
                           list(zip(self._by_direction(packed, self.send_offsets), self.destinations)),
                           list(zip(self._by_direction(target, self.receive_offsets), self.sources)), _FORWARD_TAG)

    def _forward_device(self, positions) -> None:
        """GPU refresh: pack remote rows, one exchange, one gather kernel; all on the current stream."""
        if self.remote_sends or self.remote_receives:
            pack_rows(positions, self.remote_send_index, self.remote_send_shift, self.send_buffer)
            # nccl: one group queued on the stream, no host synchronisation; MPI: the stream is
            # synchronised, and the received rows land on it before run() returns.
            self._forward_exchange.run()
        gather_ghosts(positions, self.n_local, self.gather_source, self.gather_shift, self.receive_buffer)

    def _row_messages(self, send, received) -> tuple[list, list]:
        """The messages (sends, receives) of the remote rows of ``send`` out and ``received`` in.

        Both in direction order: the messages between two ranks pair up in listing order, and both
        sides enumerate the same directions in the same order. Empty directions are left out (the
        peer leaves out its matching message too: the counts were exchanged at the build).
        """
        receives = [Message(received[start:start + count], peer)
                    for peer, start, count in self.remote_receives if count]
        sends = [Message(send[start:start + count], peer) for peer, start, count in self.remote_sends if count]
        return sends, receives

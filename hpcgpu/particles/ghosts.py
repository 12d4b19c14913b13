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
the build. Its cost per step is one gather + shift on the sender, one MPI message per direction and one
contiguous write on the receiver. With CuPy arrays everything stays on the device
(:mod:`hpcgpu.particles.device_ghosts`): the build selects rows with one kernel and a prefix sum; a
refresh is one gather kernel for periodic images of this rank's own particles plus, between ranks, one
NCCL group of sends and receives when the job's transport is ``nccl`` (:func:`use_nccl`; with
``mpi-staged`` or ``mpi-cuda``, host-staged MPI instead). Builds
between ranks send the 26 counts by MPI and the rows by NCCL, like a refresh (the host-staged MPI
build remains for NumPy arrays and without NCCL).
Ghost arrays are allocated to the exact sizes exchanged at each build, so nothing can overflow.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.arch import is_device_array
from hpcgpu.errors import DecompositionError
from hpcgpu.particles.device_ghosts import gather_ghosts, pack_rows, select_send_rows
from hpcgpu.particles.messages import exchange, exchange_into
from hpcgpu.transport.nccl import grouped_send_receive, nccl_communicator, nccl_message
from hpcgpu.transport.selection import select_transport_for

_GHOST_TAG = 7100  # + direction index (0..25); carried arrays use _CARRIED_TAG + 32 * array + direction
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
        xp = self._xp()
        me = domain.mpi.Get_rank()
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
        # direction -k (the one for which this rank lies in direction k), with the same tag.
        index_of = {n.offset: k for k, n in enumerate(domain.neighbors)}
        self.sources = [domain.neighbors[index_of[tuple(-d for d in n.offset)]].rank for n in domain.neighbors]
        self.all_local = all(n.rank == me for n in domain.neighbors)
        if self.all_local and self.is_cupy:
            # Every message goes to this rank itself: direction k's ghosts are its send rows (same tag),
            # so the ghosts are a device gather -- nothing travels through the host.
            self.receive_counts = list(self.send_counts)
            self.receive_offsets = self.send_offsets.copy()
            self.n_ghost = int(self.receive_offsets[-1])
            self.positions = xp.ascontiguousarray(positions[self.send_index] + self.send_shift)
            self.carried = {name: xp.ascontiguousarray(values[self.send_index])
                            for name, values in (carried or {}).items()}
            self._plan_device_forward()
            return
        if self.is_cupy and use_nccl(domain.comm):   # collective: the job's transport, chosen once
            self._build_on_device(positions, carried or {})
            return
        packed = self._pack(positions)
        sends = [(n.rank, _GHOST_TAG + k, packed[self.send_offsets[k]:self.send_offsets[k + 1]])
                 for k, n in enumerate(domain.neighbors)]
        receives = [(source, _GHOST_TAG + k) for k, source in enumerate(self.sources)]
        received = exchange(domain.mpi, sends, receives, self.dtype, (3,))
        self.receive_counts = [len(buffer) for buffer in received]
        self.receive_offsets = np.concatenate([[0], np.cumsum(self.receive_counts)]).astype(np.int64)
        self.n_ghost = int(self.receive_offsets[-1])
        host_positions = np.concatenate(received) if received else np.zeros((0, 3), self.dtype)
        self.positions = xp.ascontiguousarray(xp.asarray(host_positions))
        self.carried = {}
        for number, (name, values) in enumerate((carried or {}).items()):
            host = values[self.send_index]
            host = host.get() if self.is_cupy else np.asarray(host)
            sends = [(n.rank, _CARRIED_TAG + 32 * number + k, host[self.send_offsets[k]:self.send_offsets[k + 1]])
                     for k, n in enumerate(domain.neighbors)]
            receives = [(source, _CARRIED_TAG + 32 * number + k) for k, source in enumerate(self.sources)]
            parts = exchange(domain.mpi, sends, receives, host.dtype, host.shape[1:])
            self.carried[name] = xp.ascontiguousarray(xp.asarray(np.concatenate(parts)))
        if self.is_cupy:
            self._plan_device_forward()

    def _build_on_device(self, positions, carried: dict) -> None:
        """GPU build between ranks: the 26 counts travel by MPI, the rows by NCCL (no host staging).

        The ghost rows are then exactly what :meth:`forward` would write: the owned positions go
        through one refresh, and each carried array through the same NCCL pattern without shifts.
        """
        import cupy

        counts = exchange_into_counts(self.domain.mpi, self.send_counts,
                                      [n.rank for n in self.domain.neighbors], self.sources)
        self.receive_counts = counts
        self.receive_offsets = np.concatenate([[0], np.cumsum(self.receive_counts)]).astype(np.int64)
        self.n_ghost = int(self.receive_offsets[-1])
        self._plan_device_forward()
        padded = cupy.empty((self.n_local + self.n_ghost, 3), dtype=self.dtype)
        padded[:self.n_local] = positions
        self._forward_device(padded)
        self.positions = padded[self.n_local:]
        self.carried = {name: self._ghost_rows_of(values) for name, values in carried.items()}

    def _ghost_rows_of(self, values):
        """Ghost rows of a per-particle device array ``values`` (n_local, ...): same sources as the
        positions, no periodic shift (build only: two host synchronisations for the masks)."""
        import cupy

        values = cupy.ascontiguousarray(values)
        row_shape = values.shape[1:]
        send = cupy.ascontiguousarray(values[self.remote_send_index])
        n_received = sum(count for _, _, count in self.remote_receives)
        received = cupy.empty((max(n_received, 1),) + row_shape, dtype=values.dtype)
        if self.remote_sends or self.remote_receives:
            grouped_send_receive(self.nccl, *self._row_messages(send, received), cupy.cuda.get_current_stream())
        source = self.gather_source
        rows = cupy.empty((self.n_ghost,) + row_shape, dtype=values.dtype)
        own = source >= 0
        rows[own] = values[source[own]]
        rows[~own] = received[-1 - source[~own]]
        return rows

    def _plan_device_forward(self) -> None:
        """Index maps of :meth:`forward` on the GPU (see :mod:`hpcgpu.particles.device_ghosts`).

        Ghost rows from this rank itself gather ``positions[source] + shift``; rows from other ranks
        arrive by NCCL in one receive buffer (``source = -1 - row``). Without NCCL, remote rows keep the
        host-staged MPI path.
        """
        import cupy

        me = self.domain.mpi.Get_rank()
        self.nccl = None
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
            if self.sources[k] == me:   # a periodic image of this rank's own particles (same tag k)
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
        # Remote sends are packed into one buffer, in direction order (the order NCCL matches them).
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
        if use_nccl(self.domain.comm):
            self.nccl = nccl_communicator(self.domain.comm)   # collective: every rank builds its exchange here
            # The buffers never change until the next build: resolve the refresh's messages once.
            self._forward_messages = self._row_messages(self.send_buffer, self.receive_buffer)

    def _xp(self):
        if self.is_cupy:
            import cupy

            return cupy
        return np

    def _pack(self, positions) -> np.ndarray:
        """Owned rows to send, shifted, as one host array (n_send, 3)."""
        packed = positions[self.send_index] + self.send_shift
        return packed.get() if self.is_cupy else packed

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
        if self.is_cupy and (self.all_local or self.nccl is not None):
            self._forward_device(positions)
            return
        packed = self._pack(positions[:self.n_local])
        if self.is_cupy:
            target = np.empty((self.n_ghost, 3), dtype=self.dtype)
        else:
            target = positions[self.n_local:]   # contiguous rows: receive straight into the array
        sends = [(n.rank, _GHOST_TAG + k, packed[self.send_offsets[k]:self.send_offsets[k + 1]])
                 for k, n in enumerate(self.domain.neighbors)]
        receives = [(source, _GHOST_TAG + k, target[self.receive_offsets[k]:self.receive_offsets[k + 1]])
                    for k, source in enumerate(self.sources)]
        exchange_into(self.domain.mpi, sends, receives)
        if self.is_cupy:
            positions[self.n_local:] = self._xp().asarray(target)

    def _forward_device(self, positions) -> None:
        """GPU refresh: pack remote rows, one NCCL group, one gather kernel; all on the current stream."""
        if self.remote_sends or self.remote_receives:
            import cupy

            pack_rows(positions, self.remote_send_index, self.remote_send_shift, self.send_buffer)
            grouped_send_receive(self.nccl, *self._forward_messages, cupy.cuda.get_current_stream())
        gather_ghosts(positions, self.n_local, self.gather_source, self.gather_shift, self.receive_buffer)

    def _row_messages(self, send, received) -> tuple[list, list]:
        """The NCCL messages (sends, receives) of the remote rows of ``send`` out and ``received`` in.

        Both in direction order: NCCL matches messages between two ranks in posting order, and both
        sides enumerate the same directions in the same order. Empty directions are left out (the
        peer leaves out its matching message too: the counts were exchanged at the build).
        """
        receives = [nccl_message(received[start:start + count], peer)
                    for peer, start, count in self.remote_receives if count]
        sends = [nccl_message(send[start:start + count], peer) for peer, start, count in self.remote_sends if count]
        return sends, receives


def exchange_into_counts(mpi, send_counts, destinations, sources) -> list:
    """Collective: the 26 per-direction row counts, sent to ``destinations[k]`` with tag k and received
    from ``sources[k]``; returns the received counts (list of int) in direction order."""
    outgoing = [np.array([count], dtype=np.int64) for count in send_counts]
    incoming = [np.zeros(1, dtype=np.int64) for _ in sources]
    exchange_into(mpi, [(rank, _GHOST_TAG + k, outgoing[k]) for k, rank in enumerate(destinations)],
                  [(rank, _GHOST_TAG + k, incoming[k]) for k, rank in enumerate(sources)])
    return [int(count[0]) for count in incoming]


def use_nccl(comm) -> bool:
    """Collective on first use: True if ghost exchanges of CuPy arrays between ranks go through NCCL,
    i.e. the job's GPU transport (:func:`hpcgpu.transport.select_transport`) is ``nccl`` -- the
    automatic choice where CuPy has NCCL. ``mpi-staged`` and ``mpi-cuda`` keep the host-staged MPI path."""
    return select_transport_for(comm, is_gpu=True) == "nccl"

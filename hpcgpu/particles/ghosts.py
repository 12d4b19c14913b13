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
contiguous write on the receiver. With CuPy arrays the gather and shift run on the device and the
packed buffer is staged through the host (one copy each way); NCCL point-to-point would avoid that.
Ghost arrays are allocated to the exact sizes exchanged at each build, so nothing can overflow.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.errors import DecompositionError
from hpcgpu.particles.messages import exchange, exchange_into

_GHOST_TAG = 7100  # + direction index (0..25); carried arrays use _CARRIED_TAG + 32 * array + direction
_CARRIED_TAG = 7200


def _is_cupy(array) -> bool:
    return type(array).__module__.startswith("cupy")


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
        self.is_cupy = _is_cupy(positions)
        xp = self._xp()
        lower, upper = domain.subbox.lower, domain.subbox.upper
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

"""Cartesian domain decomposition.

A global array of shape ``global_shape`` (C order: ``(y, x)`` in 2D, ``(z, y, x)`` in 3D) is cut into
``dims`` blocks along each axis, one block per rank. Along an axis of ``n`` cells cut into ``p``
blocks, every block gets ``n // p`` cells and the first ``n % p`` blocks one more::

    n = 10, p = 3:   | 0 1 2 3 | 4 5 6 | 7 8 9 |     extents (4, 3, 3), starts (0, 4, 7)

Neighbours are addressed by offsets in {-1, 0, +1} per axis, diagonals included (``(1, -1)`` is the
rank one block up in y and one block left in x). At a non-periodic domain edge the neighbour is
``None`` (MPI's ``PROC_NULL``); on a periodic axis with one block a rank is its own neighbour.

Which rank owns which block: on one node, the rank order (rank r owns the block at
``numpy.unravel_index(r, dims)``). When the ranks span several nodes (read from the shared-memory
split, or simulated with ``HPCGPU_SIMULATE_NODES``), each node's ranks get a compact box of blocks
so that most halo bytes stay inside nodes (:mod:`hpcgpu.decomposition.nodes`); the blocks themselves,
and hence results gathered in global order, do not change.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Sequence

from hpcgpu.decomposition.comm import gather_node_of_rank, make_cartcomm
from hpcgpu.decomposition.nodes import NodeLayout, node_aware_layout
from hpcgpu.decomposition.shape import WILDCARDS, choose_dims, factorizations, split_extents
from hpcgpu.errors import DecompositionError

__all__ = ["Decomposition", "WILDCARDS", "choose_dims", "factorizations", "split_extents"]

class Decomposition:
    """An N-d Cartesian decomposition of a global grid over the ranks of a communicator.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    global_shape : tuple of int
        Cells per axis of the whole grid, C order.
    dims : tuple, optional
        Blocks per axis; 0, None or "*" entries are chosen automatically (all free by default).
    periodic : bool or tuple of bool, optional
        Periodicity per axis (a single bool applies to all axes). Default: not periodic.
    node_aware : bool, optional
        On several nodes, place each node's ranks on a compact box of blocks when that moves fewer halo
        bytes between nodes than the rank order (default True). No effect on one node.

    Attributes
    ----------
    ndim, global_shape, dims, periodic, coords
    local_shape, local_start, local_stop : tuple of int
        Extent of this rank's block and its first / one-past-last global index per axis.
    cart : mpi4py.MPI.Cartcomm
        The Cartesian communicator; its ranks are those of ``comm``. With a node-aware placement, a
        duplicate of ``comm`` with ``Get_coords`` / ``Get_cart_rank`` for that placement.
    node_layout : hpcgpu.decomposition.nodes.NodeLayout
        Node of every rank, the block each owns and the halo bytes inside / between nodes (for halo
        width 1, 8 bytes per cell; :func:`hpcgpu.decomposition.nodes.header_line` for other values).
    """

    def __init__(self, comm, global_shape: Sequence[int], dims: Sequence | None = None, periodic=False,
                 node_aware: bool = True):
        self.comm = comm
        self.global_shape = tuple(int(n) for n in global_shape)
        self.ndim = len(self.global_shape)
        if self.ndim < 1 or any(n < 1 for n in self.global_shape):
            raise DecompositionError(f"global_shape must be 1 to 3 positive integers, got {tuple(global_shape)}")
        if isinstance(periodic, bool):
            periodic = (periodic,) * self.ndim
        self.periodic = tuple(bool(p) for p in periodic)
        if len(self.periodic) != self.ndim:
            raise DecompositionError(
                f"periodic has {len(self.periodic)} entries but global_shape {self.global_shape} has {self.ndim} axes"
            )
        if not isinstance(node_aware, bool):
            raise DecompositionError(f"node_aware must be True or False, got {node_aware!r}")
        self.dims = choose_dims(comm.size, self.global_shape, dims)
        node_of_rank = gather_node_of_rank(comm)   # collective; every rank gets the same tuple
        ranks_per_node = Counter(node_of_rank)
        self.node_layout: NodeLayout = node_aware_layout(
            len(ranks_per_node), max(ranks_per_node.values()), self.global_shape, self.periodic,
            dims=self.dims, node_of_rank=node_of_rank)
        if not node_aware:
            self.node_layout = self.node_layout.rank_order()
        if self.node_layout.is_rank_order:   # one node, or nothing to gain: exactly the layout of old
            self.cart = comm.mpi.Create_cart(list(self.dims), periods=list(self.periodic), reorder=False)
        else:
            self.cart = make_cartcomm(comm, self.node_layout)
        self.coords = tuple(self.cart.Get_coords(comm.rank))
        self._extents = [split_extents(n, p) for n, p in zip(self.global_shape, self.dims)]
        self._starts = [list(itertools.accumulate([0] + e[:-1])) for e in self._extents]
        self.local_shape = tuple(self._extents[a][c] for a, c in enumerate(self.coords))
        self.local_start = tuple(self._starts[a][c] for a, c in enumerate(self.coords))
        self.local_stop = tuple(s + n for s, n in zip(self.local_start, self.local_shape))
        self._neighbors = {
            offset: self._rank_at(offset)
            for offset in itertools.product((-1, 0, 1), repeat=self.ndim)
            if any(offset)
        }

    # ------------------------------------------------------------------ geometry
    @property
    def n_ranks(self) -> int:
        return self.comm.size

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def local_slices(self) -> tuple[slice, ...]:
        """Slices selecting this rank's block from a global array."""
        return tuple(slice(s, e) for s, e in zip(self.local_start, self.local_stop))

    def extents(self, axis: int) -> list[int]:
        """Cells per block along ``axis``, for block coordinates 0 .. dims[axis]-1."""
        return list(self._extents[axis])

    def starts(self, axis: int) -> list[int]:
        """First global index per block along ``axis``."""
        return list(self._starts[axis])

    def min_extent(self, axis: int) -> int:
        """Smallest block extent along ``axis`` (the same on every rank)."""
        return min(self._extents[axis])

    def block_of(self, coords: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(start, shape) of the block at Cartesian ``coords``."""
        start = tuple(self._starts[a][c] for a, c in enumerate(coords))
        shape = tuple(self._extents[a][c] for a, c in enumerate(coords))
        return start, shape

    def rank_coords(self, rank: int) -> tuple[int, ...]:
        return tuple(self.cart.Get_coords(rank))

    def owner_of(self, global_index: Sequence[int]) -> int:
        """Rank that owns the cell at ``global_index``."""
        coords = []
        for axis, i in enumerate(global_index):
            if not 0 <= i < self.global_shape[axis]:
                raise DecompositionError(f"index {tuple(global_index)} is outside the grid {self.global_shape}")
            starts = self._starts[axis]
            coords.append(max(c for c in range(self.dims[axis]) if starts[c] <= i))
        return self.cart.Get_cart_rank(coords)

    def global_to_local(self, global_index: Sequence[int]) -> tuple[int, ...] | None:
        """Local (owned-block) index of a global index, or None if another rank owns it."""
        local = tuple(i - s for i, s in zip(global_index, self.local_start))
        if all(0 <= l < n for l, n in zip(local, self.local_shape)):
            return local
        return None

    def local_to_global(self, local_index: Sequence[int]) -> tuple[int, ...]:
        """Global index of an owned-block local index."""
        return tuple(i + s for i, s in zip(local_index, self.local_start))

    # ------------------------------------------------------------------ neighbours
    def _rank_at(self, offset: Sequence[int]):
        coords = []
        for axis, (c, d) in enumerate(zip(self.coords, offset)):
            c += d
            if not 0 <= c < self.dims[axis]:
                if not self.periodic[axis]:
                    return None
                c %= self.dims[axis]
            coords.append(c)
        return self.cart.Get_cart_rank(coords)

    def neighbor(self, offset: Sequence[int]):
        """Rank at block offset ``offset`` (e.g. ``(0, 1)``), or None beyond a non-periodic edge."""
        offset = tuple(offset)
        if len(offset) != self.ndim or not any(offset) or any(d not in (-1, 0, 1) for d in offset):
            raise DecompositionError(f"neighbour offsets are {self.ndim} values in -1/0/1, not all 0; got {offset}")
        return self._neighbors[offset]

    @property
    def neighbors(self) -> dict:
        """All ``3**ndim - 1`` neighbour offsets mapped to ranks (None beyond a non-periodic edge)."""
        return dict(self._neighbors)

    def at_lower_edge(self, axis: int) -> bool:
        """True if this block touches the lower global boundary of ``axis``."""
        return self.coords[axis] == 0

    def at_upper_edge(self, axis: int) -> bool:
        return self.coords[axis] == self.dims[axis] - 1

    # ------------------------------------------------------------------ display
    def __str__(self) -> str:
        axes = "zyx"[-self.ndim:] if self.ndim <= 3 else "".join(f"a{i}" for i in range(self.ndim))
        per_axis = ", ".join(
            f"{name}: {n} cells / {p} = {'-'.join(str(e) for e in sorted(set(self._extents[a]), reverse=True))}"
            f"{' periodic' if per else ''}"
            for a, (name, n, p, per) in enumerate(zip(axes, self.global_shape, self.dims, self.periodic))
        )
        return f"Decomposition {' x '.join(map(str, self.dims))} over {self.n_ranks} ranks ({per_axis})"

    def __repr__(self) -> str:
        return (
            f"Decomposition(global_shape={self.global_shape}, dims={self.dims}, periodic={self.periodic}, "
            f"rank={self.rank}, coords={self.coords}, local_start={self.local_start}, local_shape={self.local_shape})"
        )

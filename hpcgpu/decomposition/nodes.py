"""Node-aware placement: which rank of which node owns which block of a Cartesian decomposition.

A halo exchange between two GPUs of one node crosses NVLink (hundreds of GB/s); between nodes it
crosses the network (25-50 GB/s per GPU). The *set* of blocks is fixed by ``dims``
(:func:`hpcgpu.decomposition.shape.choose_dims`); what can still be chosen is which rank owns which
block. Placing each node's ranks on a compact box of blocks (a *node tile*) keeps most halo bytes
inside nodes. Example, 2 nodes x 4 GPUs, 8192 x 8192 cells, dims 8 x 1 (slabs; ``--dims 8,1``),
halo 1, fp64, corners included, nodes given round-robin by the launcher (rank r on node r % 2)::

    rank order (the layout of old):  every slab boundary crosses nodes   inter-node 918 kB per exchange
    node-aware:                      node 0 holds slabs 0-3, node 1 4-7  inter-node 131 kB per exchange

The node of each rank is read from the shared-memory split (``MPI.COMM_TYPE_SHARED``), never from
rank numbers, so any launcher's rank order works. On one node nothing changes: the layout is the plain
rank order (rank r owns the block at ``numpy.unravel_index(r, dims)``), bit for bit as before.

Only the owner of each block changes, never the blocks themselves: fields gathered in global order,
and hence the apps' checksums, are identical with and without node-aware placement.

Testing on one host
-------------------
``HPCGPU_SIMULATE_NODES=K`` (read on rank 0) splits the ranks into K pretend nodes for the placement
and for :func:`header_line` only (read by :mod:`hpcgpu.decomposition.comm`); GPU selection keeps
using the real node-local rank. ``K`` or
``K:block``: ranks ``0 .. n/K-1`` on node 0 and so on (sizes differ by at most one); ``K:cyclic``:
rank r on node ``r % K`` (a round-robin launcher). See docs/multinode.md.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from hpcgpu.decomposition.shape import choose_dims, factorizations, split_extents
from hpcgpu.errors import DecompositionError

# ---------------------------------------------------------------------------------------------- traffic
def _directions(ndim: int, corners: bool):
    for offset in itertools.product((-1, 0, 1), repeat=ndim):
        if any(offset) and (corners or sum(map(abs, offset)) == 1):
            yield offset


def _per_axis(value, ndim: int, name: str) -> tuple[int, ...]:
    values = (value,) * ndim if np.ndim(value) == 0 else tuple(value)
    if len(values) != ndim or any(int(v) != v or v < 0 for v in values):
        raise DecompositionError(f"{name} must be one non-negative integer or one per axis ({ndim}), got {value!r}")
    return tuple(int(v) for v in values)


def halo_bytes(dims, global_shape, halo_width, itemsize, node_of_position, periodic=False,
               corners: bool = True) -> tuple[int, int]:
    """Bytes one halo exchange moves inside nodes and between nodes, summed over all ranks.

    Parameters
    ----------
    dims : sequence of int
        Blocks per axis (C order, like ``global_shape``).
    global_shape : sequence of int
        Cells per axis of the whole grid.
    halo_width : int or sequence of int
        Ghost layers per axis (cells).
    itemsize : int
        Bytes per cell and exchange (e.g. 8 for one fp64 field, 24 for three exchanged together).
    node_of_position : array_like of int, shape ``dims``
        Node of the rank that owns each block.
    periodic : bool or sequence of bool
    corners : bool
        Count edge and corner messages too (as :class:`hpcgpu.halo.HaloExchange` does by default).

    Returns
    -------
    (intra_node_bytes, inter_node_bytes) : tuple of int
        Bytes sent per exchange (each message counted once, at its sender). A rank that is its own
        neighbour (a periodic axis with one block) copies locally and counts nothing.
    """
    dims = tuple(int(d) for d in dims)
    ndim = len(dims)
    nodes = np.asarray(node_of_position)
    if nodes.shape != dims:
        raise DecompositionError(f"node_of_position must have shape dims={dims}, got {nodes.shape}")
    widths = _per_axis(halo_width, ndim, "halo_width")
    periodic = (bool(periodic),) * ndim if isinstance(periodic, (bool, np.bool_)) else tuple(map(bool, periodic))
    extents = [np.asarray(split_extents(int(n), d), dtype=np.int64) for n, d in zip(global_shape, dims)]
    intra = inter = 0
    for offset in _directions(ndim, corners):
        if all(dims[a] == 1 for a, step in enumerate(offset) if step):
            continue  # every rank is its own neighbour in this direction: a local copy
        cells = np.ones(dims, dtype=np.int64)
        neighbour = nodes
        valid = np.ones(dims, dtype=bool)
        for axis, step in enumerate(offset):
            shape = [1] * ndim
            shape[axis] = dims[axis]
            per_block = np.full(dims[axis], widths[axis]) if step else extents[axis]
            cells = cells * per_block.reshape(shape)
            if step:
                neighbour = np.roll(neighbour, -step, axis=axis)   # neighbour[c] = nodes[c + step]
                if not periodic[axis]:
                    coordinate = np.arange(dims[axis]).reshape(shape) + step
                    valid &= (coordinate >= 0) & (coordinate < dims[axis])
        sent = cells * int(itemsize) * valid
        same = neighbour == nodes
        intra += int(sent[same].sum())
        inter += int(sent[~same].sum())
    return intra, inter


# ---------------------------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class NodeLayout:
    """Blocks of a decomposition and the rank that owns each, with the halo traffic it causes.

    Attributes
    ----------
    dims, global_shape, periodic : tuple
    node_of_rank : tuple of int, length n_ranks
        Node index of every rank (0 .. n_nodes-1, numbered by lowest rank).
    position_of_rank : tuple of tuple of int, length n_ranks
        Block coordinates owned by every rank.
    node_aware : bool
        True when ``position_of_rank`` was chosen to keep traffic in nodes, False for the rank order.
    intra_bytes, inter_bytes : int
        Bytes per exchange inside / between nodes for this placement (see :func:`halo_bytes`).
    naive_intra_bytes, naive_inter_bytes : int
        The same for the rank order (rank r owns block ``unravel_index(r, dims)``) on the same nodes.
    halo_width, itemsize, corners :
        What the byte counts assume.
    """

    dims: tuple
    global_shape: tuple
    periodic: tuple
    node_of_rank: tuple
    position_of_rank: tuple
    node_aware: bool
    intra_bytes: int
    inter_bytes: int
    naive_intra_bytes: int
    naive_inter_bytes: int
    halo_width: object = 1
    itemsize: int = 8
    corners: bool = True

    @property
    def n_nodes(self) -> int:
        return len(set(self.node_of_rank))

    @property
    def is_rank_order(self) -> bool:
        """True when every rank owns the block the plain rank order gives it."""
        return all(p == tuple(int(c) for c in np.unravel_index(r, self.dims)) for r, p in enumerate(self.position_of_rank))

    def node_of_position(self) -> np.ndarray:
        """Node of the owner of each block, int array of shape ``dims``."""
        return _node_grid(self.dims, self.position_of_rank, self.node_of_rank)

    def node_tile(self) -> tuple[int, ...] | None:
        """Blocks per axis held by each node when every node holds one box of one shape; else None."""
        grid, shapes = self.node_of_position(), set()
        for node in set(self.node_of_rank):
            where = np.argwhere(grid == node)
            low, high = where.min(axis=0), where.max(axis=0)
            shape = tuple(int(h - l + 1) for l, h in zip(low, high))
            if math.prod(shape) != len(where):
                return None
            shapes.add(shape)
        return shapes.pop() if len(shapes) == 1 else None

    def with_traffic(self, halo_width=1, itemsize: int = 8, corners: bool = True) -> "NodeLayout":
        """The same placement with its byte counts recomputed for another halo width / item size."""
        naive = _node_grid(self.dims, _rank_order(len(self.node_of_rank), self.dims), self.node_of_rank)
        args = (self.dims, self.global_shape, halo_width, itemsize)
        intra, inter = halo_bytes(*args, self.node_of_position(), self.periodic, corners)
        naive_intra, naive_inter = halo_bytes(*args, naive, self.periodic, corners)
        return NodeLayout(self.dims, self.global_shape, self.periodic, self.node_of_rank, self.position_of_rank,
                          self.node_aware, intra, inter, naive_intra, naive_inter, halo_width, itemsize, corners)

    def rank_order(self) -> "NodeLayout":
        """The plain rank order on the same nodes (what ``node_aware=False`` uses)."""
        naive = _rank_order(len(self.node_of_rank), self.dims)
        return replace(self, position_of_rank=naive, node_aware=False, intra_bytes=self.naive_intra_bytes,
                       inter_bytes=self.naive_inter_bytes)

    def describe(self, exchanges_per_step: int = 1) -> str:
        return describe_node_traffic(self, exchanges_per_step)


def _rank_order(n_ranks: int, dims) -> tuple:
    return tuple(tuple(int(c) for c in np.unravel_index(r, dims)) for r in range(n_ranks))


def _node_grid(dims, position_of_rank, node_of_rank) -> np.ndarray:
    grid = np.full(tuple(dims), -1, dtype=np.int64)
    for position, node in zip(position_of_rank, node_of_rank):
        grid[tuple(position)] = node
    return grid


def normalise_nodes(node_of_rank) -> tuple[int, ...]:
    """Relabel nodes 0, 1, ... in the order of their lowest rank (as hpcgpu.Communicator numbers them)."""
    labels: dict = {}
    return tuple(labels.setdefault(label, len(labels)) for label in node_of_rank)


def _candidate_orders(dims, ranks_per_node: int):
    """Orders of all block positions to deal out to nodes in consecutive chunks: tile by tile, plus the
    row-major orders with each axis permutation (slab-like chunks)."""
    positions = list(itertools.product(*(range(d) for d in dims)))
    seen = set()
    for tile in factorizations(ranks_per_node, len(dims)):
        if any(t > d for t, d in zip(tile, dims)):
            continue
        key = lambda p, tile=tile: (tuple(c // t for c, t in zip(p, tile)), tuple(c % t for c, t in zip(p, tile)))
        order = tuple(sorted(positions, key=key))
        if order not in seen:
            seen.add(order)
            yield order
    for axes in itertools.permutations(range(len(dims))):
        order = tuple(sorted(positions, key=lambda p, axes=axes: tuple(p[a] for a in axes)))
        if order not in seen:
            seen.add(order)
            yield order


def _deal(order, node_of_rank) -> tuple:
    """Give node 0 the first chunk of ``order`` (as many blocks as it has ranks), node 1 the next, ...;
    inside a node, ranks in ascending order take the chunk's blocks in order."""
    ranks_of_node: dict = {}
    for rank, node in enumerate(node_of_rank):
        ranks_of_node.setdefault(node, []).append(rank)
    position_of_rank = [None] * len(node_of_rank)
    cursor = 0
    for node in sorted(ranks_of_node):
        for rank in ranks_of_node[node]:
            position_of_rank[rank] = order[cursor]
            cursor += 1
    return tuple(position_of_rank)


def node_aware_layout(n_nodes: int, gpus_per_node: int, global_shape: Sequence[int], periodic=False, *,
                      dims: Sequence | None = None, node_of_rank: Sequence[int] | None = None, halo_width=1,
                      itemsize: int = 8, corners: bool = True) -> NodeLayout:
    """Choose which rank owns which block so that the fewest halo bytes cross nodes.

    Parameters
    ----------
    n_nodes, gpus_per_node : int
        Nodes and ranks (one per GPU) per node. With ``node_of_rank`` they are checked against it
        (``gpus_per_node`` is then the most ranks on any node).
    global_shape : sequence of int
        Cells per axis, C order.
    periodic : bool or sequence of bool
    dims : sequence, optional
        Blocks per axis, with 0 / None / "*" for "choose" (:func:`~hpcgpu.decomposition.shape.choose_dims`,
        the same choice as :class:`hpcgpu.Decomposition`, so the blocks never change).
    node_of_rank : sequence of int, optional
        Node of every rank (any labels). Default: consecutive ranks fill a node
        (rank r on node ``r // gpus_per_node``), as ``srun``'s block distribution does.
    halo_width, itemsize, corners :
        What one exchange moves (:func:`halo_bytes`); they weigh faces against edges and corners.

    Returns
    -------
    NodeLayout
        On one node, or when no placement moves fewer bytes between nodes than the rank order, the
        rank order itself (``node_aware`` False).

    Raises
    ------
    DecompositionError
        On inconsistent node counts, or when ``dims`` cannot split ``global_shape``.
    """
    if node_of_rank is None:
        if not (isinstance(n_nodes, int) and isinstance(gpus_per_node, int) and n_nodes >= 1 and gpus_per_node >= 1):
            raise DecompositionError(f"n_nodes and gpus_per_node must be positive integers, got {n_nodes!r} and "
                                     f"{gpus_per_node!r}")
        node_of_rank = [rank // gpus_per_node for rank in range(n_nodes * gpus_per_node)]
    nodes = normalise_nodes(node_of_rank)
    counts = list(Counter(nodes).values())
    if len(counts) != n_nodes or max(counts) > gpus_per_node:
        raise DecompositionError(
            f"node_of_rank names {len(counts)} node(s) with up to {max(counts)} rank(s) each, but n_nodes={n_nodes} and "
            f"gpus_per_node={gpus_per_node}: pass matching counts (or leave node_of_rank out)")
    global_shape = tuple(int(n) for n in global_shape)
    ndim = len(global_shape)
    periodic = (bool(periodic),) * ndim if isinstance(periodic, bool) else tuple(bool(p) for p in periodic)
    dims = choose_dims(len(nodes), global_shape, dims)
    naive = _rank_order(len(nodes), dims)
    traffic = lambda positions: halo_bytes(dims, global_shape, halo_width, itemsize,
                                           _node_grid(dims, positions, nodes), periodic, corners)
    naive_intra, naive_inter = traffic(naive)
    best, best_cost, best_traffic = naive, None, (naive_intra, naive_inter)
    if len(counts) > 1:
        best_cost = (naive_inter, 0)
        for index, order in enumerate(_candidate_orders(dims, max(counts)), start=1):
            positions = _deal(order, nodes)
            intra, inter = traffic(positions)
            if (inter, index) < best_cost and inter < naive_inter:
                best, best_cost, best_traffic = positions, (inter, index), (intra, inter)
    return NodeLayout(dims, global_shape, periodic, nodes, best, best is not naive, best_traffic[0], best_traffic[1],
                      naive_intra, naive_inter, halo_width, itemsize, corners)


def format_bytes(n_bytes: float) -> str:
    """``1.5 MB``-style text (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def describe_node_traffic(layout: NodeLayout, exchanges_per_step: int = 1, axes: str = "") -> str:
    """One line for a run header, e.g.
    ``2 nodes x 4 ranks: node-aware layout 8x1 (node blocks 4x1): inter-node halo 131 kB/step vs 918 kB naive``.

    ``axes`` (e.g. ``"z, y, x"``) names the axis order of the dims where the header uses another one.
    """
    counts = sorted(set(Counter(layout.node_of_rank).values()))
    per_node = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    tile = layout.node_tile()
    blocks = "x".join(map(str, tile)) if tile else "irregular"
    kind = "node-aware layout" if layout.node_aware else "rank-order layout"
    scale = int(exchanges_per_step)
    order = f" ({axes})" if axes else ""
    text = (f"{layout.n_nodes} nodes x {per_node} ranks: {kind} {'x'.join(map(str, layout.dims))}{order} "
            f"(node blocks {blocks}): inter-node halo {format_bytes(layout.inter_bytes * scale)}/step")
    if layout.node_aware:
        return text + f" vs {format_bytes(layout.naive_inter_bytes * scale)} naive"
    return text + f", intra-node {format_bytes(layout.intra_bytes * scale)}/step"


def header_line(grid, halo_width=1, itemsize: int = 8, exchanges_per_step: int = 1, corners: bool = True) -> str | None:
    """The node-traffic line for a run header, or None when ``grid`` lies on one (real or simulated) node.

    Parameters
    ----------
    grid : hpcgpu.Decomposition
    halo_width : int or tuple of int
        Ghost layers per axis of the exchanged fields.
    itemsize : int
        Bytes per cell of one exchange (8 for one fp64 field, 24 for h, u, v in fp64 together).
    exchanges_per_step : int
        Exchanges per time step (3 for an SSP-RK3 step).
    """
    layout = getattr(grid, "node_layout", None)
    if layout is None or layout.n_nodes < 2:
        return None
    return describe_node_traffic(layout.with_traffic(halo_width, itemsize, corners), exchanges_per_step)

"""The MPI side of node-aware placement: which node each rank is on, and a Cartesian view of a placement.

:func:`gather_node_of_rank` reads every rank's node from the shared-memory split (``Split_type(
COMM_TYPE_SHARED)``, kept by :class:`hpcgpu.Communicator` as ``node_index``), or simulates nodes on
one host when ``HPCGPU_SIMULATE_NODES`` is set on rank 0 (for the placement and the header only; GPU
selection keeps the real node-local rank)::

    HPCGPU_SIMULATE_NODES=2          ranks 0 .. n/2-1 on node 0, the rest on node 1   (srun's block order)
    HPCGPU_SIMULATE_NODES=2:cyclic   rank r on node r % 2                             (a round-robin launcher)

:func:`make_cartcomm` gives a placement the ``Get_coords`` / ``Get_cart_rank`` of an MPI Cartesian
communicator while keeping the ranks of the decomposition's communicator (MPI's own Cartcomm ties
coordinates to rank order).
"""

from __future__ import annotations

import os

from hpcgpu.decomposition.nodes import NodeLayout, normalise_nodes
from hpcgpu.errors import DecompositionError

SIMULATE_NODES_ENV = "HPCGPU_SIMULATE_NODES"


def simulated_nodes(setting: str, n_ranks: int) -> tuple[int, ...]:
    """Node of every rank for ``HPCGPU_SIMULATE_NODES`` = ``K``, ``K:block`` or ``K:cyclic``."""
    count, _, pattern = str(setting).strip().partition(":")
    pattern = pattern.strip() or "block"
    try:
        n_nodes = int(count)
    except ValueError:
        n_nodes = 0
    if not 1 <= n_nodes <= n_ranks or pattern not in ("block", "cyclic"):
        raise DecompositionError(
            f"{SIMULATE_NODES_ENV}={setting!r}: expected K, K:block or K:cyclic with 1 <= K <= {n_ranks} (the number "
            f"of ranks); set it to e.g. 2 or 2:cyclic, or unset it to use the real nodes")
    if pattern == "cyclic":
        return tuple(rank % n_nodes for rank in range(n_ranks))
    return tuple(rank * n_nodes // n_ranks for rank in range(n_ranks))


def gather_node_of_rank(comm) -> tuple[int, ...]:
    """Collective: node index of every rank of ``comm`` (an :class:`hpcgpu.Communicator`).

    Read from the shared-memory split (``comm.node_index``, from ``Split_type(COMM_TYPE_SHARED)``),
    unless ``HPCGPU_SIMULATE_NODES`` is set on rank 0: then the simulated nodes (the same on every rank).
    """
    node_index = getattr(comm, "node_index", None)
    if node_index is None:
        from mpi4py import MPI

        shared = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        node_index = shared.allreduce(comm.rank, op=MPI.MIN)   # lowest rank of the node labels it
        shared.Free()
    setting = os.environ.get(SIMULATE_NODES_ENV, "") if comm.rank == 0 else None
    gathered = comm.mpi.allgather((node_index, setting))
    if gathered[0][1]:
        return simulated_nodes(gathered[0][1], comm.size)
    return normalise_nodes(node for node, _ in gathered)


def make_cartcomm(comm, layout: NodeLayout):
    """A communicator that answers like a Cartesian one for ``layout`` (``Get_coords``, ``Get_cart_rank``)
    while keeping the ranks of ``comm``: MPI's own Cartcomm ties coordinates to rank order."""
    from mpi4py import MPI

    class NodeAwareCartcomm(MPI.Intracomm):
        """A duplicate of the decomposition's communicator whose rank r sits at ``position_of_rank[r]``."""

        dims = layout.dims
        periods = tuple(int(p) for p in layout.periodic)
        ndim = len(layout.dims)
        _rank_of = {position: rank for rank, position in enumerate(layout.position_of_rank)}

        def Get_coords(self, rank):
            return list(layout.position_of_rank[rank])

        def Get_cart_rank(self, coords):
            wrapped = tuple(c % d if p else c for c, d, p in zip(coords, self.dims, self.periods))
            if any(not 0 <= c < d for c, d in zip(wrapped, self.dims)):
                raise DecompositionError(f"coordinates {tuple(coords)} are outside the process grid {self.dims}")
            return self._rank_of[wrapped]

        @property
        def coords(self):
            return self.Get_coords(self.Get_rank())

    return NodeAwareCartcomm(comm.mpi.Dup())

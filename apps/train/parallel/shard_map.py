"""Where each rank's shard of a split model lies in the unsplit model, and moving values between them.

A rank of a D x T x P grid holds the tensors of its pipeline stage, each whole (replicated tensors:
LayerNorms, the first and last Linear, a row-parallel bias) or as a slice cut by the tensor rank (rows
of a column-parallel weight and bias, columns of a row-parallel weight). :func:`shard_pieces` lists, for
every tensor of this rank's flat buffer, the flat positions of its elements in the UNSPLIT one-process
model's buffer (:meth:`ParallelModel.reference`), and which single rank writes it (data replica 0 and,
for a replicated tensor, tensor rank 0), so that over the grid every element of the unsplit model is
written exactly once.

Two ways to move values between the ranks' shards and the unsplit vector:

* :class:`BlockExchange`: the unsplit vector cut into contiguous 1-D blocks, one per rank (the blocks
  of an :class:`hpcgpu.Decomposition` of shape ``(n_params,)``, i.e. of an :class:`hpcgpu.Field` that a
  checkpoint stores as one global dataset); two ``alltoallv`` move a buffer to the blocks and back,
  each element COPIED (never summed: -0.0 and every bit survive). Memory per rank: its shard and its
  block;
* :func:`gather_logical`: the whole unsplit vector on every rank (tests, small models), by ``allgatherv``.

Both move host buffers through the world's host collectives (:func:`hpcgpu.transport.collectives` with
``on_device=False``: MPI, on CPU and GPU jobs alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives

from apps.train.kernels.backend import array_module, to_numpy
from apps.train.nn.sequential import Sequential
from .tensor_parallel import ColumnParallelLinear, TensorGroup, mlp_layers


@dataclass(frozen=True)
class ShardPiece:
    """One parameter tensor of this rank's stage, placed in the unsplit model's flat buffer.

    Attributes
    ----------
    local_offset, local_stop : int
        Its range in this rank's flat buffer.
    logical_indices : ndarray of int64, shape (local_stop - local_offset,)
        The positions of its elements in the unsplit model's flat buffer (C order of the shard).
    writes : bool
        True on the one rank that contributes this shard to a checkpoint: data replica 0 and,
        for a tensor every tensor rank holds whole, tensor rank 0.
    """

    local_offset: int
    local_stop: int
    logical_indices: np.ndarray
    writes: bool


def _entries_of(layout, leaf):
    return [entry for entry in layout.entries if entry.layer == leaf.name]


def _split_kind(leaf, name) -> str:
    """How a grid splits parameter ``name`` of ``leaf``: column, row or replicated."""
    if name not in getattr(leaf, "sharded_params", ()):
        return "replicated"
    return "column" if isinstance(leaf, ColumnParallelLinear) else "row"


def shard_pieces(parallel_model, data_rank: int, tensor_rank: int) -> list[ShardPiece]:
    """Where every parameter tensor of this rank's stage lies in the unsplit model (no collective).

    Parameters
    ----------
    parallel_model : apps.train.parallel.trainer.ParallelModel
    data_rank, tensor_rank : int
        This rank's coordinates (they decide which rank writes a piece).
    """
    layout = parallel_model.model.layout
    pieces = []
    for leaf, reference_leaf, reference_layout in parallel_model.leaf_pairs():
        for entry, reference_entry in zip(_entries_of(layout, leaf), _entries_of(reference_layout, reference_leaf)):
            indices = np.arange(reference_entry.offset, reference_entry.stop,
                                dtype=np.int64).reshape(reference_entry.shape)
            if hasattr(leaf, "shard"):
                indices = leaf.shard(entry.name, indices)
            if indices.shape != tuple(entry.shape):
                raise ConfigurationError(
                    f"sharded checkpoint: {leaf.name}/{entry.name} holds {tuple(entry.shape)}, its slice of the "
                    f"unsplit {reference_leaf.name}/{reference_entry.name} is {indices.shape}")
            sharded = _split_kind(leaf, entry.name) != "replicated"
            pieces.append(ShardPiece(entry.offset, entry.stop, np.ascontiguousarray(indices).reshape(-1),
                                     writes=data_rank == 0 and (tensor_rank == 0 or sharded)))
    return pieces


def owned_pieces(parallel_model, tensor_rank: int, lo: int, hi: int) -> list[ShardPiece]:
    """The pieces of a ZeRO-1 optimiser state: this rank's buffer part ``[lo, hi)`` (no collective).

    Under ZeRO-1 the D data replicas of a (tensor, pipeline) position each hold the optimiser state
    of one contiguous part ``[lo, hi)`` of their common flat buffer (:func:`apps.train.parallel.zero.shard_ranges`).
    The pieces of :func:`shard_pieces` clipped to that part, with local offsets counted from ``lo``
    (positions in the owned state arrays); a piece is written by the replica that owns it (and, for
    a tensor every tensor rank holds whole, by tensor rank 0), so over the grid every element of the
    unsplit model is again written exactly once.
    """
    pieces = []
    for piece in shard_pieces(parallel_model, 0, tensor_rank):   # as data replica 0 would write it
        start, stop = max(piece.local_offset, lo), min(piece.local_stop, hi)
        if stop > start:
            indices = piece.logical_indices[start - piece.local_offset:stop - piece.local_offset]
            pieces.append(ShardPiece(start - lo, stop - lo, indices, piece.writes))
    return pieces


def tensor_map(parallel_model) -> dict:
    """The unsplit model's tensors as columns: ``name``, ``offset``, ``shape``, ``split``, ``stage`` (lists).

    ``split`` is how a tensor-parallel grid cuts a tensor (``column``: axis 0, ``row``: axis 1,
    ``replicated``); ``stage`` the pipeline stage that holds it in the grid of ``parallel_model``.
    """
    # the split leaves of a T = 2 model say how each tensor is cut (no communication: layouts only)
    split = Sequential(mlp_layers(parallel_model.spec, TensorGroup(0, 2, _NoCollectives())))
    reference = parallel_model.reference()
    layer_of_leaf, stage_of_layer = [], {}
    for index, layer in enumerate(reference.layers):
        layer_of_leaf += [index] * len(layer.leaves())
    for stage, (start, stop) in enumerate(parallel_model.stage_ranges):
        stage_of_layer.update({layer: stage for layer in range(start, stop)})
    tensors = {"name": [], "offset": [], "shape": [], "split": [], "stage": []}
    for position, (leaf, split_leaf) in enumerate(zip(reference.leaves(), split.leaves())):
        for entry in _entries_of(reference.layout, leaf):
            tensors["name"].append(f"{entry.layer}/{entry.name}")
            tensors["offset"].append(int(entry.offset))
            tensors["shape"].append([int(n) for n in entry.shape])
            tensors["split"].append(_split_kind(split_leaf, entry.name))
            tensors["stage"].append(stage_of_layer[layer_of_leaf[position]])
    return tensors


class _NoCollectives:
    def allreduce(self, array, op="sum"):   # pragma: no cover - only layouts are built
        raise AssertionError("no collective while describing the tensors")


def gather_logical(world, pieces, local, n_logical: int) -> np.ndarray:
    """Collective over ``world``: the unsplit flat vector of the per-rank buffers ``local``, on every rank.

    Parameters
    ----------
    world : hpcgpu.Communicator
        Every rank of the grid.
    pieces : list of ShardPiece
        This rank's (:func:`shard_pieces`).
    local : ndarray, shape (this rank's n_params,)
        The buffer (host or device) laid out as this rank's stage.
    n_logical : int
        Parameters of the unsplit model.

    Returns
    -------
    numpy.ndarray, shape (n_logical,), the dtype of ``local``
        Every element copied from the one rank that writes it (exact).

    Raises
    ------
    ConfigurationError
        On every rank, when the ranks' pieces do not cover each element exactly once.
    """
    host = to_numpy(local)
    written = [piece for piece in pieces if piece.writes]
    indices = (np.concatenate([piece.logical_indices for piece in written]) if written
               else np.zeros(0, dtype=np.int64))
    values = (np.concatenate([host[piece.local_offset:piece.local_stop] for piece in written]) if written
              else np.zeros(0, dtype=host.dtype))
    movers = collectives(world, on_device=False)
    counts = movers.allgather(np.array([indices.size], dtype=np.int64), np.empty(world.size, dtype=np.int64))
    counts = [int(count) for count in counts]
    all_indices = movers.allgatherv(indices, np.empty(sum(counts), dtype=np.int64), counts)
    all_values = movers.allgatherv(np.ascontiguousarray(values), np.empty(sum(counts), dtype=host.dtype), counts)
    logical = np.zeros(n_logical, dtype=host.dtype)
    covered = np.zeros(n_logical, dtype=np.int64)
    offset = 0
    for count in counts:   # rank by rank, as each rank listed them
        rank_indices = all_indices[offset:offset + count]
        logical[rank_indices] = all_values[offset:offset + count]
        covered[rank_indices] += 1
        offset += count
    if not np.all(covered == 1):
        raise ConfigurationError(
            f"sharded checkpoint: the ranks' shards cover {int(np.sum(covered == 0))} element(s) of the unsplit "
            f"model not at all and {int(np.sum(covered > 1))} more than once; expected each exactly once")
    return logical


class BlockExchange:
    """Moves one rank's shard values to the 1-D blocks of the unsplit vector and back.

    Parameters
    ----------
    world : hpcgpu.Communicator
        Every rank of the grid (the same communicator as ``bounds`` describes).
    pieces : list of ShardPiece
        This rank's (:func:`shard_pieces`).
    bounds : sequence of int, length world.size + 1
        Rank ``r``'s block is ``[bounds[r], bounds[r + 1])`` of the unsplit vector (increasing, from
        0 to ``n_params``).

    Raises
    ------
    ConfigurationError
        On every rank, when the ranks' written pieces do not cover each element exactly once.

    Notes
    -----
    Collective to build (one ``alltoallv`` of counts and two of indices); each :meth:`to_blocks` /
    :meth:`from_blocks` is one ``alltoallv`` of values, through the world's host collectives.
    """

    def __init__(self, world, pieces, bounds):
        self.world = world
        self.movers = collectives(world, on_device=False)
        bounds = np.asarray(bounds, dtype=np.int64)
        self.block_lo, self.block_hi = int(bounds[world.rank]), int(bounds[world.rank + 1])
        local_positions = [np.arange(p.local_offset, p.local_stop, dtype=np.int64) for p in pieces]
        written = [index for index, piece in enumerate(pieces) if piece.writes]
        # to the blocks: this rank's written elements, grouped by the rank whose block holds them
        self._send_positions, send_indices, self._send_counts = _by_owner(
            [local_positions[i] for i in written], [pieces[i].logical_indices for i in written], bounds)
        self._recv_counts = self._exchange_counts(self._send_counts)
        received = self._alltoallv(send_indices, self._send_counts, self._recv_counts)
        self._recv_positions = received - self.block_lo
        covered = np.bincount(self._recv_positions, minlength=self.block_hi - self.block_lo)
        missing, doubled = int(np.sum(covered == 0)), int(np.sum(covered > 1))
        missing, doubled = world.allreduce(missing, op="sum"), world.allreduce(doubled, op="sum")
        if missing or doubled:
            raise ConfigurationError(
                f"sharded checkpoint: the ranks' shards cover {missing} element(s) of the unsplit model not at "
                f"all and {doubled} more than once; expected each exactly once")
        # from the blocks: every element this rank holds (written or not), requested from its owner
        self._need_positions, need_indices, self._request_counts = _by_owner(
            local_positions, [piece.logical_indices for piece in pieces], bounds)
        self._serve_counts = self._exchange_counts(self._request_counts)
        self._serve_positions = self._alltoallv(need_indices, self._request_counts, self._serve_counts) \
            - self.block_lo

    def to_blocks(self, local, block) -> None:
        """Fill ``block`` (host, shape (block_hi - block_lo,)) from this rank's buffer ``local`` (host or
        device) and the other ranks'; collective; returns None."""
        values = to_numpy(local)[self._send_positions]
        block[self._recv_positions] = self._alltoallv(values, self._send_counts, self._recv_counts)

    def from_blocks(self, block, local) -> None:
        """Fill this rank's buffer ``local`` (host or device) from the ranks' ``block`` arrays; collective;
        returns None."""
        values = np.ascontiguousarray(np.asarray(block)[self._serve_positions])
        host = np.empty(local.shape[0], dtype=local.dtype)
        host[self._need_positions] = self._alltoallv(values, self._serve_counts, self._request_counts)
        local[...] = array_module(local).asarray(host)

    def _exchange_counts(self, send_counts):
        """Element ``r`` of ``send_counts`` to rank ``r``; returns what every rank sent this one."""
        ones = [1] * self.world.size
        return self.movers.alltoallv(np.ascontiguousarray(send_counts), ones, np.empty_like(send_counts), ones)

    def _alltoallv(self, values, send_counts, recv_counts):
        values = np.ascontiguousarray(values)
        received = np.empty(int(recv_counts.sum()), dtype=values.dtype)
        return self.movers.alltoallv(values, send_counts, received, recv_counts)


def _by_owner(position_lists, index_lists, bounds):
    """``(local positions, logical indices, counts per owner rank)``, grouped by owner rank."""
    positions = np.concatenate(position_lists) if position_lists else np.zeros(0, dtype=np.int64)
    indices = np.concatenate(index_lists) if index_lists else np.zeros(0, dtype=np.int64)
    owners = np.searchsorted(bounds, indices, side="right") - 1
    order = np.argsort(owners, kind="stable")
    counts = np.bincount(owners, minlength=len(bounds) - 1).astype(np.int64)
    return positions[order], indices[order], counts

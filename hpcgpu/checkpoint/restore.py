"""Reading a checkpoint back: every rank fills its own block of each field and picks its particles.

Any old and new rank counts: a rank reads just the saved tiles that overlap its block
(:func:`read_owned_block`); particles come back exactly (same ranks) or by selection
(:func:`scan_particles`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcgpu.checkpoint import layout
from hpcgpu.checkpoint.reader import BlockReader, CheckpointInfo, read_replicated_state
from hpcgpu.errors import CheckpointError, replicated


@dataclass
class RestoredState:
    """What :meth:`CheckpointManager.load` returns (the fields were filled in place).

    Attributes
    ----------
    info : CheckpointInfo
    step : int
    replicated : dict
        The replicated state as saved (see :mod:`hpcgpu.checkpoint.replicated` for types).
    particles : dict of name -> numpy.ndarray, or None
        This rank's particles, shape ``(n_local, ...)`` per array, host memory.
    particles_exact : bool
        True when every rank got back exactly the rows it wrote, in the same order (same rank count,
        selection accepted them all), as needed for a bitwise-identical continuation.
    """

    info: CheckpointInfo
    step: int
    replicated: dict
    particles: dict | None
    particles_exact: bool

    @property
    def metadata(self) -> dict:
        return self.info.metadata


def agreed_error(message: str) -> CheckpointError:
    """A CheckpointError that every rank raises with the same text (after an agreement)."""
    return replicated(CheckpointError(message))


def restore_state(comm, info: CheckpointInfo, fields: dict, want_particles: bool, select_fn) -> RestoredState:
    """Collective: fill ``fields`` (owned cells) from checkpoint ``info`` and read its particles.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    info : CheckpointInfo
        A checkpoint already validated by :meth:`CheckpointCatalogue.inspect`.
    fields : dict of name -> hpcgpu.Field
        Filled in place only if every rank read its block (any rank count and decomposition).
    want_particles : bool
    select_fn : callable or None
        ``fn({name: rows}) -> bool mask`` choosing this rank's particles (see
        :meth:`CheckpointManager.load`).
    """
    for name, field in fields.items():
        if name not in info.index["fields"]:
            raise agreed_error(f"{info.master_file}: has no field {name!r} (it holds "
                               f"{sorted(info.index['fields'])}); expected a checkpoint of the same model")
        saved_shape, saved_dtype = info.fields[name]
        if saved_shape != tuple(field.decomposition.global_shape) or saved_dtype != np.dtype(field.dtype):
            raise agreed_error(
                f"{info.master_file}: field {name!r} is {saved_shape} {saved_dtype}, the run expects "
                f"{tuple(field.decomposition.global_shape)} {np.dtype(field.dtype)}; restart with the grid and "
                "precision of the checkpointed run")
    if want_particles and not info.index["particles"]["arrays"]:
        raise agreed_error(f"{info.master_file}: holds no particles, but particles were requested")
    same_ranks = info.n_ranks == comm.size
    if want_particles and not same_ranks and select_fn is None:
        raise agreed_error(f"{info.path} was written by {info.n_ranks} ranks and this run has {comm.size}: "
                           "pass particle_select_fn so each rank can pick the particles it owns")
    blocks, own, all_selected, replicated, problem = {}, None, True, None, None
    reader = BlockReader(info)
    try:
        for name, field in fields.items():
            blocks[name] = read_owned_block(reader, info, name, field.decomposition)
        if want_particles and same_ranks:
            own = read_particle_rows(reader, info, comm.rank)
            if select_fn is not None:
                all_selected = bool(np.all(particle_mask(select_fn, own)))
        if comm.rank == 0:
            replicated = read_replicated_state(info)
    except CheckpointError as exc:
        problem = str(exc)
    comm.check(problem is None, problem or "", error=CheckpointError)
    particles, exact = None, False
    if want_particles:
        exact = same_ranks and (select_fn is None or bool(comm.allreduce(int(all_selected), op="min")))
        if exact:
            particles = own
        else:
            try:
                particles = scan_particles(reader, info, select_fn)
            except CheckpointError as exc:
                problem = str(exc)
            comm.check(problem is None, problem or "", error=CheckpointError)
        kept = comm.allreduce(int(next(iter(particles.values())).shape[0]), op="sum")
        if kept != info.n_particles:
            raise agreed_error(f"the ranks kept {kept} of the {info.n_particles} particles of {info.path}; "
                               "particle_select_fn must choose every particle on exactly one rank")
    reader.close()
    replicated = comm.broadcast(replicated, root=0)
    for name, field in fields.items():
        field.interior[...] = field.arch.from_host(blocks[name])
    return RestoredState(info=info, step=info.step, replicated=replicated, particles=particles,
                         particles_exact=exact)


def read_owned_block(reader: BlockReader, info: CheckpointInfo, name: str, grid) -> np.ndarray:
    """This rank's block of field ``name``, assembled from the saved blocks that overlap it."""
    entry = info.index["fields"][name]
    lower, upper = np.asarray(grid.local_start), np.asarray(grid.local_stop)
    block = np.empty(tuple(grid.local_shape), dtype=np.dtype(entry["dtype"]))
    covered = 0
    for writer_rank, (start, shape) in enumerate(zip(entry["starts"], entry["shapes"])):
        start = np.asarray(start)
        overlap_lower, overlap_upper = np.maximum(lower, start), np.minimum(upper, start + np.asarray(shape))
        if np.any(overlap_upper <= overlap_lower):
            continue
        piece = reader.read("fields", name, writer_rank, tuple(overlap_lower - start), tuple(overlap_upper - start))
        block[tuple(slice(a, b) for a, b in zip(overlap_lower - lower, overlap_upper - lower))] = piece
        covered += piece.size
    if covered != block.size:
        raise CheckpointError(f"{info.master_file}: the saved blocks of {name!r} cover {covered} of this rank's "
                              f"{block.size} cells; the index is inconsistent")
    return block


def read_particle_rows(reader: BlockReader, info: CheckpointInfo, writer_rank: int, first: int = 0,
                        stop: int | None = None) -> dict:
    count = info.index["particles"]["counts"][writer_rank]
    stop = count if stop is None else stop
    rows = {}
    for name, entry in info.index["particles"]["arrays"].items():
        trailing = tuple(entry["trailing"])
        rows[name] = reader.read("particles", name, writer_rank, (first,) + (0,) * len(trailing), (stop,) + trailing)
    return rows


def particle_mask(select_fn, rows: dict) -> np.ndarray:
    n_rows = next(iter(rows.values())).shape[0]
    mask = np.asarray(select_fn(rows), dtype=bool)
    if mask.shape != (n_rows,):
        raise CheckpointError(f"particle_select_fn returned shape {mask.shape}, expected ({n_rows},)")
    return mask


def scan_particles(reader: BlockReader, info: CheckpointInfo, select_fn) -> dict:
    """Every rank reads the whole particle table, window by window, and keeps what it selects.

    Simple and correct for any old/new rank counts; it reads the table once per rank, which is fine
    for the particle counts a restart meets in practice (10^8 particles x 4 ranks reads ~10 GB).
    """
    arrays = info.index["particles"]["arrays"]
    kept = {name: [] for name in arrays}
    row_bytes = max(np.dtype(e["dtype"]).itemsize * int(np.prod(e["trailing"], dtype=np.int64)) for e in arrays.values())
    window = max(1, layout.TILE_BYTES // row_bytes)
    for writer_rank, count in enumerate(info.index["particles"]["counts"]):
        for first in range(0, count, window):
            rows = read_particle_rows(reader, info, writer_rank, first, min(count, first + window))
            mask = particle_mask(select_fn, rows)
            for name in arrays:
                kept[name].append(rows[name][mask])
    result = {}
    for name, entry in arrays.items():
        empty = np.empty((0,) + tuple(entry["trailing"]), dtype=np.dtype(entry["dtype"]))
        result[name] = np.concatenate([empty] + kept[name])
    return result

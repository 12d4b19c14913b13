"""Migration: particles that left this rank's sub-box move to the rank that owns them now.

Call it on neighbour-list rebuild steps, after wrapping the positions into the periodic box. Between two
rebuilds a particle moves by less than one sub-box, so its new owner is one of the 26 neighbours; a
particle found farther away (a time step far too large, or an exploding system) is reported by a
collective check on every rank instead of being lost.

Rows are moved together: ``positions`` and every array of ``arrays`` (velocities, ids, types, ...).
Kept particles stay first, in their old order; received particles follow in the order of the sending
rank, then the sender's order -- deterministic for a given decomposition. The leaving rows travel as
bytes, counts first, through the job's transport (:mod:`hpcgpu.particles.messages`): NumPy arrays by
MPI, CuPy arrays on the device by the job's GPU transport; only the leaving positions visit the host,
where their owners are decided.
"""

from __future__ import annotations

import numpy as np

from hpcgpu.arch import array_module
from hpcgpu.errors import NumericalError
from hpcgpu.particles.domain import bounds_in
from hpcgpu.particles.messages import exchange_rows
from hpcgpu.transport import collectives

_MIGRATION_TAG = 7001


def _pack(arrays, rows):
    """Rows of several arrays (NumPy or CuPy, one kind) as one byte buffer, shape (n_rows, row_bytes)."""
    xp = array_module(arrays[0])
    parts = [xp.ascontiguousarray(a[rows]).reshape(len(rows), int(np.prod(a.shape[1:], dtype=np.int64))).view(np.uint8)
             for a in arrays]
    return xp.ascontiguousarray(xp.concatenate(parts, axis=1))


def _unpack(buffer, templates):
    """Inverse of :func:`_pack`: arrays shaped and typed like ``templates`` (one row each), on the buffer's
    kind of memory."""
    xp = array_module(buffer)
    arrays, start = [], 0
    for template in templates:
        row_shape = template.shape[1:]
        width = template.dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        chunk = xp.ascontiguousarray(buffer[:, start:start + width])
        arrays.append(chunk.view(template.dtype).reshape((buffer.shape[0],) + row_shape))
        start += width
    return arrays


def migrate(domain, positions, arrays: dict):
    """Collective: hand particles outside this rank's sub-box to their owners; receive newcomers.

    Parameters
    ----------
    domain : hpcgpu.particles.ParticleDomain
    positions : array, shape (n_local, 3), float32/float64 (NumPy or CuPy) -- wrapped into the box
    arrays : dict of name -> array with ``n_local`` rows (any dtype and trailing shape, same backend)

    Returns
    -------
    positions : array, shape (n_local_new, 3)
    arrays : dict, same names, ``n_local_new`` rows (kept rows first, then received ones)

    Raises
    ------
    NumericalError
        On every rank, if some particle is more than one sub-box away from its old owner.
    """
    if domain.comm.size == 1:
        # One rank owns the whole (wrapped) box: nobody leaves, and the rows keep their order.
        return positions, dict(arrays)
    xp = array_module(positions)
    names = list(arrays)
    # Bounds in the positions' dtype, as owner_ranks uses below: one precision decides ownership.
    lower, upper = (xp.asarray(b) for b in bounds_in(positions.dtype, domain.subbox.lower, domain.subbox.upper))
    outside = xp.any((positions < lower) | (positions >= upper), axis=1)
    leaving = xp.nonzero(outside)[0]
    kept = xp.nonzero(~outside)[0]
    leaving_rows = [positions[leaving]] + [arrays[name][leaving] for name in names]
    leaving_positions = leaving_rows[0] if xp is np else leaving_rows[0].get()   # owners: decided on the host
    owners = domain.owner_ranks(leaving_positions)
    far = ~np.isin(owners, np.asarray(domain.neighbor_ranks, dtype=np.int64))
    message = ""
    if np.any(far):
        first = int(np.nonzero(far)[0][0])
        message = (f"{int(far.sum())} particle(s) moved farther than one sub-box since the last rebuild "
                   f"(e.g. one now at {leaving_positions[first].tolist()}, owned by rank {int(owners[first])}, "
                   f"while this rank's sub-box is {domain.subbox.lower.tolist()} .. {domain.subbox.upper.tolist()}); "
                   "expected at most one sub-box per rebuild interval. The system is probably unstable: lower "
                   "the time step, rebuild more often, or use fewer ranks (larger sub-boxes).")
    domain.comm.check(not np.any(far), message, error=NumericalError)
    # Rows travel as bytes on the arrays' kind of memory, through the job's transport (counts first).
    sends = [(_pack(leaving_rows, xp.asarray(np.nonzero(owners == peer)[0])), peer) for peer in domain.neighbor_ranks]
    row_bytes = sum(a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in leaving_rows)
    movers = collectives(domain.comm, on_device=xp is not np)
    received = exchange_rows(domain.comm, movers, sends, list(domain.neighbor_ranks), np.uint8, (row_bytes,),
                             _MIGRATION_TAG)
    incoming = _unpack(xp.concatenate(received) if received else xp.empty((0, row_bytes), np.uint8), leaving_rows)
    result = []
    for old, new in zip([positions] + [arrays[name] for name in names], incoming):
        result.append(xp.ascontiguousarray(xp.concatenate([old[kept], new.astype(old.dtype)])))
    return result[0], dict(zip(names, result[1:]))

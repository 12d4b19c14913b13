"""Point-to-point exchange with neighbours: counts first, then payloads (MPI Isend/Irecv on host arrays).

A message is identified by its peer and a tag. Particle code uses the tag to tell apart several messages
between the same two ranks (with two blocks along a periodic axis the lower and the upper neighbour are
the same rank). Messages a rank sends to itself are copied locally, never through MPI.

Both functions are collective over the ranks that appear as peers: every send must be matched by a
receive with the same tag on the peer (the particle modules guarantee it by construction).
"""

from __future__ import annotations

import numpy as np


def exchange_into(mpi, sends, receives) -> None:
    """Send ``sends`` and receive into preallocated buffers, in place. Returns None.

    Parameters
    ----------
    mpi : mpi4py.MPI.Comm
    sends : list of (peer, tag, numpy.ndarray) -- contiguous host buffers
    receives : list of (peer, tag, numpy.ndarray) -- contiguous host buffers of exactly the incoming size
    """
    from mpi4py import MPI

    me = mpi.Get_rank()
    local = {}
    requests = []
    for peer, tag, buffer in receives:
        if peer != me:
            requests.append(mpi.Irecv(buffer, source=peer, tag=tag))
    for peer, tag, buffer in sends:
        if peer == me:
            local[tag] = buffer
        else:
            requests.append(mpi.Isend(buffer, dest=peer, tag=tag))
    for peer, tag, buffer in receives:
        if peer == me:
            buffer[...] = local.pop(tag)
    MPI.Request.Waitall(requests)


def exchange(mpi, sends, receives, dtype, row_shape=()) -> list:
    """Counts first, then payloads: returns the received arrays, in the order of ``receives``.

    Parameters
    ----------
    mpi : mpi4py.MPI.Comm
    sends : list of (peer, tag, numpy.ndarray) -- arrays of shape (n_rows,) + row_shape and ``dtype``
    receives : list of (peer, tag) -- one entry per message expected
    dtype, row_shape : the element type and trailing shape of every message

    Returns
    -------
    list of numpy.ndarray, shape (n_rows_received,) + row_shape
    """
    send_counts = [np.array([len(buffer)], dtype=np.int64) for _, _, buffer in sends]
    receive_counts = [np.zeros(1, dtype=np.int64) for _ in receives]
    exchange_into(mpi, [(peer, tag, count) for (peer, tag, _), count in zip(sends, send_counts)],
                  [(peer, tag, count) for (peer, tag), count in zip(receives, receive_counts)])
    buffers = [np.empty((int(count[0]),) + tuple(row_shape), dtype=dtype) for count in receive_counts]
    exchange_into(mpi, [(peer, tag, np.ascontiguousarray(buffer, dtype=dtype)) for peer, tag, buffer in sends],
                  [(peer, tag, buffer) for (peer, tag), buffer in zip(receives, buffers)])
    return buffers

"""Counts-first exchange of particle rows with neighbours, through the job's transport.

How many particles leave a sub-box, or lie near one of its faces, only the sender knows. A particle
exchange therefore sends the row counts first, as host integers, then the rows themselves into
buffers of exactly the announced size. Both go through :func:`hpcgpu.transport.collectives`: the
counts through the host collectives (MPI), the rows through the collectives of their kind of buffer --
MPI for NumPy arrays, the job's GPU transport for CuPy arrays (NCCL on the current stream, CUDA-aware
or host-staged MPI)::

    movers = collectives(domain.comm, on_device=is_device_array(rows))
    received = exchange_rows(domain.comm, movers, sends=[(rows_for_left, left), ...],
                             sources=[right, ...], dtype=rows_for_left.dtype, row_shape=(3,), tag=7001)

Matching: the messages between two ranks pair up in the order each side lists them, separately for
each direction (:mod:`hpcgpu.transport.messages`). The particle modules list one message per direction
of :attr:`ParticleDomain.neighbors`, in that fixed order, on both sides; with two blocks along a
periodic axis the lower and the upper neighbour are the same rank and the order tells the two messages
apart. A message a rank sends to itself (one block along a periodic axis) is copied locally, never
handed to the transport; an empty message is left out on both sides alike (the counts agree).
"""

from __future__ import annotations

import numpy as np

from hpcgpu.errors import ConfigurationError
from hpcgpu.transport import collectives
from hpcgpu.transport.messages import Message, resolve_messages

#: Rows travel with tags this far above the counts' (a rank lists at most 26 messages per peer).
ROW_TAG_OFFSET = 32


def _split_local(comm, sends, receives) -> tuple[list, list, list]:
    """(remote sends, remote receives, local (send, receive) pairs) of two message lists; empty
    messages are dropped from the remote lists (the peer drops its matching one too)."""
    me = comm.rank
    sends, receives = resolve_messages(sends), resolve_messages(receives)
    local_sends = [m.array for m in sends if m.peer == me]
    local_receives = [m.array for m in receives if m.peer == me]
    if len(local_sends) != len(local_receives):
        raise ConfigurationError(f"{len(local_sends)} message(s) to this rank itself but {len(local_receives)} "
                                 "from it; expected one receive for each send to itself")
    remote_sends = [m for m in sends if m.peer != me and m.array.size]
    remote_receives = [m for m in receives if m.peer != me and m.array.size]
    return remote_sends, remote_receives, list(zip(local_sends, local_receives))


def exchange_rows_into(comm, movers, sends, receives, tag: int) -> None:
    """Collective over the peers: send ``sends`` and receive into ``receives``, in place. Returns None.

    Parameters
    ----------
    comm : hpcgpu.Communicator
        The communicator whose ranks the peers are (``movers``'); this rank's own messages are copied.
    movers : hpcgpu.transport.Collectives
        ``collectives(comm, ...)`` of the buffers' kind.
    sends, receives : sequence of (array, peer) or :class:`~hpcgpu.transport.Message`
        Contiguous buffers; each receive exactly the size of the matching send (the k-th to a peer meets
        that peer's k-th from this rank).
    tag : int
        Keeps this exchange apart from others on MPI (``tag + k`` for the k-th message to or from a peer).

    Notes
    -----
    On the device the copies and messages are ordered on the current stream: NCCL queues there, the MPI
    transports synchronise it and land the received rows on it before returning.
    """
    remote_sends, remote_receives, local = _split_local(comm, sends, receives)
    if remote_sends or remote_receives:
        movers.send_receive(sends=remote_sends, receives=remote_receives, tag=tag)
    for send, receive in local:
        receive[...] = send


def exchange_counts(comm, counts, destinations, sources, tag: int) -> list[int]:
    """Collective over the peers: ``counts[k]`` goes to ``destinations[k]``; returns the counts from
    ``sources`` (list of int, in their order). Host integers through the host collectives."""
    outgoing = [np.array([count], dtype=np.int64) for count in counts]
    incoming = [np.zeros(1, dtype=np.int64) for _ in sources]
    exchange_rows_into(comm, collectives(comm, on_device=False), list(zip(outgoing, destinations)),
                       list(zip(incoming, sources)), tag)
    return [int(count[0]) for count in incoming]


def exchange_rows(comm, movers, sends, sources, dtype, row_shape, tag: int) -> list:
    """Collective over the peers: counts first, then the rows. Returns the received arrays, in the order
    of ``sources``.

    Parameters
    ----------
    comm : hpcgpu.Communicator
    movers : hpcgpu.transport.Collectives
        ``collectives(comm, ...)`` of the rows' kind (NumPy, or CuPy when ``movers.on_device``).
    sends : list of (array, peer)
        C-contiguous arrays of shape (n_rows,) + ``row_shape`` and ``dtype``.
    sources : list of int
        The rank each expected message comes from (one entry per message).
    dtype, row_shape : numpy.dtype, tuple of int
        The element type and trailing shape of every message.
    tag : int
        The counts use ``tag``, the rows ``tag +`` :data:`ROW_TAG_OFFSET` (each plus the message's index
        per peer).

    Returns
    -------
    list of arrays, shape (n_rows_received,) + row_shape
        On the kind of memory ``movers`` moves.
    """
    xp = np
    if movers.on_device:
        import cupy as xp
    counts = exchange_counts(comm, [array.shape[0] for array, _ in sends], [peer for _, peer in sends], sources, tag)
    received = [xp.empty((count,) + tuple(row_shape), dtype=dtype) for count in counts]
    exchange_rows_into(comm, movers, sends, list(zip(received, sources)), tag + ROW_TAG_OFFSET)
    return received


__all__ = ["Message", "ROW_TAG_OFFSET", "exchange_counts", "exchange_rows", "exchange_rows_into"]

"""A paired exchange between fixed buffers, planned once and run again and again.

:meth:`Collectives.exchange <hpcgpu.transport.collectives.Collectives.exchange>` resolves its messages on
every call; on NCCL that is an address, a count and a datatype per message, a few microseconds of host
time each. An exchange that moves the same buffers every step (a particle ghost refresh: up to 26
messages each way) resolves them once here::

    refresh = PlannedExchange(movers, sends=[(send_rows, peer), ...], receives=[(ghost_rows, peer), ...])
    ...
    pack(...); refresh.run(); unpack(...)     # every step, on the current stream

On ``nccl`` a run is one NCCL group of the resolved messages queued on the stream: no host
synchronisation, capturable. On the MPI transports it is :meth:`exchange` and ``wait()`` of the
collectives (they synchronise the stream themselves). The messages pair up as for
:meth:`exchange` (:mod:`hpcgpu.transport.messages`); the buffers must stay alive and in place for as
long as the plan is used.
"""

from __future__ import annotations

from hpcgpu.transport.messages import resolve_messages
from hpcgpu.transport.nccl import grouped_send_receive, nccl_message
from hpcgpu.transport.nccl_collectives import NcclCollectives, _Queued, _stream_pointer


class PlannedExchange:
    """Paired point-to-point messages between fixed buffers, resolved once.

    Parameters
    ----------
    movers : hpcgpu.transport.Collectives
        The collectives of the buffers' kind (``collectives(comm, ...)``).
    sends, receives : sequence of (array, peer) or :class:`~hpcgpu.transport.Message`
        As for :meth:`Collectives.exchange`; C-contiguous buffers that stay alive while the plan is used.
    tag : int
        Separates this exchange from others on MPI (ignored by NCCL).
    """

    def __init__(self, movers, sends=(), receives=(), tag: int = 0):
        self.movers = movers
        self.sends, self.receives = resolve_messages(sends), resolve_messages(receives)
        self.tag = int(tag)
        self._nccl_messages = None
        if isinstance(movers, NcclCollectives):
            self._nccl_messages = ([nccl_message(m.array, m.peer) for m in self.sends],
                                   [nccl_message(m.array, m.peer) for m in self.receives])

    def start(self, stream=None):
        """Post every message (on ``stream``, default the current one) and return the handle whose
        ``wait()`` completes them; on NCCL the handle has nothing to wait for (the stream orders it)."""
        if self._nccl_messages is not None:
            sends, receives = self._nccl_messages
            grouped_send_receive(self.movers.nccl_comm, sends, receives, _stream_pointer(stream))
            return _Queued()
        return self.movers.exchange(self.sends, self.receives, self.tag, stream)

    def run(self, stream=None) -> None:
        """:meth:`start` and ``wait()``: on NCCL queued on the stream, on MPI landed on it."""
        self.start(stream).wait()


__all__ = ["PlannedExchange"]

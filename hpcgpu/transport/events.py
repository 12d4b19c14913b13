"""What a transport keeps per planned exchange: reused CUDA events, staging buffers, resolved messages.

Creating a CUDA event or a pinned buffer costs microseconds to milliseconds on the hot path, so each
planned exchange (:class:`hpcgpu.halo.HaloExchange`) owns one :class:`ExchangeTransportState`, declared
as its ``transport_state`` attribute, which the transports fill on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExchangeTransportState:
    """Per-exchange state of the transports (all empty until a transport first needs it).

    Attributes
    ----------
    events : dict of str -> cupy.cuda.Event
        ``"ready"`` (compute stream -> communication stream) and ``"done"`` (back), see :func:`exchange_event`.
    staging : tuple of (list, list) or None
        Pinned host buffers of ``mpi-staged`` (sends, receives).
    nccl_messages : tuple of (list, list) or None
        Resolved :class:`~hpcgpu.transport.nccl.NcclMessage` lists (receives, sends) of ``nccl``.
    cuda_graph : cupy.cuda.Graph or None
        The captured exchange of ``nccl`` with ``graph=True``.
    graph_warm : bool
        Whether one exchange ran eagerly already (NCCL connected, kernels compiled) so capturing is safe.
    """

    events: dict = field(default_factory=dict)
    staging: tuple | None = None
    nccl_messages: tuple | None = None
    cuda_graph: object = None
    graph_warm: bool = False


def exchange_event(exchange, name: str, stream):
    """Record the exchange's event ``name`` ("ready" or "done") on ``stream`` and return it.

    Each planned exchange owns one event per name. Re-recording is safe: a stream that waits on an
    event waits for its most recent record at the time of the wait call.
    """
    events = exchange.transport_state.events
    event = events.get(name)
    if event is None:
        import cupy

        event = events[name] = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(stream)
    return event


class EventHandle:
    """The compute stream's side of work queued on the communication stream: ``wait()`` makes
    ``compute_stream`` wait for ``done_event`` (no host synchronisation)."""

    __slots__ = ("compute_stream", "done_event")

    def __init__(self, compute_stream, done_event):
        self.compute_stream, self.done_event = compute_stream, done_event

    def wait(self) -> None:
        self.compute_stream.wait_event(self.done_event)

"""CUDA events reused across exchanges (creating one costs microseconds on the hot path)."""

from __future__ import annotations


def exchange_event(exchange, name: str, stream):
    """Record the exchange's event ``name`` ("ready" or "done") on ``stream`` and return it.

    Each planned exchange owns one event per name. Re-recording is safe: a stream that waits on an
    event waits for its most recent record at the time of the wait call.
    """
    events = exchange.__dict__.setdefault("_events", {})
    event = events.get(name)
    if event is None:
        import cupy

        event = events[name] = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(stream)
    return event

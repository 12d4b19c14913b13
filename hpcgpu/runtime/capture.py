"""CUDA graph captures of this process, and device calls that must wait until none is in progress.

A device-wide synchronisation (``cudaDeviceSynchronize``) while a stream captures a CUDA graph breaks
that capture: the call fails and ``end_capture`` then raises ``cudaErrorStreamCaptureInvalidated``.
Finalisers run wherever the garbage collector happens to run -- in the middle of a capture too -- so a
finaliser that must synchronise (dropping graphs that hold NCCL operations before their communicator
goes, say) hands that work to :func:`when_not_capturing`: it runs at once, or right after the last
capture in progress has ended. Every capture in hpcgpu and its apps goes through :func:`capture_graph`,
which keeps the count.

Pure Python (no CUDA import): the count works, and is tested, without a GPU.
"""

from __future__ import annotations

import threading
import warnings

_lock = threading.Lock()
_in_progress = 0
_deferred: list = []


def capture_graph(stream, record):
    """Capture what ``record()`` queues on ``stream`` as a CUDA graph and return it (not uploaded).

    Parameters
    ----------
    stream : cupy.cuda.Stream
        A non-default stream, current while ``record`` runs if its launches are to be captured (the
        caller makes it current: :func:`hpcgpu.arch.on_stream`).
    record : callable
        Queues the work, launches only (no synchronisation with the host).

    Returns
    -------
    cupy.cuda.Graph
        If ``record`` raises, the capture is ended and the exception propagates.
    """
    global _in_progress
    with _lock:
        _in_progress += 1
    try:
        stream.begin_capture()
        try:
            record()
        finally:
            graph = stream.end_capture()
    finally:
        with _lock:
            _in_progress -= 1
            ready = list(_deferred) if _in_progress == 0 else []
            if ready:
                _deferred.clear()
        _run(ready)
    return graph


def in_progress() -> bool:
    """True while a :func:`capture_graph` of this process is between its begin and its end."""
    return _in_progress > 0


def when_not_capturing(work) -> None:
    """Run ``work()`` now, or, while a capture is in progress, as soon as the last one has ended.

    ``work`` must not raise: an exception of deferred work is reported as a warning (it has no caller
    to go to, like an exception in a finaliser).
    """
    with _lock:
        if _in_progress:
            _deferred.append(work)
            return
    work()


def _run(works) -> None:
    for work in works:
        try:
            work()
        except Exception as error:   # noqa: BLE001 -- no caller to raise to (see when_not_capturing)
            warnings.warn(f"work deferred until the end of a CUDA graph capture failed: "
                          f"{type(error).__name__}: {error}", RuntimeWarning, stacklevel=2)

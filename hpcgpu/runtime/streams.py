"""Switching CuPy's current stream for a block of code (re-exported as :func:`hpcgpu.arch.on_stream`)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def on_stream(stream):
    """Make CuPy ``stream`` the current stream inside the block, then restore the previous one.

    The stream is pushed on CuPy's stack of current streams (``with stream:``), so CuPy's own
    ``with``-blocks inside return to it. On exit the previous stream is current again, also when it
    had been made current with ``Stream.use()``, which CuPy's stack does not record (a bare
    ``with stream:`` would then leave the null stream current, and work would silently stop being
    ordered with the compute stream).
    """
    import cupy

    previous = cupy.cuda.get_current_stream()
    try:
        with stream:
            yield stream
    finally:
        if cupy.cuda.get_current_stream() != previous:
            previous.use()

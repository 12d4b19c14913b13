"""One message for a failed write: which file, what the system said, what is still safe."""

from __future__ import annotations

import errno

from hpcgpu.errors import OutputError

_ADVICE = {errno.ENOSPC: "the file system is full: free space or choose another directory, then restart "
                         "with --restart latest",
           errno.EDQUOT: "the disk quota is exhausted: free space or choose another directory, then restart "
                         "with --restart latest",
           errno.EROFS: "the file system is read-only",
           errno.EACCES: "permission denied: choose a directory you can write",
           errno.EIO: "the storage reported an I/O error"}


def output_error(path, exc: OSError, intact: str = "") -> OutputError:
    """An :class:`OutputError` for ``exc`` raised while writing ``path``; ``intact`` says what survived."""
    reason = exc.strerror or str(exc)
    advice = _ADVICE.get(exc.errno, "")
    text = f"writing {path} failed: {reason}"
    if intact:
        text += f"; {intact}"
    if advice:
        text += f" ({advice})"
    return OutputError(text)

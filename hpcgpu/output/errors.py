"""One message for a failed write: which file, what the system said, what is still safe.

HDF5 reports a failed write in several lines (and h5py again for every object it frees afterwards):
:func:`failure_text` makes one line of it, :func:`is_storage_failure` tells a full disk or an I/O error
from a bug, and :func:`quiet_hdf5_teardown` drops h5py's echoes of a failure that is reported once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import traceback

from hpcgpu.errors import OutputError

_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG}
_HDF5_ERRNO = re.compile(r"errno = (\d+)")

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


def failure_errno(exc: BaseException) -> int | None:
    """The errno behind ``exc`` (an OSError's, or the one HDF5 quotes in its message)."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    found = _HDF5_ERRNO.search(str(exc))
    return int(found.group(1)) if found else None


def failure_text(exc: BaseException) -> str:
    """One line for a failed write: the system's reason when there is one, else the exception's first line."""
    number = failure_errno(exc)
    if number is not None:
        return f"{os.strerror(number)} (errno {number})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def is_storage_failure(exc: BaseException) -> bool:
    """True when the storage refused the write (full disk, quota, I/O error, read-only file system)."""
    return failure_errno(exc) in _STORAGE_ERRNOS


@contextlib.contextmanager
def quiet_hdf5_teardown():
    """Drop the "Exception ignored in h5py ObjectID.__dealloc__" reports of a failed write while in the block.

    After a write fails (a full disk), h5py closes the file's objects as they are freed and HDF5
    fails to flush each one again: dozens of tracebacks of one failure that the job reports once, by
    name. Other unraisable exceptions pass to the previous hook.
    """
    previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

    def from_h5py_dealloc(tb) -> bool:
        frames = traceback.extract_tb(tb) if tb is not None else []
        return bool(frames) and "h5py/_objects" in frames[-1].filename

    def unraisable_hook(unraisable):
        if "ObjectID" in repr(unraisable.object) or from_h5py_dealloc(unraisable.exc_traceback):
            return
        previous_unraisable(unraisable)

    def except_hook(kind, value, tb):   # Cython prints the full traceback first, through sys.excepthook
        if from_h5py_dealloc(tb):
            return
        previous_except(kind, value, tb)

    sys.unraisablehook, sys.excepthook = unraisable_hook, except_hook
    try:
        yield
    finally:
        sys.unraisablehook, sys.excepthook = previous_unraisable, previous_except

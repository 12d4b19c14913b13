"""Durable file operations: fsync of files and directories, atomic rename, removal, fault injection.

A rename is atomic on POSIX file systems (local, NFS, Lustre, GPFS): a reader sees the old name or
the new one, never half a directory. It is *durable* only once the parent directory is fsync'd,
which is why :func:`rename_durably` does both.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: Environment variable for test-only fault injection: ``POINT`` or ``POINT:RANK`` (see :func:`fault_point`).
FAULT_VARIABLE = "HPCGPU_CHECKPOINT_FAULT"
#: Exit code of a process killed by an injected fault.
FAULT_EXIT_CODE = 86


def fsync_path(path) -> None:
    """Flush a file's (or a directory's) data and metadata to stable storage."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    except OSError:
        # Some file systems refuse fsync on directories (EINVAL); their renames are durable anyway.
        if not Path(path).is_dir():
            raise
    finally:
        os.close(descriptor)


def rename_durably(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target`` (a directory that must not exist yet) and fsync the parent."""
    os.rename(source, target)
    fsync_path(target.parent)


def remove_tree(path: Path) -> None:
    """Remove a directory tree; first rename it to ``*.tmp`` so a half-removed tree never looks valid."""
    if not path.exists():
        return
    if not path.name.endswith(".tmp"):
        doomed = path.with_name(path.name + ".removing.tmp")
        if doomed.exists():
            shutil.rmtree(doomed, ignore_errors=True)
        os.rename(path, doomed)
        path = doomed
    shutil.rmtree(path, ignore_errors=True)


def fault_point(name: str, rank: int) -> None:
    """Test hook: end this process abruptly at the named point if ``$HPCGPU_CHECKPOINT_FAULT`` asks.

    ``HPCGPU_CHECKPOINT_FAULT=mid-rank-file:1`` kills rank 1 after it wrote part of its rank file;
    without ``:RANK`` every rank dies there. ``os._exit`` skips all cleanup, like a node failure or
    ``kill -9``. Points: ``mid-rank-file``, ``after-rank-file``, ``mid-master``, ``before-rename``.
    """
    request = os.environ.get(FAULT_VARIABLE)
    if not request:
        return
    point, _, which = request.partition(":")
    if point == name and (not which or int(which) == rank):
        os._exit(FAULT_EXIT_CODE)

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
    if fault_requested(name, rank, os.environ.get(FAULT_VARIABLE)):
        os._exit(FAULT_EXIT_CODE)


def fault_requested(name: str, rank: int, request: str | None) -> bool:
    """True if ``request`` (a ``$HPCGPU_CHECKPOINT_FAULT`` value: ``POINT`` or ``POINT:RANK``) names
    this point on this rank. The layout process gets the request from the app with every job."""
    if not request:
        return False
    point, _, which = request.partition(":")
    return point == name and (not which or int(which) == rank)


def publish_checkpoint(temporary: Path, final: Path, keep: int) -> None:
    """Rank 0's commit: rename ``temporary`` to ``final`` durably, keep the newest ``keep`` checkpoints
    of the directory and remove ``*.tmp`` debris of crashed saves.

    Plain file-system work (no HDF5, no MPI), so the layout process can do it for asynchronous saves.
    """
    from hpcgpu.checkpoint import layout

    temporary, final = Path(temporary), Path(final)
    if final.exists():  # the same step saved again (a restart from an older checkpoint)
        remove_tree(final)
    rename_durably(temporary, final)
    directory = final.parent
    found = [(layout.step_of(p.name), p) for p in directory.iterdir() if p.is_dir()]
    complete = [p for step, p in sorted((s, p) for s, p in found if s is not None)]
    for path in complete[:-keep]:
        remove_tree(path)
    for path in directory.glob(f"ckpt_*{layout.TEMPORARY_SUFFIX}"):
        remove_tree(path)  # debris of crashed saves (nothing else is in flight now)

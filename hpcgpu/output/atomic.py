"""Small files written whole or not at all: summaries, ``environment.json``, histories.

:func:`write_atomic` writes to a temporary file in the same directory, syncs it and renames it over
the target, so a reader (or a restart) sees the previous version or the new one, never a truncated
file. A failed write (a full disk) raises :class:`hpcgpu.errors.OutputError` naming the file and
leaves the previous version in place. :func:`fsync_path` flushes a file or a directory (after a rename
in it) to stable storage; the checkpoints and the record files use it too.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcgpu.output.errors import output_error


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


def write_atomic(path, data: bytes | str) -> None:
    """Replace ``path`` by ``data`` atomically (rank-local; creates no directory). Returns None."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        raise output_error(path, exc, "the previous version of the file, if any, is intact") from None


def save_figure(figure, path, **savefig_options) -> None:
    """Save a matplotlib ``figure`` to ``path`` atomically (PNG by the suffix); see :func:`write_atomic`."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig_options)
    write_atomic(path, buffer.getvalue())

"""Room for a checkpoint: checked before it is written.

Before a checkpoint is written, rank 0 compares the free space of the checkpoint directory with what
the checkpoint needs (:func:`space_problem`), so a filling disk ends the run with one message naming
the directory, before HDF5 meets the full disk. A write can still fail (another job filled the disk
meanwhile, an I/O error): :mod:`hpcgpu.output.errors` makes one line of it.
"""

from __future__ import annotations

import os


#: Checkpoint bytes beyond the arrays: HDF5 metadata, checksums, the master file (per file written).
OVERHEAD_PER_FILE = 64 << 10
#: Relative margin on the array bytes (chunk rounding, checksum tiles).
MARGIN = 0.05

#: Set to 0 to skip the free-space check (a file system whose ``statvfs`` does not reflect your quota).
SPACE_CHECK_VARIABLE = "HPCGPU_CHECKPOINT_SPACE_CHECK"


def _size(n_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{int(n_bytes)} bytes"


def space_problem(directory, array_bytes: int, n_files: int) -> str | None:
    """Why ``directory`` cannot take a checkpoint of ``array_bytes`` in ``n_files`` files (None: it can)."""
    if os.environ.get(SPACE_CHECK_VARIABLE) == "0":
        return None
    needed = int(array_bytes * (1 + MARGIN)) + n_files * OVERHEAD_PER_FILE
    try:
        status = os.statvfs(directory)
    except OSError:
        return None   # nothing to compare with: the write itself will tell
    free = status.f_bavail * status.f_frsize
    if free >= needed:
        return None
    return (f"the checkpoint needs about {_size(needed)} in {directory}, which has {_size(free)} free: free "
            f"space or pass another --checkpoint-dir, then restart with --restart latest")

"""Names and shapes of the on-disk layout (see ``docs/checkpoint.md``).

A checkpoint of step 123 is one directory ``ckpt_000000123/`` holding::

    checkpoint.h5        master file: metadata, replicated state, index, and HDF5 Virtual Datasets
                         that present every field and particle array as one global array
    rank_00000.h5 ...    one file per writing rank: its owned block of each field (no ghost cells),
                         its particles, and a CRC32 per checksum tile of every array

(With parallel HDF5 there is only ``checkpoint.h5``, holding the global arrays themselves.)

Arrays are cut into *checksum tiles*: whole trailing axes, and as many leading-axis rows as fit in
:data:`TILE_BYTES`. In per-rank files the HDF5 chunks are exactly these tiles, so a reader that
needs part of a block reads the tiles that cover it (whole HDF5 chunks, which HDF5 reads anyway)
and verifies each one's CRC32 before using a byte of it.
"""

from __future__ import annotations

import math
import re

import numpy as np

#: Value of the ``format`` attribute of every master and rank file.
FORMAT = "hpcgpu-checkpoint"
#: Bumped when the layout changes incompatibly; readers refuse versions they do not know.
FORMAT_VERSION = 1
#: Target size of one checksum tile (and HDF5 chunk) in bytes.
TILE_BYTES = 4 * 2**20

MASTER_FILE = "checkpoint.h5"
DIRECTORY_PATTERN = re.compile(r"^ckpt_(\d+)$")
TEMPORARY_SUFFIX = ".tmp"

#: How the arrays were stored: one file per rank plus a VDS master, or one parallel-HDF5 file.
LAYOUT_PER_RANK = "per-rank-files"
LAYOUT_SINGLE_FILE = "single-file"


def directory_name(step: int) -> str:
    """``ckpt_000000123`` for step 123 (zero-padded so names sort like steps)."""
    return f"ckpt_{int(step):09d}"


def rank_file_name(rank: int) -> str:
    return f"rank_{int(rank):05d}.h5"


def step_of(name: str) -> int | None:
    """The step encoded in a checkpoint directory name, or None for any other name (``*.tmp`` included)."""
    match = DIRECTORY_PATTERN.match(name)
    return int(match.group(1)) if match else None


def tile_shape(shape, itemsize: int, target_bytes: int = TILE_BYTES) -> tuple[int, ...]:
    """Checksum-tile shape for an array of ``shape``: whole trailing axes, leading axes cut to fit.

    Every entry is at least 1 and at most the array's extent (HDF5 chunks must fit the dataset).
    Zero-sized arrays get a tile of ones (they have no tiles).
    """
    shape = tuple(int(n) for n in shape)
    if any(n == 0 for n in shape):
        return (1,) * len(shape)
    tile = list(shape)
    for axis in range(len(shape)):
        if math.prod(tile) * itemsize <= target_bytes:
            break
        rest = math.prod(tile[axis + 1:]) * itemsize
        tile[axis] = max(1, min(shape[axis], target_bytes // rest))
    return tuple(tile)


def tile_grid(shape, tile) -> tuple[int, ...]:
    """Number of tiles per axis (the shape of the CRC32 array)."""
    return tuple(-(-int(n) // int(t)) if n else 0 for n, t in zip(shape, tile))


def covering_tiles(lower, upper, tile) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Tile-index range ``[first, stop)`` per axis covering the block-local region ``[lower, upper)``."""
    first = tuple(lo // t for lo, t in zip(lower, tile))
    stop = tuple(-(-hi // t) for hi, t in zip(upper, tile))
    return first, stop


def dtype_name(dtype) -> str:
    """A portable dtype string (``<f8``) for attributes; read back with :func:`parse_dtype`."""
    return np.dtype(dtype).str


def parse_dtype(text) -> np.dtype:
    if isinstance(text, bytes):
        text = text.decode()
    dtype = np.dtype(str(text))
    if dtype.hasobject:
        raise ValueError(f"object dtype {text!r} is not allowed in a checkpoint")
    return dtype

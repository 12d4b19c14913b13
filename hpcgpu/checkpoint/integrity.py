"""CRC32 checksums of checksum tiles (see :mod:`hpcgpu.checkpoint.layout`).

The writer computes one CRC32 per tile of every array it writes, from the very bytes it hands to
HDF5; the reader recomputes them over the tiles it reads and compares before the data is used. A
flipped bit anywhere in the data of a tile, or a tile that HDF5 silently returns as fill values
(a truncated or damaged chunk), is caught. ``zlib.crc32`` runs at several GB/s and releases the GIL,
so checksums cost little next to the disk.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np


def crc32(array) -> int:
    """CRC32 of the bytes of ``array`` in C order."""
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8)) & 0xFFFFFFFF


def tile_slices(index, tile, shape) -> tuple[slice, ...]:
    """Slices (in the array's own coordinates) of the tile at tile-grid position ``index``."""
    return tuple(slice(i * t, min((i + 1) * t, n)) for i, t, n in zip(index, tile, shape))


def iter_tiles(grid):
    """All tile-grid positions of a grid with ``grid`` tiles per axis, in C order."""
    return itertools.product(*(range(n) for n in grid))


def tile_checksums(array: np.ndarray, tile, grid) -> np.ndarray:
    """CRC32 of every tile of ``array``; shape ``grid``, dtype uint32."""
    crcs = np.zeros(grid, dtype=np.uint32)
    for index in iter_tiles(grid):
        crcs[index] = crc32(array[tile_slices(index, tile, array.shape)])
    return crcs


def find_bad_tiles(region: np.ndarray, first_tile, tile, block_shape, crcs) -> list[tuple[int, ...]]:
    """Tiles of ``region`` whose CRC32 differs from ``crcs``.

    Parameters
    ----------
    region : numpy.ndarray
        Whole tiles of one block: the block-local box starting at ``first_tile * tile``.
    first_tile : tuple of int
        Tile-grid position of the region's first tile.
    tile : tuple of int
        Tile shape.
    block_shape : tuple of int
        Shape of the whole block (the last tile along an axis may be short).
    crcs : numpy.ndarray of uint32
        Stored CRC32 of every tile of the block.
    """
    origin = tuple(f * t for f, t in zip(first_tile, tile))
    grid = tuple(-(-n // t) for n, t in zip(region.shape, tile))
    bad = []
    for offset in iter_tiles(grid):
        index = tuple(int(f + o) for f, o in zip(first_tile, offset))   # plain ints: they go into messages
        block_slices = tile_slices(index, tile, block_shape)
        local = tuple(slice(s.start - o, s.stop - o) for s, o in zip(block_slices, origin))
        if crc32(region[local]) != int(crcs[index]):
            bad.append(index)
    return bad

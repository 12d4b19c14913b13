"""The bulk bytes of a rank file, written outside HDF5 with ``os.pwrite``.

h5py holds Python's GIL for the whole of every HDF5 call, including the ``write`` system calls
inside ``H5Dwrite``. A background checkpoint writer that pushes gigabytes through h5py therefore
stalls the stepping thread, which launches GPU kernels from Python. Instead, the rank file is
created by h5py with *contiguous* datasets whose storage is allocated at creation (their file
offsets are known, nothing is written into them), the file is closed, and the array bytes go into
those offsets with ``os.pwrite``, which releases the GIL, as does ``zlib.crc32`` over large buffers.
The result is an ordinary HDF5 file (``h5py``, ``h5dump`` and the Virtual Datasets of the master
file read it), written at the speed of the disk.

Every checksum tile (see :mod:`hpcgpu.checkpoint.layout`) of a C-ordered array is one contiguous
byte range, and the tiles follow each other in C order, so an array is written as a sequence of
*slabs* (consecutive tiles, up to :data:`SLAB_BYTES`): pack the slab if the source is strided (a
field's interior), CRC32 each of its tiles, and hand it to a second thread that ``pwrite``\\ s it
while the next slab is packed and checksummed. With a
:class:`~hpcgpu.checkpoint.filesystem.WriteBehind`, that thread also sends each slab to the disk
at once and drops its pages once written, so the disk works during the whole write instead of
during the final ``fsync`` only. Slabs are small (a few tiles): the pack buffers and the page cache
in flight stay small, and both are reused while their memory is warm.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hpcgpu.checkpoint.integrity import iter_tiles, tile_slices

#: Bytes handed to one ``pwrite`` (and packed at once from a strided source): two 4 MiB tiles.
#: Small enough that the two pack buffers (first-touched once per manager) and the write-behind
#: window stay warm in the caches; 64 MiB slabs were slower on every disk measured.
SLAB_BYTES = 8 * 2**20
#: dtype kinds whose NumPy bytes are exactly the bytes h5py stores (bool, integers, floats, complex).
RAW_KINDS = "biufc"


def raw_writable(dtype) -> bool:
    """True if arrays of ``dtype`` can bypass HDF5 (plain numbers; no structured or string types)."""
    dtype = np.dtype(dtype)
    return dtype.kind in RAW_KINDS and dtype.fields is None and dtype.subdtype is None


class Scratch:
    """Two reusable pack buffers (double buffering); reused between saves, because first-touching
    fresh memory costs page faults at a fraction of the copy speed."""

    def __init__(self):
        self._buffers = [np.empty(0, np.uint8), np.empty(0, np.uint8)]

    def buffer(self, which: int, n_bytes: int) -> np.ndarray:
        if self._buffers[which].size < n_bytes:
            self._buffers[which] = np.empty(n_bytes, np.uint8)
        return self._buffers[which][:n_bytes]


def pwrite_all(descriptor: int, data, offset: int) -> None:
    """Write all of ``data`` at byte ``offset`` of the open file (loops over short writes)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.pwrite(descriptor, view, offset)  # may be short (Linux caps one call at ~2 GiB)
        view, offset = view[written:], offset + written


def _slabs(shape, tile, itemsize: int):
    """Consecutive tiles grouped into slabs: ``(first_element, n_elements, [(tile_index, n_elements)], rows)``.

    ``rows`` is the leading-axis row range of the slab when the tiles cut only axis 0 (one copy
    packs the whole slab), else None (packed tile by tile).
    """
    grid = tuple(-(-n // t) for n, t in zip(shape, tile))
    whole_rows = tuple(tile[1:]) == tuple(shape[1:])
    row_size = math.prod(shape[1:])
    limit = max(1, SLAB_BYTES // itemsize)
    first, size, tiles = 0, 0, []
    for index in iter_tiles(grid):
        n_elements = math.prod(s.stop - s.start for s in tile_slices(index, tile, shape))
        if tiles and size + n_elements > limit:
            yield first, size, tiles, (first // row_size, (first + size) // row_size) if whole_rows else None
            first, size, tiles = first + size, 0, []
        tiles.append((index, n_elements))
        size += n_elements
    if tiles:
        yield first, size, tiles, (first // row_size, (first + size) // row_size) if whole_rows else None


#: Threads that checksum the tiles of a slab concurrently (``zlib.crc32`` releases the GIL). A zlib
#: without SIMD CRC runs at ~1 GB/s per core, below a fast disk; several cores keep up with it.
CRC_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
_crc_pool = None
_crc_pool_lock = threading.Lock()


def _crc_executor():
    """The process-wide checksum threads (created on first use), or None with one CPU."""
    global _crc_pool
    if CRC_THREADS < 2:
        return None
    with _crc_pool_lock:
        if _crc_pool is None:
            _crc_pool = ThreadPoolExecutor(max_workers=CRC_THREADS, thread_name_prefix="checkpoint-crc")
        return _crc_pool


def _checksum_tiles(data, tiles, itemsize: int, crcs: np.ndarray) -> None:
    """CRC32 of each tile's bytes in ``data`` (the tiles in order, back to back) into ``crcs[index]``."""
    spans, position = [], 0
    for index, n_elements in tiles:
        spans.append((index, position, position + n_elements * itemsize))
        position += n_elements * itemsize
    executor = _crc_executor() if len(spans) > 1 else None
    if executor is None:
        values = [zlib.crc32(data[start:stop]) for _, start, stop in spans]
    else:
        values = list(executor.map(lambda span: zlib.crc32(data[span[1]:span[2]]), spans))
    for (index, _, _), value in zip(spans, values):
        crcs[index] = value & 0xFFFFFFFF


def _write_slab(descriptor: int, data, offset: int, write_behind) -> None:
    pwrite_all(descriptor, data, offset)
    if write_behind is not None:
        write_behind.written(offset, data.nbytes)


def write_array(descriptor: int, offset: int, array: np.ndarray, tile, scratch: Scratch,
                write_behind=None) -> np.ndarray:
    """Write ``array`` in C order at byte ``offset`` of the open file; return its CRC32 per tile.

    Parameters
    ----------
    descriptor : int
        File opened for writing.
    offset : int
        Where the dataset's contiguous storage starts (``dataset.id.get_offset()``).
    array : numpy.ndarray
        Any strides; its bytes are written in C order.
    tile : tuple of int
        Checksum-tile shape (:func:`hpcgpu.checkpoint.layout.tile_shape`).
    scratch : Scratch
        Pack buffers for a strided ``array``.
    write_behind : hpcgpu.checkpoint.filesystem.WriteBehind, optional
        Told about every slab right after its ``pwrite`` (in the writing thread).

    Returns
    -------
    numpy.ndarray of uint32, shape = the tile grid
        CRC32 of exactly the bytes written for each tile.
    """
    shape, itemsize = array.shape, array.dtype.itemsize
    grid = tuple(-(-n // t) for n, t in zip(shape, tile))
    crcs = np.zeros(grid, dtype=np.uint32)
    contiguous = array.flags.c_contiguous
    flat = array.reshape(-1).view(np.uint8) if contiguous else None
    slabs = list(_slabs(shape, tile, itemsize))
    # A second thread writes slab k while this one packs and checksums slab k + 1 (both release the
    # GIL); a single slab (the common small checkpoint) is written inline.
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-pwrite") if len(slabs) > 1 else None
    pending = None
    try:
        for number, (first, size, tiles, rows) in enumerate(slabs):
            n_bytes = size * itemsize
            if contiguous:
                data = flat[first * itemsize:first * itemsize + n_bytes]
            else:
                # Buffer ``number % 2`` was last used by slab ``number - 2``, whose write was waited
                # for before slab ``number - 1`` was submitted.
                data = scratch.buffer(number % 2, n_bytes)
                if rows is not None:
                    np.copyto(data.view(array.dtype).reshape((rows[1] - rows[0],) + shape[1:]), array[rows[0]:rows[1]])
                else:
                    position = 0
                    for index, n_elements in tiles:
                        source = array[tile_slices(index, tile, shape)]
                        piece = data[position:position + n_elements * itemsize].view(array.dtype).reshape(source.shape)
                        np.copyto(piece, source)
                        position += n_elements * itemsize
            _checksum_tiles(data, tiles, itemsize, crcs)
            if executor is None:
                _write_slab(descriptor, data, offset + first * itemsize, write_behind)
                continue
            if pending is not None:
                pending.result()
            pending = executor.submit(_write_slab, descriptor, data, offset + first * itemsize, write_behind)
        if pending is not None:
            pending.result()
    finally:
        if executor is not None:
            executor.shutdown(wait=True)
    return crcs


def contiguous_creation_properties():
    """HDF5 dataset-creation properties: contiguous, storage allocated at creation, never filled.

    With these, creating a dataset reserves its bytes in the file (``get_offset`` is known at once)
    and HDF5 writes nothing into them; :func:`write_array` fills them.
    """
    import h5py

    properties = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    properties.set_layout(h5py.h5d.CONTIGUOUS)
    properties.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    properties.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return properties

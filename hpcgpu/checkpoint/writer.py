"""Writing one checkpoint: rank files, the master file with Virtual Datasets, or one parallel file.

The order of a save (driven by :class:`~hpcgpu.checkpoint.CheckpointManager`)::

    every rank: snapshot to host -> describe its blocks -> allgather descriptions -> build the index
    every rank: write rank_RRRRR.h5 into ckpt_N.tmp/, flush, fsync          (here)
    rank 0:     write checkpoint.h5 (metadata, replicated state, index, VDS), fsync   (here)
    all ranks:  agree that every file is durable (one reduction)
    rank 0:     rename ckpt_N.tmp -> ckpt_N, fsync the parent directory, remove old checkpoints
"""

from __future__ import annotations

import datetime
import json
import math
import os
from typing import NamedTuple

import numpy as np

from hpcgpu.checkpoint import bulk, identity, layout
from hpcgpu.checkpoint.filesystem import WriteBehind, fault_point
from hpcgpu.checkpoint.integrity import crc32, iter_tiles, tile_slices
from hpcgpu.checkpoint.replicated import replicated_digests, write_replicated
from hpcgpu.output.atomic import fsync_path


# ---------------------------------------------------------------------- index
def describe(snapshot) -> dict:
    """What this rank writes (small; allgathered so that every rank knows the whole index)."""
    return {
        "fields": {name: {"start": list(b.start), "shape": list(b.data.shape), "global_shape": list(b.global_shape),
                          "dtype": layout.dtype_name(b.data.dtype), "dims": list(b.dims), "periodic": list(b.periodic),
                          "attributes": dict(b.attributes)}
                   for name, b in snapshot.fields.items()},
        "particles": {name: {"count": int(a.shape[0]), "trailing": list(a.shape[1:]), "dtype": layout.dtype_name(a.dtype)}
                      for name, a in snapshot.particles.items()},
        "digests": replicated_digests(snapshot.replicated),
    }


def build_index(descriptions: list[dict]) -> tuple[dict, str | None]:
    """Combine every rank's description into the index; also return a problem description or None.

    Every rank runs this on the same allgathered list, so every rank finds the same problem and can
    raise without another round of communication.
    """
    first = descriptions[0]
    for rank, description in enumerate(descriptions):
        for part in ("fields", "particles"):
            if sorted(description[part]) != sorted(first[part]):
                return {}, (f"rank {rank} saves {part} {sorted(description[part])} but rank 0 saves "
                            f"{sorted(first[part])}; every rank must pass the same names")
        for name, entry in description["fields"].items():
            reference = first["fields"][name]
            for key in ("global_shape", "dtype", "dims"):
                if entry[key] != reference[key]:
                    return {}, f"field {name!r}: rank {rank} has {key} {entry[key]}, rank 0 has {reference[key]}"
        for name, entry in description["particles"].items():
            reference = first["particles"][name]
            for key in ("trailing", "dtype"):
                if entry[key] != reference[key]:
                    return {}, f"particles[{name!r}]: rank {rank} has {key} {entry[key]}, rank 0 has {reference[key]}"
        differing = [key for key in set(first["digests"]) | set(description["digests"])
                     if first["digests"].get(key) != description["digests"].get(key)]
        if differing:
            return {}, (f"replicated state differs between rank 0 and rank {rank} in {sorted(differing)}; replicated "
                        "values must be identical on every rank (keep per-rank data in fields or particles)")
    index = {"fields": {}, "particles": {"counts": [], "arrays": {}}}
    for name, reference in first["fields"].items():
        starts = [d["fields"][name]["start"] for d in descriptions]
        shapes = [d["fields"][name]["shape"] for d in descriptions]
        if sum(math.prod(s) for s in shapes) != math.prod(reference["global_shape"]):
            return {}, f"field {name!r}: the ranks' blocks do not tile the global shape {reference['global_shape']}"
        index["fields"][name] = {key: reference[key] for key in ("global_shape", "dtype", "dims", "periodic")}
        index["fields"][name].update(starts=starts, shapes=shapes, attributes=reference.get("attributes", {}))
    if first["particles"]:
        index["particles"]["counts"] = [next(iter(d["particles"].values()))["count"] for d in descriptions]
        index["particles"]["arrays"] = {name: {"trailing": e["trailing"], "dtype": e["dtype"]}
                                        for name, e in first["particles"].items()}
    return index, None


def _write_index(group, index: dict) -> None:
    group.require_group("fields")  # present even without fields (a particles-only app such as apps.md)
    for name, entry in index["fields"].items():
        field_group = group.create_group(f"fields/{name}")
        field_group.create_dataset("start", data=np.asarray(entry["starts"], dtype=np.int64))
        field_group.create_dataset("shape", data=np.asarray(entry["shapes"], dtype=np.int64))
        for key in ("global_shape", "dims"):
            field_group.attrs[key] = np.asarray(entry[key], dtype=np.int64)
        field_group.attrs["periodic"] = np.asarray(entry["periodic"], dtype=bool)
        field_group.attrs["dtype"] = entry["dtype"]
    particle_group = group.create_group("particles")
    particle_group.create_dataset("count", data=np.asarray(index["particles"]["counts"], dtype=np.int64))
    particle_group.attrs["arrays"] = json.dumps(index["particles"]["arrays"])


def _set_field_attributes(dataset, entry: dict) -> None:
    """What the field's values mean (``Field.attributes``: units, grid location) as attributes of its dataset."""
    for key, value in entry.get("attributes", {}).items():
        dataset.attrs[key] = value


def _units(snapshot) -> dict:
    """The snapshot's ``units`` (``{}`` for one made without)."""
    return getattr(snapshot, "units", None) or {}


def _set_particle_units(handle, snapshot) -> None:
    """``units`` attributes of the master file's particle datasets (the same on every rank)."""
    for name, unit in _units(snapshot).get("particles", {}).items():
        handle[f"particles/{name}"].attrs["units"] = unit


def _root_attributes(handle, snapshot, index, app: str, n_ranks: int, storage: str, provenance: dict) -> None:
    attrs = handle.attrs
    attrs["format"] = layout.FORMAT
    attrs["format_version"] = layout.FORMAT_VERSION
    attrs["layout"] = storage
    attrs["app"] = app
    attrs["step"] = np.int64(snapshot.step)
    attrs["n_ranks"] = np.int64(n_ranks)
    # Microseconds: --restart latest orders the checkpoints of several runs by this time.
    attrs["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
    attrs["hpcgpu_version"] = provenance.get("hpcgpu_version") or "unknown"
    attrs["git_commit"] = provenance.get("git_commit") or "unknown"
    # Which run wrote it (hpcgpu.checkpoint.identity); the manager adds these to ``provenance``.
    for key in (identity.RUN_ID_ATTRIBUTE, identity.FINGERPRINT_ATTRIBUTE, identity.OPTIONS_ATTRIBUTE):
        if provenance.get(key) is not None:
            attrs[key] = provenance[key]
    attrs["metadata"] = json.dumps(snapshot.metadata, default=str)


# ---------------------------------------------------------------------- per-rank files
def _write_tiled(handle, path: str, array: np.ndarray, compression, checksum_path: str) -> None:
    """Write ``array`` through h5py, tile by tile (chunk = tile), and its CRC32 per tile.

    Used for compressed arrays and dtypes that :mod:`~hpcgpu.checkpoint.bulk` cannot write raw.
    One tile per HDF5 call keeps each call short (h5py holds the GIL during a call).
    """
    tile = layout.tile_shape(array.shape, array.dtype.itemsize)
    grid = layout.tile_grid(array.shape, tile)
    if array.size == 0:
        handle.create_dataset(path, shape=array.shape, dtype=array.dtype)
    else:
        dataset = handle.create_dataset(path, shape=array.shape, dtype=array.dtype, chunks=tile,
                                        compression=compression)
    crcs = np.zeros(grid, dtype=np.uint32)
    # One reused contiguous buffer: strided views (a field's interior) are packed tile by tile,
    # and the CRC is taken from exactly the bytes handed to HDF5.
    buffer = np.empty(math.prod(tile) if array.size else 0, dtype=array.dtype)
    for index in iter_tiles(grid):
        slices = tile_slices(index, tile, array.shape)
        source = array[slices]
        piece = buffer[:source.size].reshape(source.shape)
        np.copyto(piece, source)
        crcs[index] = crc32(piece)
        dataset.write_direct(piece, dest_sel=slices)
    checksums = handle.create_dataset(checksum_path, data=crcs)
    checksums.attrs["tile_shape"] = np.asarray(tile, dtype=np.int64)


class ArraySpec(NamedTuple):
    """What the layout of one array needs (no data): picklable, sent to the layout process."""

    name: str            # dataset path in the rank file (``fields/h``)
    shape: tuple
    dtype: np.dtype
    checksum_path: str   # its CRC32 dataset (``checksums/fields/h``)


class LayoutNeedsData(Exception):
    """Raised by :func:`lay_out_rank_file` without ``arrays`` when an array must go through h5py."""


def rank_file_contents(snapshot, rank: int, n_ranks: int, app: str) -> tuple[dict, list, list]:
    """``(attributes, specs, arrays)`` of this rank's file: root attributes, one :class:`ArraySpec`
    and one host array per field block and particle array."""
    attributes = {"format": layout.FORMAT, "format_version": layout.FORMAT_VERSION, "app": app,
                  "step": np.int64(snapshot.step), "rank": np.int64(rank), "n_ranks": np.int64(n_ranks)}
    entries = ([(f"fields/{name}", block.data, f"checksums/fields/{name}") for name, block in snapshot.fields.items()]
               + [(f"particles/{name}", array, f"checksums/particles/{name}")
                  for name, array in snapshot.particles.items()])
    specs = [ArraySpec(name, tuple(int(n) for n in array.shape), array.dtype, checksum_path)
             for name, array, checksum_path in entries]
    return attributes, specs, [array for _, array, _ in entries]


def needs_data(specs, compression) -> bool:
    """True if some array of ``specs`` must be written through h5py (so the layout needs the data)."""
    return compression is not None or any(math.prod(s.shape) and not bulk.raw_writable(s.dtype) for s in specs)


def lay_out_rank_file(path, attributes: dict, specs: list, compression=None, arrays: list | None = None) -> list:
    """Create the rank file with h5py: attributes, and every array's datasets; close it.

    Arrays that :mod:`~hpcgpu.checkpoint.bulk` can write get contiguous, allocated, unfilled
    datasets (data and checksums) whose offsets are returned; the others (compressed, a dtype h5py
    stores differently, empty) are written through h5py here, chunked by tile, from ``arrays``.
    This is all the h5py work of a rank file, so it is what the layout process runs
    (:mod:`~hpcgpu.checkpoint.layout_process`, ``arrays=None``).

    Returns
    -------
    list, one entry per spec
        ``(tile, data offset, checksum offset)`` for an array to fill with :func:`fill_rank_file`,
        None for an array already written.

    Raises
    ------
    LayoutNeedsData
        ``arrays`` is None and a non-empty array must go through h5py.
    """
    import h5py

    placements = []
    with h5py.File(path, "w") as handle:
        for key, value in attributes.items():
            handle.attrs[key] = value
        properties = bulk.contiguous_creation_properties()
        for number, spec in enumerate(specs):
            size = math.prod(spec.shape)
            if compression is None and size and bulk.raw_writable(spec.dtype):
                placed = _allocate(handle, spec, properties)
                if placed is not None:
                    placements.append(placed)
                    continue
            if arrays is None and size:
                raise LayoutNeedsData(spec.name)
            array = arrays[number] if arrays is not None else np.empty(spec.shape, spec.dtype)
            _write_tiled(handle, spec.name, array, compression, spec.checksum_path)
            placements.append(None)
    return placements


def fill_rank_file(path, arrays: list, placements: list, rank: int, scratch: bulk.Scratch) -> None:
    """``os.pwrite`` the arrays' bytes and tile CRCs into the offsets of :func:`lay_out_rank_file`; fsync.

    The bulk bytes go to the disk while they are written (:class:`~hpcgpu.checkpoint.filesystem.WriteBehind`),
    so the one ``fsync`` at the end has little left to write; the file's pages are dropped after it.
    """
    raw = [(array, *placed) for array, placed in zip(arrays, placements) if placed is not None]
    if raw:
        descriptor = os.open(path, os.O_WRONLY)
        try:
            write_behind = WriteBehind(descriptor)
            for number, (array, tile, data_offset, checksum_offset) in enumerate(raw):
                crcs = bulk.write_array(descriptor, data_offset, array, tile, scratch, write_behind)
                bulk.pwrite_all(descriptor, crcs.astype("<u4"), checksum_offset)
                if number == 0:
                    fault_point("mid-rank-file", rank)
            write_behind.finish()
            os.fsync(descriptor)
            write_behind.drop_cache()
        finally:
            os.close(descriptor)
    else:
        fault_point("mid-rank-file", rank)
        fsync_path(path)
    fault_point("after-rank-file", rank)


def write_rank_file(path, snapshot, rank: int, n_ranks: int, app: str, compression=None,
                    scratch: bulk.Scratch | None = None, layout_process=None) -> None:
    """Write this rank's blocks and particles with their checksums; fsync.

    Without compression, h5py only lays the file out (attributes, contiguous datasets with their
    storage allocated, closed) and the array bytes and checksums go in with ``os.pwrite`` (see
    :mod:`hpcgpu.checkpoint.bulk`: no GIL held while writing). With compression, or a dtype h5py
    stores differently from NumPy, that array goes through h5py, chunked by checksum tile.

    ``layout_process`` (a :class:`~hpcgpu.checkpoint.layout_process.LayoutProcess`, asynchronous
    saves): the h5py layout runs in that helper process, so this (writer) thread holds the GIL
    only briefly; if the helper is unavailable, or the layout needs the data, it runs here.
    """
    attributes, specs, arrays = rank_file_contents(snapshot, rank, n_ranks, app)
    placements = None
    if layout_process is not None and not needs_data(specs, compression):
        placements = layout_process.lay_out_rank_file(path, attributes, specs)  # None: do it here
    snapshot.wait_ready()  # after the remote layout: the device-to-host copies overlap it
    if placements is None:
        placements = lay_out_rank_file(path, attributes, specs, compression, arrays)
    fill_rank_file(path, arrays, placements, rank, scratch or bulk.Scratch())


def _allocate(handle, spec: ArraySpec, properties):
    """Create ``spec.name`` and its checksums as contiguous, allocated, unfilled datasets.

    Returns ``(tile, data offset, checksum offset)``, or None (both removed again) if HDF5 did not
    lay the bytes out as NumPy does.
    """
    tile = layout.tile_shape(spec.shape, spec.dtype.itemsize)
    grid = layout.tile_grid(spec.shape, tile)
    dataset = handle.create_dataset(spec.name, shape=spec.shape, dtype=spec.dtype, dcpl=properties)
    checksums = handle.create_dataset(spec.checksum_path, shape=grid, dtype="<u4", dcpl=properties)
    checksums.attrs["tile_shape"] = np.asarray(tile, dtype=np.int64)
    data_offset, checksum_offset = dataset.id.get_offset(), checksums.id.get_offset()
    if (data_offset is None or checksum_offset is None
            or dataset.id.get_storage_size() != math.prod(spec.shape) * spec.dtype.itemsize
            or checksums.id.get_storage_size() != 4 * math.prod(grid)):
        del handle[spec.name], handle[spec.checksum_path]
        return None
    return tile, int(data_offset), int(checksum_offset)


class MasterContent(NamedTuple):
    """The part of a snapshot the master file needs (picklable, sent to the layout process)."""

    step: int
    metadata: dict
    replicated: dict
    units: dict = {}


def write_master_file(path, snapshot, index: dict, app: str, n_ranks: int, provenance: dict,
                      fault=fault_point) -> None:
    """Rank 0: metadata, replicated state, index, and Virtual Datasets over the rank files; fsync.

    ``snapshot`` needs ``step``, ``metadata``, ``replicated`` and ``units`` (a Snapshot or a
    :class:`MasterContent`).
    ``fault(name, rank)`` is the fault-injection hook (the layout process passes its own).
    """
    import h5py

    with h5py.File(path, "w") as handle:
        _root_attributes(handle, snapshot, index, app, n_ranks, layout.LAYOUT_PER_RANK, provenance)
        for name, entry in index["fields"].items():
            virtual = h5py.VirtualLayout(shape=tuple(entry["global_shape"]), dtype=np.dtype(entry["dtype"]))
            for rank, (start, shape) in enumerate(zip(entry["starts"], entry["shapes"])):
                # Relative source names: HDF5 resolves them next to the master file, so the
                # directory can be renamed or moved as a whole.
                source = h5py.VirtualSource(layout.rank_file_name(rank), f"fields/{name}", shape=tuple(shape))
                virtual[tuple(slice(s, s + n) for s, n in zip(start, shape))] = source
            _set_field_attributes(handle.create_virtual_dataset(f"fields/{name}", virtual), entry)
        counts = index["particles"]["counts"]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int) if counts else [0]
        for name, entry in index["particles"]["arrays"].items():
            trailing, dtype = tuple(entry["trailing"]), np.dtype(entry["dtype"])
            total = int(offsets[-1])
            if total == 0:
                handle.create_dataset(f"particles/{name}", shape=(0,) + trailing, dtype=dtype)
                continue
            virtual = h5py.VirtualLayout(shape=(total,) + trailing, dtype=dtype)
            for rank, count in enumerate(counts):
                if count:
                    source = h5py.VirtualSource(layout.rank_file_name(rank), f"particles/{name}",
                                                shape=(count,) + trailing)
                    virtual[offsets[rank]:offsets[rank] + count] = source
            handle.create_virtual_dataset(f"particles/{name}", virtual)
        _set_particle_units(handle, snapshot)
        fault("mid-master", 0)
        write_replicated(handle.create_group("replicated"), snapshot.replicated,
                         units=_units(snapshot).get("replicated"))
        _write_index(handle.create_group("index"), index)
        handle.flush()
    fsync_path(path)


# ---------------------------------------------------------------------- parallel HDF5
def write_single_file(path, snapshot, index: dict, comm, app: str, provenance: dict) -> None:
    """Every rank writes its blocks into one file with parallel HDF5 (collective for fields).

    Needs h5py built with MPI (``h5py.get_config().mpi``). Every metadata operation (creating a
    dataset or an attribute) is collective in parallel HDF5, so every rank creates every object with
    the same arguments, in the same order; only the data writes differ. Checksums use the same
    tiles as the per-rank layout, relative to each rank's block, stored per rank under
    ``/checksums``. Not exercised by the CPU test suite (its h5py is serial).
    """
    import h5py

    snapshot.wait_ready()
    rank = comm.rank
    with h5py.File(path, "w", driver="mpio", comm=comm.mpi) as handle:
        _root_attributes(handle, snapshot, index, app, comm.size, layout.LAYOUT_SINGLE_FILE, provenance)
        for name, entry in index["fields"].items():
            dtype = np.dtype(entry["dtype"])
            dataset = handle.create_dataset(f"fields/{name}", shape=tuple(entry["global_shape"]), dtype=dtype)
            _set_field_attributes(dataset, entry)
            checksum_sets = _create_checksum_sets(handle, f"checksums/fields/{name}", entry["shapes"], dtype)
            block = snapshot.fields[name]
            with dataset.collective:
                dataset[tuple(slice(s, s + n) for s, n in zip(block.start, block.data.shape))] = block.data
            _fill_checksums(checksum_sets[rank], block.data)
        counts = index["particles"]["counts"]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int) if counts else [0]
        for name, entry in index["particles"]["arrays"].items():
            trailing, dtype = tuple(entry["trailing"]), np.dtype(entry["dtype"])
            dataset = handle.create_dataset(f"particles/{name}", shape=(int(offsets[-1]),) + trailing, dtype=dtype)
            shapes = [[count] + list(trailing) for count in counts]
            checksum_sets = _create_checksum_sets(handle, f"checksums/particles/{name}", shapes, dtype)
            array = snapshot.particles[name]
            if array.shape[0]:  # independent write: ranks without particles take no part
                dataset[offsets[rank]:offsets[rank] + array.shape[0]] = array
            _fill_checksums(checksum_sets[rank], array)
        _set_particle_units(handle, snapshot)
        # Replicated state and index: identical on every rank, created collectively.
        write_replicated(handle.create_group("replicated"), snapshot.replicated,
                         units=_units(snapshot).get("replicated"))
        _write_index(handle.create_group("index"), index)
    comm.barrier()
    if rank == 0:
        fsync_path(path)


def _create_checksum_sets(handle, group_path: str, shapes, dtype) -> list:
    group = handle.create_group(group_path)
    sets = []
    for rank, shape in enumerate(shapes):
        tile = layout.tile_shape(shape, dtype.itemsize)
        dataset = group.create_dataset(layout.rank_file_name(rank)[:-3], shape=layout.tile_grid(shape, tile),
                                       dtype=np.uint32)
        dataset.attrs["tile_shape"] = np.asarray(tile, dtype=np.int64)
        sets.append(dataset)
    return sets


def _fill_checksums(dataset, array: np.ndarray) -> None:
    tile = tuple(int(t) for t in dataset.attrs["tile_shape"])
    grid = layout.tile_grid(array.shape, tile)
    crcs = np.zeros(grid, dtype=np.uint32)
    for index in iter_tiles(grid):
        crcs[index] = crc32(array[tile_slices(index, tile, array.shape)])
    if crcs.size:
        dataset[...] = crcs

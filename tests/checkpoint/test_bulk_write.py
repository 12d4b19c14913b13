"""Rank files written outside HDF5 (contiguous datasets filled with os.pwrite): bytes, CRCs, layout."""

import h5py
import numpy as np
import pytest

from hpcgpu.checkpoint import CheckpointManager, bulk, layout
from hpcgpu.checkpoint.integrity import tile_checksums
from tests.checkpoint.serial import BoxGrid, HostField


@pytest.mark.parametrize("shape, strided", [((3, 1000), True), ((3, 1000), False), ((50, 7, 3), True), ((41,), False)])
def test_write_array_puts_c_order_bytes_at_the_offset_and_returns_the_tile_crcs(tmp_path, monkeypatch, shape, strided):
    """Tiny tiles and slabs force many slabs, partial last tiles and (for (3, 1000)) tiles cut along axis 1."""
    monkeypatch.setattr(bulk, "SLAB_BYTES", 3000)
    rng = np.random.default_rng(1)
    padded = rng.standard_normal(tuple(n + 2 for n in shape))
    array = padded[tuple(slice(1, -1) for _ in shape)] if strided else np.ascontiguousarray(padded[:shape[0]])
    array = array[tuple(slice(0, n) for n in shape)]
    tile = layout.tile_shape(array.shape, 8, target_bytes=1600)
    path = tmp_path / "raw.bin"
    path.write_bytes(b"\xee" * (array.nbytes + 200))
    import os

    descriptor = os.open(path, os.O_WRONLY)
    try:
        crcs = bulk.write_array(descriptor, 100, array, tile, bulk.Scratch())
    finally:
        os.close(descriptor)
    raw = path.read_bytes()
    assert raw[:100] == b"\xee" * 100 and raw[100 + array.nbytes:] == b"\xee" * 100
    assert np.array_equal(np.frombuffer(raw[100:100 + array.nbytes]).reshape(shape), array)
    grid = layout.tile_grid(shape, tile)
    assert np.array_equal(crcs, tile_checksums(np.ascontiguousarray(array), tile, grid))


def test_rank_files_hold_contiguous_datasets_that_h5py_reads(tmp_path, serial_comm, monkeypatch):
    monkeypatch.setattr(bulk, "SLAB_BYTES", 2**20)  # one 4 MiB tile per slab: two slabs and the pwrite thread
    shape = (1100, 600)
    field = HostField(BoxGrid(shape))
    field.data[...] = np.random.default_rng(2).standard_normal(shape)
    particles = {"ids": np.arange(300, dtype=np.int32), "alive": np.arange(300) % 3 == 0,
                 "spin": (np.arange(300) * (1 + 2j)).astype(np.complex64)}
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    manager.save(1, fields={"h": field}, particles=particles)
    rank_file = tmp_path / "ckpt_000000001" / "rank_00000.h5"
    with h5py.File(rank_file, "r") as handle:
        assert handle["fields/h"].chunks is None, "bulk arrays are contiguous datasets"
        assert np.array_equal(handle["fields/h"][...], field.data)
        for name, array in particles.items():
            assert handle[f"particles/{name}"].dtype == array.dtype
            assert np.array_equal(handle[f"particles/{name}"][...], array)
        tile = tuple(handle["checksums/fields/h"].attrs["tile_shape"])
        assert tile == layout.tile_shape(shape, 8) and layout.tile_grid(shape, tile) == (2, 1)
        assert np.array_equal(handle["checksums/fields/h"][...], tile_checksums(field.data, tile,
                                                                                 layout.tile_grid(shape, tile)))
    with h5py.File(tmp_path / "ckpt_000000001" / "checkpoint.h5", "r") as handle:  # through the VDS
        assert np.array_equal(handle["fields/h"][...], field.data)
    restored = HostField(BoxGrid(shape, start=(520, 3), shape=(331, 17)))
    state = manager.load("latest", fields={"h": restored}, particles=True)
    assert np.array_equal(restored.data, field.data[520:851, 3:20])
    assert all(np.array_equal(state.particles[name], array) for name, array in particles.items())


def test_compressed_checkpoints_keep_chunked_datasets(tmp_path, serial_comm):
    field = HostField(BoxGrid((40, 30)))
    field.data[...] = np.arange(1200.0).reshape(40, 30)
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", compression="gzip")
    manager.save(2, fields={"h": field}, particles={"ids": np.arange(5)})
    with h5py.File(tmp_path / "ckpt_000000002" / "rank_00000.h5", "r") as handle:
        assert handle["fields/h"].chunks is not None and handle["fields/h"].compression == "gzip"
    restored = HostField(BoxGrid((40, 30)))
    manager.load("latest", fields={"h": restored})
    assert np.array_equal(restored.data, field.data)


def test_asynchronous_saves_reuse_host_buffers_and_commit_in_order(tmp_path, serial_comm):
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", asynchronous=True, keep=2)
    field = HostField(BoxGrid((30, 20)))
    for step in (1, 2, 3):
        field.data[...] = step
        manager.save(step, fields={"h": field})
        field.data[...] = -1.0  # stepping goes on while the writer runs
        assert manager.in_flight
    manager.close()
    assert len(manager._pool._buffers) == 1, "one host buffer, reused by every save"
    assert not manager.in_flight
    assert [p.name for p in manager.checkpoints()] == ["ckpt_000000002", "ckpt_000000003"]
    restored = HostField(BoxGrid((30, 20)))
    manager.load("latest", fields={"h": restored})
    assert np.all(restored.data == 3.0)

"""Write-behind of rank files (sync_file_range + dropped pages) and deferred pruning of old checkpoints."""

import errno
import os

import numpy as np
import pytest

from hpcgpu.checkpoint import CheckpointManager, bulk, filesystem, layout
from hpcgpu.checkpoint.integrity import tile_checksums
from tests.checkpoint.serial import BoxGrid, HostField


class FakeSyncFileRange:
    """Records calls; fails with ``error`` from the ``fail_at``-th call on (1-based)."""

    def __init__(self, error=None, fail_at=1):
        self.calls, self.error, self.fail_at = [], error, fail_at

    def __call__(self, descriptor, offset, n_bytes, flags):
        self.calls.append((offset, n_bytes, flags))
        if self.error is not None and len(self.calls) >= self.fail_at:
            import ctypes

            ctypes.set_errno(self.error)
            return -1
        return 0


@pytest.mark.parametrize("window", [0, 3000, 10**9])
def test_write_behind_keeps_the_bytes_and_crcs_of_a_strided_array(tmp_path, monkeypatch, window):
    """Many small slabs through the pwrite thread, with write-behind off, tight, and wider than the file."""
    monkeypatch.setattr(bulk, "SLAB_BYTES", 2000)
    padded = np.random.default_rng(3).standard_normal((62, 52))
    array = padded[1:-1, 1:-1]
    tile = layout.tile_shape(array.shape, 8, target_bytes=1000)
    path = tmp_path / "raw.bin"
    path.write_bytes(b"\xee" * (array.nbytes + 64))
    descriptor = os.open(path, os.O_WRONLY)
    try:
        write_behind = filesystem.WriteBehind(descriptor, window)
        crcs = bulk.write_array(descriptor, 64, array, tile, bulk.Scratch(), write_behind)
        write_behind.finish()
        assert not write_behind._in_flight
        os.fsync(descriptor)
        write_behind.drop_cache()
    finally:
        os.close(descriptor)
    raw = path.read_bytes()
    assert raw[:64] == b"\xee" * 64
    assert np.array_equal(np.frombuffer(raw[64:]).reshape(array.shape), array)
    assert np.array_equal(crcs, tile_checksums(np.ascontiguousarray(array), tile, layout.tile_grid(array.shape, tile)))


def test_write_behind_waits_for_the_oldest_ranges_beyond_the_window(monkeypatch):
    fake = FakeSyncFileRange()
    monkeypatch.setattr(filesystem, "_sync_file_range_function", fake)
    write_behind = filesystem.WriteBehind(descriptor=-1, window_bytes=250)
    for offset in range(0, 500, 100):
        write_behind.written(offset, 100)
    start_only = filesystem._SYNC_FILE_RANGE_WRITE
    wait = (filesystem._SYNC_FILE_RANGE_WAIT_BEFORE | filesystem._SYNC_FILE_RANGE_WRITE
            | filesystem._SYNC_FILE_RANGE_WAIT_AFTER)
    # Each range is started at once; once more than 250 bytes are in flight the oldest is waited for.
    assert fake.calls[:4] == [(0, 100, start_only), (100, 100, start_only), (200, 100, start_only), (0, 100, wait)]
    assert write_behind._in_flight_bytes <= 250
    write_behind.finish()
    assert sorted(call[0] for call in fake.calls if call[2] == wait) == [0, 100, 200, 300, 400]


def test_small_files_cost_no_extra_system_call(monkeypatch):
    fake = FakeSyncFileRange()
    monkeypatch.setattr(filesystem, "_sync_file_range_function", fake)
    write_behind = filesystem.WriteBehind(descriptor=-1, window_bytes=4000)
    write_behind.written(0, 300)
    write_behind.written(300, 300)
    write_behind.finish()
    write_behind.drop_cache()
    assert fake.calls == []


def test_write_behind_turns_itself_off_where_the_file_system_cannot_do_it(monkeypatch):
    fake = FakeSyncFileRange(error=errno.ENOSYS)
    monkeypatch.setattr(filesystem, "_sync_file_range_function", fake)
    write_behind = filesystem.WriteBehind(descriptor=-1, window_bytes=100)
    write_behind.written(0, 100)
    write_behind.written(100, 100)
    write_behind.finish()
    assert len(fake.calls) == 1 and not write_behind.active


def test_a_write_error_seen_by_write_behind_is_raised_not_swallowed(monkeypatch):
    """The kernel reports a write-back error once: if write-behind saw it, the final fsync may not."""
    monkeypatch.setattr(filesystem, "_sync_file_range_function", FakeSyncFileRange(error=errno.EIO, fail_at=2))
    write_behind = filesystem.WriteBehind(descriptor=-1, window_bytes=100)
    write_behind.written(0, 100)
    with pytest.raises(OSError, match="writing the checkpoint file failed") as raised:
        write_behind.written(100, 100)
    assert raised.value.errno == errno.EIO


def test_a_write_error_during_a_save_fails_it_and_keeps_the_previous_checkpoint(tmp_path, serial_comm, monkeypatch):
    monkeypatch.setattr(bulk, "SLAB_BYTES", 2**20)
    monkeypatch.setattr(filesystem, "WRITE_BEHIND_BYTES", 2**20)  # the 2.9 MB file is written behind
    field = HostField(BoxGrid((600, 600)))
    field.data[...] = 1.0
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=1)
    manager.save(1, fields={"h": field})
    monkeypatch.setattr(filesystem, "_sync_file_range_function", FakeSyncFileRange(error=errno.EIO, fail_at=2))
    from hpcgpu.errors import CheckpointError

    with pytest.raises(CheckpointError, match="previous checkpoint is intact.*Input/output error"):
        manager.save(2, fields={"h": field})
    filesystem.wait_for_removals()
    assert [p.name for p in manager.checkpoints()] == ["ckpt_000000001"]
    assert not list(tmp_path.glob("*.tmp"))


def test_synchronous_saves_prune_old_checkpoints_in_the_background(tmp_path, serial_comm):
    field = HostField(BoxGrid((40, 30)))
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2)
    for step in (1, 2, 3, 4):
        field.data[...] = step
        manager.save(step, fields={"h": field})
        # Pruned checkpoints are renamed away before save returns: never listed, never loaded.
        assert [p.name for p in manager.checkpoints()] == [layout.directory_name(s) for s in range(max(1, step - 1),
                                                                                                  step + 1)]
    filesystem.wait_for_removals()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000000003", "ckpt_000000004"]
    restored = HostField(BoxGrid((40, 30)))
    assert manager.load("latest", fields={"h": restored}).step == 4 and np.all(restored.data == 4)


def test_publish_with_deferred_removal_leaves_trees_being_removed_to_their_thread(tmp_path, monkeypatch):
    import h5py

    for step in (1, 2):
        (tmp_path / layout.directory_name(step)).mkdir()
        (tmp_path / layout.directory_name(step) / "rank_00000.h5").write_bytes(b"x" * 100)
        with h5py.File(tmp_path / layout.directory_name(step) / layout.MASTER_FILE, "w") as master:
            master.attrs["run_id"] = "run-a"  # pruning considers only the saving run's checkpoints
    (tmp_path / "ckpt_000000003.tmp").mkdir()
    removed_now = []
    original = filesystem.remove_tree
    monkeypatch.setattr(filesystem, "remove_tree", lambda path: (removed_now.append(path.name), original(path)))
    filesystem.publish_checkpoint(tmp_path / "ckpt_000000003.tmp", tmp_path / "ckpt_000000003", keep=1,
                                  run_id="run-a", defer_removal=True)
    filesystem.wait_for_removals()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000000003"]
    assert not any(name.startswith(("ckpt_000000001", "ckpt_000000002")) for name in removed_now)

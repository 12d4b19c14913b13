"""Checkpoints written and read by one process: round trips, elastic reads, damage detection."""

import os
import warnings

import h5py
import numpy as np
import pytest

from hpcgpu.checkpoint import CheckpointManager, CheckpointWarning
from hpcgpu.checkpoint.layout import tile_shape
from hpcgpu.errors import CheckpointError
from tests.checkpoint.conftest import GLOBAL_SHAPE, make_state
from tests.checkpoint.serial import BoxGrid, HostField, data_offset


def _assert_replicated_equal(found, expected):
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_replicated_equal(found[key], value)
        elif isinstance(value, (np.ndarray, np.generic)):
            assert type(found[key]) is type(value) and found[key].dtype == value.dtype
            assert np.array_equal(found[key], value)
        else:
            assert found[key] == value and type(found[key]) is type(value)


def test_round_trip_restores_every_kind_of_state(saved):
    manager, states = saved
    field = HostField(BoxGrid(GLOBAL_SHAPE))
    state = manager.load("latest", fields={"h": field}, particles=True)
    expected_field, expected_particles, expected_replicated = states[20]
    assert state.step == 20 and state.info.app == "tests.app" and state.metadata == {"step": 20}
    assert np.array_equal(field.data, expected_field)
    _assert_replicated_equal(state.replicated, expected_replicated)
    assert state.particles_exact
    for name, array in expected_particles.items():
        assert np.array_equal(state.particles[name], array) and state.particles[name].dtype == array.dtype
    # The master file presents the global arrays through Virtual Datasets.
    with h5py.File(state.info.master_file, "r") as handle:
        assert np.array_equal(handle["fields/h"][...], expected_field)
        assert np.array_equal(handle["particles/position"][...], expected_particles["position"])


def test_any_box_of_any_decomposition_reads_exactly_its_cells(saved):
    """Play ranks of a 3 x 2 decomposition: every box gets its cells of the saved global array."""
    manager, states = saved
    expected = states[20][0]
    for (y0, y1) in [(0, 13), (13, 25), (25, 37)]:
        for (x0, x1) in [(0, 12), (12, 23)]:
            field = HostField(BoxGrid(GLOBAL_SHAPE, start=(y0, x0), shape=(y1 - y0, x1 - x0), dims=(3, 2)))
            manager.load("latest", fields={"h": field})
            assert np.array_equal(field.data, expected[y0:y1, x0:x1])



@pytest.mark.filterwarnings("ignore::hpcgpu.checkpoint.manager.CheckpointWarning")
def test_a_selection_that_loses_particles_is_refused(saved):
    manager, _ = saved
    with pytest.raises(CheckpointError, match="kept .* of the 40 particles"):
        manager.load("latest", particles=True, particle_select_fn=lambda rows: rows["position"][:, 0] < 18.5)


def test_tiles_are_whole_trailing_axes_and_at_most_the_target_size():
    assert tile_shape((37, 23), 8) == (37, 23)
    assert tile_shape((4096, 4096), 8, target_bytes=2**20) == (32, 4096)
    assert tile_shape((2, 10**6), 8, target_bytes=2**20) == (1, 131072)
    assert tile_shape((0, 3), 8) == (1, 1)


def test_only_the_newest_k_are_kept_and_crash_debris_is_ignored(tmp_path, serial_comm):
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2)
    field, particles, replicated = make_state(1)
    (tmp_path / "ckpt_000000099.tmp").mkdir()  # a crashed save of a later step
    for step in (1, 2, 3):
        manager.save(step, fields={"h": field}, replicated=replicated)
    assert [p.name for p in manager.checkpoints()] == ["ckpt_000000002", "ckpt_000000003"]
    assert not (tmp_path / "ckpt_000000099.tmp").exists()
    assert manager.find("latest").step == 3


def _flip_byte_in_chunk(path, dataset_name, chunk=0, offset=100):
    with h5py.File(path, "r") as handle:
        byte_offset = data_offset(handle[dataset_name], chunk)
    with open(path, "r+b") as raw:
        raw.seek(byte_offset + offset)
        value = raw.read(1)
        raw.seek(byte_offset + offset)
        raw.write(bytes([value[0] ^ 0x10]))


def test_a_flipped_byte_is_detected_and_latest_falls_back(saved):
    manager, states = saved
    rank_file = manager.directory / "ckpt_000000020" / "rank_00000.h5"
    _flip_byte_in_chunk(rank_file, "fields/h")
    field = HostField(BoxGrid(GLOBAL_SHAPE))
    with pytest.raises(CheckpointError, match=r"rank_00000\.h5: checksum mismatch in fields/h"):
        manager.load(manager.directory / "ckpt_000000020", fields={"h": field})
    assert not field.data.any(), "a failed load must leave the fields untouched"
    with pytest.warns(CheckpointWarning, match="ckpt_000000020"):
        state = manager.load("latest", fields={"h": field})
    assert state.step == 10 and np.array_equal(field.data, states[10][0])


def test_a_flipped_particle_byte_is_detected(saved):
    manager, _ = saved
    _flip_byte_in_chunk(manager.directory / "ckpt_000000020" / "rank_00000.h5", "particles/position", offset=3)
    with pytest.raises(CheckpointError, match="checksum mismatch in particles/position"):
        manager.load(manager.directory / "ckpt_000000020", particles=True)


@pytest.mark.parametrize("victim", ["rank_00000.h5", "checkpoint.h5"])
def test_a_truncated_file_is_detected(saved, victim):
    manager, _ = saved
    path = manager.directory / "ckpt_000000020" / victim
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(CheckpointError, match=f"{victim}.*(truncated|corrupt|cannot)"):
        manager.find(manager.directory / "ckpt_000000020")
    with pytest.warns(CheckpointWarning):
        assert manager.find("latest").step == 10


def test_another_apps_checkpoint_is_refused(saved, serial_comm):
    manager, _ = saved
    other = CheckpointManager(serial_comm, manager.directory, app="apps.md")
    with pytest.raises(CheckpointError, match="written by 'tests.app', expected a checkpoint of 'apps.md'"):
        other.find(manager.directory / "ckpt_000000020")
    with pytest.raises(CheckpointError, match="no valid checkpoint"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other.find("latest")


@pytest.mark.filterwarnings("ignore::hpcgpu.checkpoint.manager.CheckpointWarning")
def test_wrong_shapes_and_missing_datasets_fail_cleanly(saved):
    manager, _ = saved
    wrong_shape = HostField(BoxGrid((36, 23)))
    with pytest.raises(CheckpointError, match=r"field 'h' is \(37, 23\) float64, the run expects \(36, 23\)"):
        manager.load("latest", fields={"h": wrong_shape})
    with pytest.raises(CheckpointError, match="has no field 'u'"):
        manager.load("latest", fields={"u": HostField(BoxGrid(GLOBAL_SHAPE))})
    with h5py.File(manager.directory / "ckpt_000000020" / "rank_00000.h5", "r+") as handle:
        del handle["checksums/fields/h"]
    with pytest.raises(CheckpointError, match=r"rank_00000\.h5: dataset fields/h or its checksums .* missing"):
        manager.load(manager.directory / "ckpt_000000020", fields={"h": HostField(BoxGrid(GLOBAL_SHAPE))})


def test_unexpected_structure_never_runs_code(saved):
    """Hostile replicated entries (object dtype, unknown kind, bad JSON) give a clean error."""
    manager, _ = saved
    master = manager.directory / "ckpt_000000020" / "checkpoint.h5"
    with h5py.File(master, "r+") as handle:
        evil = handle["replicated"].create_dataset("evil", data="cos\nsystem\n(S'echo hacked'\ntR.")
        evil.attrs["kind"] = "pickle"
        evil.attrs["crc32"] = 0
    with pytest.raises(CheckpointError, match="replicated/evil: expected a dataset with 'kind'"):
        manager.load(manager.directory / "ckpt_000000020")
    (manager.directory / "ckpt_000000010" / "checkpoint.h5").write_bytes(b"not HDF5 at all")
    with pytest.raises(CheckpointError, match="cannot be read as HDF5"):
        manager.find(manager.directory / "ckpt_000000010")
    with h5py.File(manager.directory / "ckpt_000000010" / "checkpoint.h5", "w") as handle:
        handle.attrs["format"] = "something-else"
    with pytest.raises(CheckpointError, match="format is 'something-else'"):
        manager.find(manager.directory / "ckpt_000000010")


def test_asynchronous_save_writes_the_state_at_the_time_of_the_call(tmp_path, serial_comm):
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", asynchronous=True)
    field, particles, replicated = make_state(3)
    expected = field.data.copy()
    assert manager.save(5, fields={"h": field}, particles=particles, replicated=replicated) is None
    field.data[...] = -1.0           # stepping continues while the writer runs
    replicated["optimizer"]["m"][...] = 0.0
    assert manager.wait().step == 5
    restored = HostField(BoxGrid(GLOBAL_SHAPE))
    state = manager.load("latest", fields={"h": restored})
    assert np.array_equal(restored.data, expected)
    assert np.any(state.replicated["optimizer"]["m"] != 0.0)


def test_a_failing_background_writer_surfaces_at_the_next_poll(tmp_path, serial_comm, monkeypatch):
    import hpcgpu.checkpoint.manager as manager_module

    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", asynchronous=True)
    field, _, replicated = make_state(4)
    manager.save(1, fields={"h": field}, replicated=replicated)
    manager.wait()

    def broken_writer(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(manager_module, "write_rank_file", broken_writer)
    manager.save(2, fields={"h": field}, replicated=replicated)
    manager._pending.written.wait()
    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoint is intact"):
        manager.poll()
    assert [p.name for p in manager.checkpoints()] == ["ckpt_000000001"]
    assert not list(tmp_path.glob("*.tmp"))


def test_replicated_state_must_agree_and_be_storable():
    from hpcgpu.checkpoint.writer import build_index

    def description(value):
        from hpcgpu.checkpoint.replicated import replicated_digests

        return {"fields": {}, "particles": {}, "digests": replicated_digests({"time": value, "config": {"a": 1}})}

    _, problem = build_index([description(1.0), description(1.0), description(1.5)])
    assert "differs between rank 0 and rank 2 in ['time']" in problem
    from hpcgpu.checkpoint.replicated import ReplicatedValueError, replicated_digests

    with pytest.raises(ReplicatedValueError, match=r"replicated\['config/fn'\] holds a builtin_function_or_method"):
        replicated_digests({"config": {"fn": print}})

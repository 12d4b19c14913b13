"""The layout process of asynchronous saves: same files as in-process, fallbacks, errors, shutdown."""

import os
import signal
import warnings

import h5py
import numpy as np
import pytest

from hpcgpu.checkpoint import CheckpointManager, layout_process
from hpcgpu.checkpoint.layout_process import LayoutProcess, LayoutProcessWarning
from hpcgpu.checkpoint.writer import ArraySpec
from tests.checkpoint.conftest import make_state
from tests.checkpoint.serial import BoxGrid, HostField

pytestmark = pytest.mark.timeout(60)


def _describe(path):
    """Every object of an HDF5 file: kind, shape, dtype, layout, attributes (``created`` and ``run_id``,
    which differ between two runs, left out)."""
    found = {}

    def visit(name, item):
        attributes = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in item.attrs.items()
                      if k not in ("created", "run_id")}
        if isinstance(item, h5py.Dataset):
            found[name] = ("dataset", item.shape, item.dtype.str, item.chunks, item.is_virtual, attributes)
        else:
            found[name] = ("group", attributes)

    with h5py.File(path, "r") as handle:
        visit("/", handle)
        handle.visititems(visit)
    return found


def _save(directory, serial_comm, asynchronous, step=5, seed=3):
    field, particles, replicated = make_state(seed)
    particles["empty"] = np.zeros((40, 0), dtype=np.float32)  # zero-size: laid out by h5py, no data
    manager = CheckpointManager(serial_comm, directory, app="tests.app", asynchronous=asynchronous)
    manager.save(step, fields={"h": field}, particles=particles, replicated=replicated, metadata={"seed": seed})
    helper_pid = manager._layout_process.pid if manager._layout_process is not None else None
    manager.close()
    return manager, field, helper_pid


def test_the_layout_process_writes_the_same_files_as_the_in_process_path(tmp_path, serial_comm):
    _, field, helper_pid = _save(tmp_path / "async", serial_comm, asynchronous=True)
    _save(tmp_path / "sync", serial_comm, asynchronous=False)
    assert helper_pid is not None, "asynchronous saves use the layout process by default"
    with pytest.raises(ProcessLookupError):  # close() ended it
        os.kill(helper_pid, 0)
    for name in ("checkpoint.h5", "rank_00000.h5"):
        assert _describe(tmp_path / "async" / "ckpt_000000005" / name) == _describe(
            tmp_path / "sync" / "ckpt_000000005" / name)
    with h5py.File(tmp_path / "async" / "ckpt_000000005" / "checkpoint.h5", "r") as handle:
        assert np.array_equal(handle["fields/h"][...], field.data)  # through the VDS
    reader = CheckpointManager(serial_comm, tmp_path / "async", app="tests.app")
    restored = HostField(BoxGrid(field.data.shape))
    state = reader.load("latest", fields={"h": restored}, particles=True)
    assert np.array_equal(restored.data, field.data) and state.replicated["blob"] == b"\x00\x01binary"


def test_the_environment_switch_keeps_the_layout_in_process(tmp_path, serial_comm, monkeypatch):
    monkeypatch.setenv(layout_process.ENVIRONMENT_VARIABLE, "0")
    manager, field, helper_pid = _save(tmp_path, serial_comm, asynchronous=True)
    assert helper_pid is None
    restored = HostField(BoxGrid(field.data.shape))
    manager.load("latest", fields={"h": restored})
    assert np.array_equal(restored.data, field.data)


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_dead_or_hung_layout_process_falls_back_in_process_with_one_warning(tmp_path, serial_comm, monkeypatch, how):
    monkeypatch.setenv(layout_process.TIMEOUT_VARIABLE, "0.5")
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", asynchronous=True, keep=5)
    field = HostField(BoxGrid((30, 20)))
    field.data[...] = 1.0
    manager.save(1, fields={"h": field})
    manager.wait()
    pid = manager._layout_process.pid
    os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (2, 3):
            field.data[...] = step
            manager.save(step, fields={"h": field})
            manager.wait()
    relevant = [w for w in caught if issubclass(w.category, LayoutProcessWarning)]
    assert len(relevant) == 1, [str(w.message) for w in caught]
    assert ("within 0.5 s" in str(relevant[0].message)) == (how == "hung")
    manager.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # a stopped helper was killed and reaped
    restored = HostField(BoxGrid((30, 20)))
    manager.load("latest", fields={"h": restored})
    assert np.all(restored.data == 3.0)
    assert [p.name for p in manager.checkpoints()] == ["ckpt_000000001", "ckpt_000000002", "ckpt_000000003"]


def test_errors_in_the_layout_process_are_raised_and_it_keeps_serving(tmp_path):
    helper = LayoutProcess()
    try:
        specs = [ArraySpec("fields/h", (4, 3), np.dtype("<f8"), "checksums/fields/h")]
        with pytest.raises(OSError) as raised:
            helper.lay_out_rank_file(tmp_path / "missing" / "rank_00000.h5", {"step": np.int64(1)}, specs)
        assert "layout process" in "".join(getattr(raised.value, "__notes__", []))
        placements = helper.lay_out_rank_file(tmp_path / "rank_00000.h5", {"step": np.int64(1)}, specs)
        (tile, data_offset, checksum_offset), = placements
        assert tile == (4, 3)
        with h5py.File(tmp_path / "rank_00000.h5", "r") as handle:
            assert handle["fields/h"].id.get_offset() == data_offset and handle.attrs["step"] == 1
            assert handle["checksums/fields/h"].id.get_offset() == checksum_offset
        assert helper.failure is None
    finally:
        helper.close()

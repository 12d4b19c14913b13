"""Runs own their checkpoints: run id and configuration fingerprint, pruning and overwriting only one's
own, atomic same-step replacement, ``latest`` among several runs, legacy checkpoints (issue 24).

In-process, with :class:`tests.checkpoint.serial.SerialComm`; crashes run in a subprocess.
"""

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcgpu.checkpoint import CheckpointManager, filesystem, identity, layout
from hpcgpu.errors import CheckpointError
from tests.checkpoint.conftest import GLOBAL_SHAPE, make_state
from tests.checkpoint.serial import BoxGrid, HostField

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"--nx": 36, "--model": "swe"}


def save(manager, step, seed=None):
    field, particles, replicated = make_state(step if seed is None else seed)
    manager.save(step, fields={"h": field}, particles=particles, replicated=replicated)
    return field.data.copy()


def load_field(manager, which="latest"):
    field = HostField(BoxGrid(GLOBAL_SHAPE))
    state = manager.load(which, fields={"h": field})
    return state, field.data


def file_hashes(directory, names=None):
    """sha256 and mtime of every file of the checkpoints ``names`` (default: all) in ``directory``."""
    found = {}
    for checkpoint in sorted(Path(directory).iterdir()):
        if names is None or checkpoint.name in names:
            for path in sorted(checkpoint.iterdir()):
                found[str(path.relative_to(directory))] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                           path.stat().st_mtime_ns)
    return found


def names(directory):
    return sorted(p.name for p in Path(directory).iterdir())


def make_legacy(checkpoint):
    """What a checkpoint written before run ids looks like: no identity attributes."""
    with h5py.File(Path(checkpoint) / layout.MASTER_FILE, "a") as master:
        for key in (identity.RUN_ID_ATTRIBUTE, identity.FINGERPRINT_ATTRIBUTE, identity.OPTIONS_ATTRIBUTE):
            del master.attrs[key]


def test_every_checkpoint_records_its_run_and_configuration(tmp_path, serial_comm):
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    save(manager, 10)
    with h5py.File(tmp_path / "ckpt_000000010" / layout.MASTER_FILE, "r") as master:
        assert master.attrs["run_id"] == manager.run_id
        assert master.attrs["config_fingerprint"] == identity.fingerprint(CONFIG) == manager.config_fingerprint
    info = manager.find("latest")
    assert (info.run_id, info.config_options, info.legacy) == (manager.run_id, CONFIG, False)
    other = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    assert other.run_id != manager.run_id, "every run gets its own id"
    assert identity.fingerprint({"--model": "swe", "--nx": 36}) == manager.config_fingerprint  # order-free


@pytest.mark.parametrize("asynchronous", [False, True], ids=["synchronous", "asynchronous"])
def test_pruning_counts_only_this_runs_checkpoints(tmp_path, serial_comm, asynchronous):
    """Asynchronous saves prune in the layout process: the same rule holds there."""
    first = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2, asynchronous=asynchronous)
    for step in (10, 20, 30):
        save(first, step)
    first.close()
    filesystem.wait_for_removals()
    assert names(tmp_path) == ["ckpt_000000020", "ckpt_000000030"]
    before = file_hashes(tmp_path)
    second = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2, asynchronous=asynchronous)
    for step in (5, 15, 25, 35):
        save(second, step)
    second.close()
    filesystem.wait_for_removals()
    assert names(tmp_path) == ["ckpt_000000020", "ckpt_000000025", "ckpt_000000030", "ckpt_000000035"]
    assert file_hashes(tmp_path, {"ckpt_000000020", "ckpt_000000030"}) == before


def test_a_save_over_another_runs_checkpoint_is_refused_and_changes_nothing(tmp_path, serial_comm):
    first = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    save(first, 10)
    before = file_hashes(tmp_path)
    second = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    with pytest.raises(CheckpointError, match=f"ckpt_000000010 already holds a checkpoint of run {first.run_id}"):
        save(second, 10, seed=99)
    assert names(tmp_path) == ["ckpt_000000010"] and file_hashes(tmp_path) == before


def test_a_restarted_run_continues_the_run_of_its_checkpoint_and_prunes_it(tmp_path, serial_comm):
    first = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2)
    save(first, 10)
    save(first, 20)
    restarted = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2)
    state, _ = load_field(restarted)
    assert state.step == 20 and restarted.run_id == first.run_id and restarted.restart_note is None
    save(restarted, 30)
    filesystem.wait_for_removals()
    assert names(tmp_path) == ["ckpt_000000020", "ckpt_000000030"]


def test_a_same_step_resave_of_the_same_run_replaces_the_checkpoint(tmp_path, serial_comm):
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    save(manager, 10, seed=1)
    expected = save(manager, 10, seed=2)
    filesystem.wait_for_removals()
    assert names(tmp_path) == ["ckpt_000000010"]
    assert np.array_equal(load_field(manager)[1], expected)


@pytest.mark.parametrize("exchange", ["atomic exchange", "two renames"])
def test_a_failed_same_step_resave_leaves_the_old_checkpoint_valid(tmp_path, serial_comm, monkeypatch, exchange):
    """The old checkpoint is never removed before the new one has its name: when the rename fails,
    the old one is still there and loads (the code before issue 24 removed it first)."""
    manager = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    old = save(manager, 10, seed=1)

    def failing_exchange(first, second):
        raise OSError(5, "injected failure of the atomic exchange")

    if exchange == "atomic exchange":
        monkeypatch.setattr(filesystem, "exchange_names", failing_exchange)
    else:
        monkeypatch.setattr(filesystem, "exchange_names", lambda first, second: False)
        monkeypatch.setattr(filesystem, "rename_durably", lambda source, target: failing_exchange(source, target))
    with pytest.raises(CheckpointError, match="injected failure"):
        save(manager, 10, seed=2)
    monkeypatch.undo()
    reader = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    assert np.array_equal(load_field(reader)[1], old)


CRASH_SCRIPT = textwrap.dedent("""
    import os, sys
    from hpcgpu.checkpoint import CheckpointManager, filesystem
    from tests.checkpoint.conftest import make_state
    from tests.checkpoint.serial import SerialComm

    directory, exchange, fault = sys.argv[1:]
    if exchange == "two renames":
        filesystem.exchange_names = lambda first, second: False   # a file system without RENAME_EXCHANGE
    manager = CheckpointManager(SerialComm(), directory, app="tests.app")
    for seed in (1, 2):
        if seed == 2:   # the second save replaces step 10 and meets the fault
            os.environ[filesystem.FAULT_VARIABLE] = fault
        field, particles, replicated = make_state(seed)
        manager.save(10, fields={"h": field}, particles=particles, replicated=replicated)
""")


@pytest.mark.parametrize("exchange", ["atomic exchange", "two renames"])
@pytest.mark.parametrize("fault", ["before-rename", "mid-replace"])
def test_a_crash_during_a_same_step_resave_leaves_a_valid_checkpoint(tmp_path, serial_comm, exchange, fault):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    crashed = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), exchange, fault], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    reached = fault == "before-rename" or exchange == "two renames"  # no mid-replace with an atomic exchange
    assert crashed.returncode == (filesystem.FAULT_EXIT_CODE if reached else 0), crashed.stderr
    if fault == "mid-replace" and reached:
        assert "ckpt_000000010" not in names(tmp_path) and "ckpt_000000010.replaced" in names(tmp_path)
    reader = CheckpointManager(serial_comm, tmp_path, app="tests.app")
    state, data = load_field(reader)  # the interrupted replacement is undone first
    assert state.step == 10
    field_1, field_2 = make_state(1)[0].data, make_state(2)[0].data
    assert np.array_equal(data, field_2 if not reached else field_1)
    assert "ckpt_000000010.replaced" not in names(tmp_path)


def test_latest_picks_the_newest_compatible_run_and_says_which(tmp_path, serial_comm):
    first = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    for step in (10, 20, 30):
        save(first, step)
    other_grid = CheckpointManager(serial_comm, tmp_path, app="tests.app", config={**CONFIG, "--nx": 48})
    save(other_grid, 40)  # newer and a higher step, but another grid: never chosen
    restarted = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    state, data = load_field(restarted)
    assert state.step == 30 and restarted.run_id == first.run_id
    assert np.array_equal(data, make_state(30)[0].data)
    assert "several runs" in restarted.restart_note and f"run {other_grid.run_id} (step 40)" in restarted.restart_note
    # A second compatible run started later (beside the first): its checkpoints are the newest.
    second = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    save(second, 5)
    latest = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    state, _ = load_field(latest)
    assert (state.step, latest.run_id) == (5, second.run_id)
    assert f"chose the newest compatible one (run {second.run_id}, step 5)" in latest.restart_note


def test_latest_with_no_compatible_checkpoint_refuses_and_names_the_differences(tmp_path, serial_comm):
    first = CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG)
    save(first, 10)
    other = CheckpointManager(serial_comm, tmp_path, app="tests.app", config={"--nx": 48, "--model": "swe"})
    with pytest.raises(CheckpointError, match=r"matches this run's configuration(.|\n)*--nx: 36 in the checkpoint, "
                                              r"48 in this run"):
        other.find("latest")
    # A checkpoint named explicitly still loads (the app checks what it needs), with a note.
    load_field(other, tmp_path / "ckpt_000000010")
    assert "--nx: 36 in the checkpoint, 48 in this run" in other.restart_note


def test_legacy_checkpoints_still_restart_and_are_never_pruned_or_overwritten(tmp_path, serial_comm):
    legacy_run = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2)
    for step in (10, 20):
        save(legacy_run, step)
    for name in names(tmp_path):
        make_legacy(tmp_path / name)
    legacy_files = file_hashes(tmp_path)
    restarted = CheckpointManager(serial_comm, tmp_path, app="tests.app", keep=2, config=CONFIG)
    assert [o.legacy for o in restarted.owners()] == [True, True]
    state, data = load_field(restarted)
    assert state.step == 20 and state.info.legacy and np.array_equal(data, make_state(20)[0].data)
    assert "legacy checkpoint" in restarted.restart_note and restarted.run_id in restarted.restart_note
    for step in (30, 40, 50):
        save(restarted, step)
    filesystem.wait_for_removals()
    assert names(tmp_path) == ["ckpt_000000010", "ckpt_000000020", "ckpt_000000040", "ckpt_000000050"]
    assert file_hashes(tmp_path, {"ckpt_000000010", "ckpt_000000020"}) == legacy_files
    with pytest.raises(CheckpointError, match="ckpt_000000020 already holds a checkpoint of a legacy run"):
        save(restarted, 20)
    # The continued run is now the newest: latest picks it.
    assert CheckpointManager(serial_comm, tmp_path, app="tests.app", config=CONFIG).find("latest").step == 50

"""One writer per run directory: the lock file, its holder, dead holders and races (hpcgpu.app.directory_lock).

What a live job on this machine, a process killed with -9, a reused pid, a holder on another host
(fresh or silent heartbeat), a lock file cut short and many processes racing for one lock do; and, on
1 and 2 ranks, that a refused job gets the same one-line error on every rank and leaves no trace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hpcgpu.app import directory_lock
from hpcgpu.app.directory_lock import (LOCK_NAME, DirectoryLock, Holder, hold_run_directories, inspect,
                                       release_run_directories)
from hpcgpu.errors import DirectoryLockedError

ROOT = Path(__file__).resolve().parents[2]


def foreign_lock(directory: Path, age_seconds: float, **changes) -> Path:
    """A lock file as a job on host ``other-node`` writes it, last refreshed ``age_seconds`` ago."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {**Holder.this_process().__dict__, "host": "other-node", "pid": 4242, "boot_id": "elsewhere",
              "job": "Slurm job 77", "since": "2026-12-07T01:00:00+00:00", **changes}
    path = directory / LOCK_NAME
    path.write_text(json.dumps(record))
    past = time.time() - age_seconds
    os.utime(path, (past, past))
    return path


def test_a_free_directory_is_locked_and_released_without_a_trace(tmp_path):
    directory = tmp_path / "new" / "run"
    lock = DirectoryLock(directory)
    assert lock.try_acquire() is None and lock.held
    holder = Holder.from_bytes((directory / LOCK_NAME).read_bytes())
    assert holder.pid == os.getpid() and holder.host == Holder.this_process().host
    assert sorted(p.name for p in directory.iterdir()) == [LOCK_NAME]   # no temporary file left
    lock.release()
    assert not (tmp_path / "new").exists()   # both directories it made, empty again: removed


def test_release_keeps_a_directory_that_holds_files_or_existed_before(tmp_path):
    lock = DirectoryLock(tmp_path / "run")
    assert lock.try_acquire() is None
    (tmp_path / "run" / "swe.nc").write_bytes(b"CDF")
    lock.release()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["swe.nc"]
    lock = DirectoryLock(tmp_path)
    assert lock.try_acquire() is None
    lock.release()
    assert tmp_path.is_dir()


def test_a_live_holder_on_this_machine_keeps_its_lock(tmp_path):
    first = DirectoryLock(tmp_path)
    assert first.try_acquire() is None
    state = DirectoryLock(tmp_path).try_acquire()   # this process is alive: it holds the lock
    assert state is not None and state.alive and state.holder.pid == os.getpid()
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()


HOLD = """
import sys, time
from hpcgpu.app.directory_lock import DirectoryLock
lock = DirectoryLock(sys.argv[1])
assert lock.try_acquire() is None
print("held", flush=True)
time.sleep(120)
"""


def test_a_holder_killed_with_sigkill_is_proven_dead_and_its_lock_taken_over(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert process.stdout.readline().strip() == "held"
        state = DirectoryLock(tmp_path).try_acquire()
        assert state is not None and state.alive and state.holder.pid == process.pid
    finally:
        process.kill()
        process.wait()
    lock = DirectoryLock(tmp_path)
    assert lock.try_acquire() is None
    assert len(lock.notes) == 1 and f"process {process.pid} no longer exists" in lock.notes[0], lock.notes
    assert Holder.from_bytes((tmp_path / LOCK_NAME).read_bytes()).pid == os.getpid()
    lock.release()


def test_a_reused_pid_does_not_keep_a_dead_holders_lock(tmp_path):
    path = foreign_lock(tmp_path, 0.0, **{k: v for k, v in zip(("host", "boot_id", "pid_namespace"),
                                                                 directory_lock.machine_identity())},
                        pid=os.getpid(), process_start="1")   # this pid, but a process that started at tick 1
    state = inspect(path)
    assert not state.alive and "is another process now" in state.why


def test_a_holder_on_another_host_is_alive_while_its_heartbeat_is_fresh(tmp_path):
    foreign_lock(tmp_path, 30.0)
    state = DirectoryLock(tmp_path).try_acquire()
    assert state is not None and state.alive
    text = directory_lock.refusal("--output", tmp_path, state, None)
    assert "\n" not in text
    for part in (f"--output {tmp_path} is in use by another job", "on host other-node", "pid 4242", "Slurm job 77",
                 "since 2026-12-07 01:00:00 UTC", "--wait-for-lock", f"delete {tmp_path / LOCK_NAME}"):
        assert part in text, (part, text)


def test_a_holder_on_another_host_whose_heartbeat_stopped_is_taken_over(tmp_path):
    foreign_lock(tmp_path, directory_lock.STALE_SECONDS + 60)
    lock = DirectoryLock(tmp_path)
    assert lock.try_acquire() is None
    assert "heartbeat stopped" in lock.notes[0] and "other-node" in lock.notes[0], lock.notes
    lock.release()


def test_the_holders_own_stale_time_counts(tmp_path):
    foreign_lock(tmp_path, 90.0, stale_seconds=60.0)
    assert not inspect(tmp_path / LOCK_NAME).alive
    foreign_lock(tmp_path, 90.0, stale_seconds=3600.0)
    assert inspect(tmp_path / LOCK_NAME).alive


def test_an_incomplete_lock_file_counts_as_held_until_it_is_stale(tmp_path):
    path = tmp_path / LOCK_NAME
    path.write_text('{"host": "n0')   # cut short, or a file system without hard links mid-write
    assert inspect(path).alive
    old = time.time() - directory_lock.STALE_SECONDS - 60
    os.utime(path, (old, old))
    lock = DirectoryLock(tmp_path)
    assert lock.try_acquire() is None and "an unreadable lock" in lock.notes[0]
    lock.release()


def test_the_heartbeat_refreshes_the_lock_and_notices_when_it_is_taken(tmp_path, capsys):
    lock = DirectoryLock(tmp_path, heartbeat_seconds=0.05)
    assert lock.try_acquire() is None
    path = tmp_path / LOCK_NAME
    old = time.time() - 1000
    os.utime(path, (old, old))
    time.sleep(0.5)
    assert path.stat().st_mtime > old + 900
    # Another job takes the lock (as after a long freeze of this one): noticed, and never deleted by us.
    foreign = foreign_lock(tmp_path, 0.0)
    content = foreign.read_bytes()
    deadline = time.monotonic() + 5
    while lock.lost is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock.lost is not None and "another job may now write" in capsys.readouterr().err
    lock.release()
    assert foreign.read_bytes() == content


def test_without_hard_links_the_lock_is_created_exclusively(tmp_path, monkeypatch):
    def no_links(source, target):   # a file system without hard links (some FUSE and object-store mounts)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    first, second = DirectoryLock(tmp_path), DirectoryLock(tmp_path)
    assert first.try_acquire() is None
    assert second.try_acquire() is not None
    first.release()
    assert second.try_acquire() is None
    second.release()


RACE = """
import sys, time
from hpcgpu.app.directory_lock import DirectoryLock
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
lock = DirectoryLock(sys.argv[1])
print("won" if lock.try_acquire() is None else "lost", flush=True)
time.sleep(6.0)   # hold it while the others look
lock.release()
"""


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale"])
def test_of_processes_racing_for_one_lock_exactly_one_wins(tmp_path, stale):
    if stale:   # everyone finds a dead holder's lock and tries to break it at once
        foreign_lock(tmp_path, directory_lock.STALE_SECONDS + 60)
    start = time.time() + 3.0
    processes = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path), str(start)], stdout=subprocess.PIPE,
                                  text=True, env=dict(os.environ, PYTHONPATH=str(ROOT))) for _ in range(6)]
    verdicts = [process.communicate(timeout=60)[0].strip() for process in processes]
    assert sorted(verdicts) == ["lost"] * 5 + ["won"], verdicts
    assert not (tmp_path / LOCK_NAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []   # no temporary or set-aside file left


def test_threads_racing_for_a_stale_lock_never_delete_the_winners(tmp_path):
    foreign_lock(tmp_path, directory_lock.STALE_SECONDS + 60)
    locks = [DirectoryLock(tmp_path) for _ in range(8)]
    barrier = threading.Barrier(len(locks))
    results = [None] * len(locks)

    def contend(index):
        barrier.wait()
        results[index] = locks[index].try_acquire()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(locks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [lock for lock, result in zip(locks, results) if result is None]
    assert len(winners) == 1
    assert (tmp_path / LOCK_NAME).read_bytes() == winners[0]._content
    winners[0].release()


# ---------------------------------------------------------------------------------- every rank of a job
@pytest.fixture
def shared_directory(comm):
    """A directory every rank of the job sees (each rank's ``tmp_path`` differs); removed afterwards."""
    if comm is None:
        yield None
        return
    base = Path(comm.broadcast(tempfile.mkdtemp(prefix="hpcgpu-lock-") if comm.rank == 0 else None))
    yield base
    comm.barrier()
    if comm.rank == 0:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.mpi(ranks=[1, 2], timeout=90)
def test_a_held_directory_refuses_every_rank_alike_and_a_refused_job_leaves_no_trace(comm, shared_directory):
    base = shared_directory
    if comm.rank == 0:
        foreign_lock(base / "checkpoints", 0.0)
    comm.barrier()
    with pytest.raises(DirectoryLockedError) as refused:
        hold_run_directories(comm, {"--output": base / "out", "--checkpoint-dir": base / "checkpoints"})
    assert f"--checkpoint-dir {base / 'checkpoints'} is in use by another job" in str(refused.value)
    texts = comm.mpi.allgather(str(refused.value))
    assert len(set(texts)) == 1
    comm.barrier()
    assert not (base / "out").exists()   # made for the output lock, removed with it: all or none


@pytest.mark.mpi(ranks=[1, 2], timeout=90)
def test_wait_for_lock_waits_until_the_holder_lets_go_then_holds_the_directories(comm, shared_directory):
    base = shared_directory
    if comm.rank == 0:
        path = foreign_lock(base / "out", 0.0)
        threading.Timer(1.5, path.unlink).start()   # the holder ends 1.5 s from now
    comm.barrier()
    started = time.monotonic()
    hold_run_directories(comm, {"--output": base / "out", "--checkpoint-dir": base / "out" / "checkpoints"},
                         wait_seconds=60.0)
    assert time.monotonic() - started >= 1.0
    if comm.rank == 0:
        assert Holder.from_bytes((base / "out" / LOCK_NAME).read_bytes()).pid == os.getpid()
        assert (base / "out" / "checkpoints" / LOCK_NAME).exists()
    release_run_directories()
    comm.barrier()
    assert sorted(p.name for p in (base / "out").iterdir()) == []   # locks gone, empty checkpoints/ too


@pytest.mark.mpi(ranks=[1, 2], timeout=90)
def test_wait_for_lock_gives_up_after_its_limit_on_every_rank(comm, shared_directory):
    base = shared_directory
    if comm.rank == 0:
        foreign_lock(base, 0.0)
    comm.barrier()
    with pytest.raises(DirectoryLockedError, match=r"is still in use after waiting [0-9]+ s \(--wait-for-lock\)"):
        hold_run_directories(comm, {"--output": base}, wait_seconds=1.0)

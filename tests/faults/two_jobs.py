"""Two jobs on one run directory: started together, a requeue while the first still runs, a dead holder.

The jobs are the scenarios of :mod:`tests.faults.scenarios` (the same command twice, as a double
submission or a requeue gives). What must hold, whatever the moment the second job starts:

- exactly one job writes: while the first holds the directory the second is refused (exit 2, one line
  naming the holder) or, with ``--wait-for-lock``, waits and then continues the first one's run;
- the file equals the uninterrupted run's, record for record: never a record of zeros, never one of
  another job;
- no checkpoint is lost: the newest one is the final step, every one opens, all belong to one run;
- a holder killed with -9 does not block the directory: the next job proves it dead, says so, and its
  restart ends with the uninterrupted run's file.

Used by ``tests/faults/test_one_writer.py`` (a few seeded cases) and ``benchmarks/fault_campaign.py
--two-jobs N`` (many).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcgpu.app.directory_lock import LOCK_NAME
from hpcgpu.testing import faults
from tests.faults.scenarios import ROOT, Scenario, header_count

#: What a refused job prints (hpcgpu.app.directory_lock.refusal).
REFUSED = "is in use by another job"
#: What a job prints when it removes a dead holder's lock.
STALE_REMOVED = "removed the stale lock"
#: What a job started with --wait-for-lock prints while it waits.
WAITING = "(--wait-for-lock)"


@dataclass
class TwoJobsResult:
    """One trial: how each job ended and what the directory holds afterwards.

    ``kind``: ``"together"`` (the second job starts ``delay`` s after the first), ``"running"`` (``delay`` s
    after the first job's file counted ``after_records`` records), ``"requeue-wait"`` (the second job,
    with ``--wait-for-lock``, follows the first: stopped by SIGTERM when ``stop`` is True, else at its end),
    ``"killed"`` (the first job killed with -9, then the second started).
    """

    scenario: str
    kind: str
    delay: float
    after_records: int
    exits: tuple
    one_writer: bool        # the exits say so: one job refused while the other ran, or one followed the other
    file_equal: bool        # the file equals the uninterrupted run's (every record)
    zero_records: int       # records whose every array is all zeros
    checkpoints_ok: bool    # newest checkpoint at the final step, all readable, all of one run
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.one_writer and self.file_equal and self.zero_records == 0 and self.checkpoints_ok

    def as_dict(self) -> dict:
        return {**self.__dict__, "exits": list(self.exits), "passed": self.passed}


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def zero_records(contents: dict) -> int:
    """Records (rows of the record dimension) whose every array of 2 or more dimensions is all zeros."""
    arrays = [np.asarray(a) for a in contents.values() if np.asarray(a).ndim >= 2]
    if not arrays:
        return 0
    n_records = min(a.shape[0] for a in arrays)
    return sum(all(not a[i].any() for a in arrays) for i in range(n_records))


def checkpoints_problem(directory: Path, final_step: int) -> str:
    """What is wrong with the checkpoints in ``directory`` ('' when nothing): the newest must be
    ``final_step``, every complete one must open, and all must belong to one run."""
    from hpcgpu.checkpoint.reader import read_master
    from hpcgpu.errors import CheckpointError

    complete = sorted(p for p in directory.glob("ckpt_*") if p.is_dir() and "." not in p.name)
    if not complete:
        return f"no checkpoint in {directory}"
    runs = set()
    for path in complete:
        try:
            runs.add(read_master(path).run_id)
        except CheckpointError as exc:
            return f"{path.name} does not open: {exc}"
    newest = read_master(complete[-1]).step
    if newest != final_step:
        return f"the newest checkpoint is step {newest}, not the final step {final_step}"
    if len(runs) != 1:
        return f"checkpoints of {len(runs)} runs: {sorted(map(str, runs))}"
    return ""


def _wait_for_records(scenario: Scenario, out: Path, job, records: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while header_count(out / scenario.file) < records and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def _wait_for_lock_file(out: Path, job, timeout: float = 120.0) -> None:
    """Until ``job`` holds ``out`` (its lock file exists), ends or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not (out / LOCK_NAME).exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)


def _check_directory(scenario: Scenario, out: Path, reference: dict, final_step: int) -> tuple[bool, int, bool, str]:
    detail = []
    try:
        contents = scenario.read(out)
        zeros = zero_records(contents)
        equal = scenario.count(contents) == scenario.count(reference) and \
            faults.is_prefix(contents, reference, scenario.records)
        if not equal:
            detail.append(f"the file differs from the uninterrupted run's ({scenario.count(contents)} records, "
                          f"{scenario.count(reference)} expected)")
    except Exception as exc:  # noqa: BLE001 - what a user would see: the file does not open
        zeros, equal = 0, False
        detail.append(f"the file does not open: {type(exc).__name__}: {exc}")
    problem = checkpoints_problem(out / "checkpoints", final_step)
    if problem:
        detail.append(problem)
    return equal, zeros, not problem, "; ".join(detail)


def final_step(scenario: Scenario) -> int:
    return int(scenario.args[scenario.args.index("--steps") + 1])


def two_jobs(scenario: Scenario, out: Path, reference: dict, delay: float, after_records: int = 0,
             timeout: float = 300.0, kind: str | None = None) -> TwoJobsResult:
    """Start the scenario's command, then the same command again ``delay`` s later (after the file
    counted ``after_records`` records, when given: netCDF scenarios); both write to ``out``. ``kind``
    names the trial in the result (default ``"running"`` with ``after_records``, else ``"together"``).

    One job must end with 0 and the other be refused with exit 2 naming the holder, or, when the second
    came after the first had ended, both end with 0 (one after the other; the second continues the
    first's final checkpoint). The file must equal the uninterrupted run's.
    """
    logs = [out.with_name(f"{out.name}.first.log"), out.with_name(f"{out.name}.second.log")]
    env, command = scenario.environment(), scenario.command(out)
    first = faults.start_job(scenario.n_ranks, command, env=env, cwd=str(ROOT), log=logs[0])
    if after_records:
        faults.wait_for_ranks(first, scenario.n_ranks)
        _wait_for_records(scenario, out, first, after_records)
    time.sleep(delay)
    second = faults.start_job(scenario.n_ranks, command, env=env, cwd=str(ROOT), log=logs[1])
    exits = (faults.finish(first, timeout), faults.finish(second, timeout))
    texts = [_log_text(log) for log in logs]
    detail = []
    if sorted(exits) == [0, 2]:
        refused = texts[exits.index(2)]
        one_writer = REFUSED in refused and "pid" in refused
        if not one_writer:
            detail.append(f"the job with exit 2 was not refused for the lock: {refused[-300:]}")
    else:
        one_writer = exits == (0, 0) and all(REFUSED not in text for text in texts)
        if not one_writer:
            detail.append(f"exits {exits}: {texts[0][-200:]} | {texts[1][-200:]}")
    equal, zeros, checkpoints_ok, more = _check_directory(scenario, out, reference, final_step(scenario))
    kind = kind or ("running" if after_records else "together")
    return TwoJobsResult(scenario.name, kind, delay, after_records, exits,
                         one_writer, equal, zeros, checkpoints_ok, "; ".join(filter(None, [*detail, more])))


def requeue_with_wait(scenario: Scenario, out: Path, reference: dict, after_records: int, stop: bool,
                      timeout: float = 300.0) -> TwoJobsResult:
    """A requeued job started with ``--wait-for-lock`` while its first instance still runs.

    The second job must wait (say so) until the first ends -- stopped by SIGTERM after its checkpoint
    (exit 75) when ``stop``, else at its end (exit 0) -- then continue its run to the end (exit 0) with
    the uninterrupted run's file.
    """
    logs = [out.with_name(f"{out.name}.first.log"), out.with_name(f"{out.name}.second.log")]
    env, command = scenario.environment(), scenario.command(out)
    first = faults.start_job(scenario.n_ranks, command, env=env, cwd=str(ROOT), log=logs[0])
    faults.wait_for_ranks(first, scenario.n_ranks)
    _wait_for_lock_file(out, first)   # a requeue comes after the first instance took the directory
    _wait_for_records(scenario, out, first, after_records)
    second = faults.start_job(scenario.n_ranks, [*command, "--wait-for-lock"], env=env, cwd=str(ROOT), log=logs[1])
    deadline = time.monotonic() + 120
    while WAITING not in _log_text(logs[1]) and second.poll() is None and first.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    waited = WAITING in _log_text(logs[1])
    if stop:
        faults.kill_ranks(first, "all", signal.SIGTERM)
    exits = (faults.finish(first, timeout), faults.finish(second, timeout))
    detail = []
    one_writer = exits == ((75 if stop else 0), 0)   # the second ran after the first, whether it had to wait or not
    if not one_writer:
        detail.append(f"exits {exits} (expected {(75 if stop else 0, 0)}), waited: {waited}: "
                      f"{_log_text(logs[1])[-300:]}")
    equal, zeros, checkpoints_ok, more = _check_directory(scenario, out, reference, final_step(scenario))
    return TwoJobsResult(scenario.name, "requeue-wait" + ("-stop" if stop else ""), 0.0, after_records, exits,
                         one_writer, equal, zeros, checkpoints_ok, "; ".join(filter(None, [*detail, more])))


def killed_holder_then_new_job(scenario: Scenario, out: Path, reference: dict, delay: float, target="all",
                               after_records: int = 0, timeout: float = 300.0) -> TwoJobsResult:
    """The holder is killed with -9 (``target`` ranks, ``delay`` s after its file counted ``after_records``
    records); a new job, without ``--wait-for-lock``, must take the directory over (saying that it
    removed the stale lock when one was left) and end with the uninterrupted run's file."""
    logs = [out.with_name(f"{out.name}.first.log"), out.with_name(f"{out.name}.second.log")]
    env, command = scenario.environment(), scenario.command(out)
    first = faults.start_job(scenario.n_ranks, command, env=env, cwd=str(ROOT), log=logs[0])
    faults.wait_for_ranks(first, scenario.n_ranks)
    if after_records:
        _wait_for_records(scenario, out, first, after_records)
    time.sleep(delay)
    faults.kill_ranks(first, target, signal.SIGKILL)
    first_exit = faults.finish(first, timeout)
    left = (out / LOCK_NAME).exists()
    second = faults.start_job(scenario.n_ranks, command, env=env, cwd=str(ROOT), log=logs[1])
    exits = (first_exit, faults.finish(second, timeout))
    text = _log_text(logs[1])
    one_writer = exits[1] == 0 and (STALE_REMOVED in text or not left)
    detail = [] if one_writer else [f"the new job: exit {exits[1]}, stale lock left: {left}: {text[-300:]}"]
    equal, zeros, checkpoints_ok, more = _check_directory(scenario, out, reference, final_step(scenario))
    return TwoJobsResult(scenario.name, "killed", delay, after_records, exits, one_writer, equal, zeros,
                         checkpoints_ok, "; ".join(filter(None, [*detail, more])))


__all__ = ["REFUSED", "STALE_REMOVED", "TwoJobsResult", "checkpoints_problem", "killed_holder_then_new_job",
           "requeue_with_wait", "two_jobs", "zero_records"]

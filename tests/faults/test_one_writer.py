"""One writer per run directory, with whole jobs: two jobs started on one directory, a requeue while the
first still runs (without ``--wait-for-lock`` it is refused like any second job; with it, it follows), a
holder killed with -9 followed by a new job, and every app refusing a directory another job holds.

Each case: the file ends equal to the uninterrupted run's (no record of zeros, none of another job), the
newest checkpoint is the final step and all belong to one run, and exactly one job wrote at a time (the
other was refused with exit 2 naming the holder, or followed it). ``benchmarks/fault_campaign.py
--two-jobs N --requeues N --stale-kills N`` runs many more (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time

import pytest

from hpcgpu.app.directory_lock import LOCK_NAME
from hpcgpu.jobs.launch import run_mpi
from tests.faults.scenarios import ROOT, SCENARIOS, reference_contents
from tests.faults.two_jobs import REFUSED, killed_holder_then_new_job, requeue_with_wait, two_jobs

pytestmark = pytest.mark.slow


def _long(name: str, steps: str):
    """The scenario with more steps, so that its first job is still running when a second job has started
    (on a quiet machine the 64² user model's 800 steps end sooner than a second job starts)."""
    scenario = SCENARIOS[name]
    args = list(scenario.args)
    args[args.index("--steps") + 1] = steps
    return dataclasses.replace(scenario, name=f"{name}-long", args=args)


#: The scenarios of the two-job cases by name: the kill scenarios, and longer runs of the short ones.
TWO_JOB_SCENARIOS = {**SCENARIOS, "user-model-long": _long("user-model", "8000")}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache = {}

    def reference(name):
        if name not in cache:
            cache[name] = reference_contents(TWO_JOB_SCENARIOS[name], tmp_path_factory.mktemp(f"reference-{name}"))
        return cache[name]
    return reference


CASES = [  # (scenario, seed, records the first job's file counts before the second starts: 0 = at start-up)
    ("stencil-channel", 11, 0),
    ("stencil-channel", 12, 5),    # the reproduction: the same command again once swe.nc has 5 records
    ("user-model-long", 13, 4),
]


@pytest.mark.parametrize("name,seed,after_records", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_two_jobs_on_one_directory_one_writes_the_other_is_refused(tmp_path, references, name, seed, after_records):
    delay = random.Random(seed).uniform(0.0, 0.05 if after_records else 1.5)
    result = two_jobs(TWO_JOB_SCENARIOS[name], tmp_path / "out", references(name), delay, after_records)
    assert result.passed, result.as_dict()
    assert sorted(result.exits) == [0, 2], result.as_dict()   # they overlapped: one was refused


def test_a_requeued_job_with_wait_for_lock_follows_its_first_instance(tmp_path, references):
    """The first instance is stopped by SIGTERM (checkpoint, exit 75) while the second waits; the second
    continues from that checkpoint to the uninterrupted run's file."""
    result = requeue_with_wait(SCENARIOS["stencil-channel"], tmp_path / "out", references("stencil-channel"), 4,
                               stop=True)
    assert result.passed, result.as_dict()


def test_a_holder_killed_with_sigkill_does_not_block_the_next_job(tmp_path, references):
    result = killed_holder_then_new_job(SCENARIOS["user-model"], tmp_path / "out", references("user-model"), 0.02,
                                        0, after_records=5)
    assert result.passed, result.as_dict()


LIVE_LOCK = {  # a lock file as a job on another node writes it (heartbeat fresh)
    "host": "other-node", "pid": 4242, "process_start": "1", "boot_id": "elsewhere", "pid_namespace": None,
    "job": "Slurm job 77", "program": "apps.stencil", "since": "2026-12-07T01:00:00+00:00", "token": "t",
    "heartbeat_seconds": 30.0, "stale_seconds": 600.0}

APPS = {
    "apps.stencil": ["-m", "apps.stencil", "--nx", "32", "--ny", "16", "--steps", "3"],
    "apps.md": ["-m", "apps.md", "--cells", "4", "--backend", "numpy", "--steps", "3"],
    "apps.train": ["-m", "apps.train", "--steps", "2"],
    "user-model": ["examples/gray_scott.py", "--n", "32", "--steps", "3"],
}


@pytest.mark.parametrize("app", sorted(APPS))
def test_every_app_refuses_a_held_directory_in_one_line_and_leaves_it_as_it_was(tmp_path, app):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps(LIVE_LOCK))
    before = sorted(p.name for p in out.rglob("*"))
    result = run_mpi(2, [sys.executable, *APPS[app], "--quiet", "--output", str(out)], timeout=180,
                     env=SCENARIOS["user-model"].environment(), cwd=str(ROOT))
    assert result.returncode == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--output {out} {REFUSED}: apps.stencil on host other-node, pid 4242, " \
        "Slurm job 77, since 2026-12-07 01:00:00 UTC" in lines[0], lines
    assert sorted(p.name for p in out.rglob("*")) == before


def test_a_second_job_asking_for_the_same_checkpoint_directory_is_refused(tmp_path, references):
    """Another --output, the same --checkpoint-dir: refused too, and its own --output is not left behind."""
    from hpcgpu.testing import faults

    scenario = SCENARIOS["stencil-channel"]
    first = faults.start_job(scenario.n_ranks, scenario.command(tmp_path / "out"), env=scenario.environment(),
                             cwd=str(ROOT))
    try:
        faults.wait_for_ranks(first, scenario.n_ranks)
        while not (tmp_path / "out" / "swe.nc").exists() and first.poll() is None:
            time.sleep(0.01)   # the first job holds the directories once it writes
        second = run_mpi(2, [sys.executable, "-m", "apps.stencil", "--nx", "32", "--ny", "16", "--steps", "5",
                             "--quiet", "--output", str(tmp_path / "other"),
                             "--checkpoint-dir", str(tmp_path / "out" / "checkpoints")],
                         timeout=120, env=scenario.environment(), cwd=str(ROOT))
    finally:
        assert faults.finish(first, 300) == 0
    assert second.returncode == 2, second.output
    lines = [line for line in second.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--checkpoint-dir {tmp_path / 'out' / 'checkpoints'} {REFUSED}" in lines[0], lines
    assert not (tmp_path / "other").exists()

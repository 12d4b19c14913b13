"""Preemption under a real Slurm: SIGUSR1 -> final checkpoint -> exit 75 -> requeue -> resume -> same result.

The CPU preemptible stencil script runs a Jacobi problem of several seconds. As soon as its first
periodic checkpoint exists, the test sends what ``--signal=B:USR1@120`` sends before a time limit
(``scancel --signal=USR1 --batch``). The job script must forward it to the ranks, the app must write
a final checkpoint and exit 75, the script must requeue the job, and the second run
(``SLURM_RESTART_COUNT=1``) must continue from that checkpoint to the same final checksum as an
uninterrupted run with the same rank count and options.

The uninterrupted reference runs without Slurm: it gets no Slurm job variables, because the app takes
its wall-time limit from ``SLURM_JOB_ID`` / ``SLURM_JOB_END_TIME`` when they are set (a pytest started
inside a Slurm job would otherwise stop it with exit 75 at that job's limit), and it prints its progress,
so that a failed reference shows why it ended (the app's ``stopping: ...`` line for an exit 75).
Every wait is sized for a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from hpcgpu.jobs.launch import run_mpi
from tests.jobscripts import _slurm
from tests.jobscripts._slurm import JOBSCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = JOBSCRIPTS / "cpu" / "stencil-preemptible.sbatch"
STEPS = 30000
PROBLEM = f"--model jacobi --nx 1024 --ny 1024 --norm-every 100 --steps {STEPS} --checkpoint-every 2000"
#: Seconds for the reference: about 35 s on 2 idle cores, 2.5 min with 6 CPU hogs (stress-ng) beside it.
REFERENCE_TIMEOUT = 480
#: Seconds for the job's two runs after the signal (the requeue waits about 11 s in between).
JOB_TIMEOUT = 480


def wait_for_checkpoint(job: _slurm.Job, timeout: float) -> None:
    checkpoints = job.run_dir() / "checkpoints"
    deadline = time.monotonic() + timeout
    while not (checkpoints.is_dir() and any(re.fullmatch(r"ckpt_\d+", p.name) for p in checkpoints.iterdir())):
        if job.process.poll() is not None:
            raise AssertionError(f"the job ended before its first checkpoint\n{job.describe()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint after {timeout:.0f} s\n{job.describe()}")
        time.sleep(0.2)


@pytest.mark.timeout(REFERENCE_TIMEOUT + 120 + JOB_TIMEOUT + 120)
def test_usr1_checkpoints_requeues_resumes_and_matches_an_uninterrupted_run(slurm_cluster, job_workdir, tmp_path,
                                                                            monkeypatch):
    function, app_line = _slurm.script_app_line(SCRIPT)
    assert function == "hpcgpu_run_preemptible" and app_line[0] == "apps.stencil"
    options = app_line[1:] + PROBLEM.split()    # exactly what the job runs (later flags win)
    for name in _slurm.job_variables(os.environ):
        monkeypatch.delenv(name)   # no wall-time limit from a Slurm job around this pytest
    reference = run_mpi(2, [sys.executable, "-m", "apps.stencil", *options, "--output", str(tmp_path / "reference"),
                            "--summary", str(tmp_path / "reference.json")], timeout=REFERENCE_TIMEOUT)
    assert reference.returncode == 0, (f"the uninterrupted reference run (no Slurm) exited {reference.returncode}; "
                                       f"its output ends:\n{reference.output[-4000:]}")
    expected = json.loads((tmp_path / "reference.json").read_text())["checksum"]

    job = _slurm.start(SCRIPT, job_workdir, PROBLEM)
    try:
        wait_for_checkpoint(job, timeout=120)
        signal = subprocess.run(["scancel", "--signal=USR1", "--batch", job.job_id], capture_output=True,
                                text=True, timeout=30)
        assert signal.returncode == 0, signal.stderr
        _slurm.wait(job, timeout=JOB_TIMEOUT)    # sbatch --wait returns after the last run of the job
    finally:
        if job.process.poll() is None:
            _slurm.cancel(job)
            job.process.kill()
    assert job.returncode == 0, job.describe()

    log = job.log()   # --open-mode=append: both runs in one file
    assert "SIGUSR1 received" in log and "forwarding SIGUSR1 to the launcher" in log, job.describe()
    stopped = re.search(r"stopping: .* at step (\d+); checkpoint of step \1 written", log)
    assert stopped, f"the first run did not stop on the signal\n{job.describe()}"
    assert "exit 75" in log and f"requeueing job {job.job_id}" in log
    assert re.search(r"run 2 SLURM_RESTART_COUNT=1 ", log), job.describe()
    restarted = re.search(r"restarted from \S+ckpt_0*(\d+) \(step (\d+)", log)
    assert restarted and restarted.group(2) == stopped.group(1), job.describe()
    assert 0 < int(stopped.group(1)) < STEPS

    states = _slurm.final_states(job.job_id)
    assert len(states) == 2 and states[-1] == ("COMPLETED", "0:0"), states   # the requeued run, then the final one
    summary = job.summary()
    # The summary counts the steps of the run that wrote it: the second, from the checkpoint to the end.
    assert (summary["first_step"], summary["final_step"]) == (int(stopped.group(1)), STEPS), summary
    assert summary["steps"] == STEPS - summary["first_step"]
    assert summary["checksum"] == expected, "the preempted chain must end bitwise equal to one uninterrupted run"

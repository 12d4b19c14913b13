"""Moving on from a bad node under the CI's real Slurm (one node, so "another node" cannot be had):

* a rank that hangs on purpose is named by the watchdog, the job ends with exit 76 and submits a follow-up
  job that excludes the node (``sbatch --exclude``): on this one-node cluster Slurm refuses it at once (no
  node is left), which the test reads from the log; a follow-up starting on another node is not exercised;
* with ``HPCGPU_EXCLUDE_BAD_NODES=0`` the follow-up runs on the same node, here on fewer ranks, and continues
  from the hung run's newest checkpoint to the end;
* a failed check that is not tied to a node (not enough free space anywhere) stops the job before the app.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tests.jobscripts import _slurm
from tests.jobscripts._slurm import JOBSCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = JOBSCRIPTS / "cpu" / "stencil-preemptible.sbatch"
HUNG = "--nx 48 --ny 24 --steps 60 --checkpoint-every 10 --watchdog-step 2"


def followup_id(job) -> str:
    path = job.run_dir() / "followup-job.txt"
    assert path.exists(), job.describe()
    return path.read_text().strip()


def wait_until_final(job_id: str, timeout: float) -> list[tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = _slurm.sacct_states(job_id)
        if states and states[-1][0] in _slurm.FINAL_STATES:
            return states
        time.sleep(1)
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    raise AssertionError(f"follow-up job {job_id} did not finish within {timeout:.0f} s")


def test_a_hung_rank_s_node_is_excluded_from_the_follow_up_job(slurm_cluster, job_workdir):
    job = _slurm.run(SCRIPT, job_workdir, HUNG, extra_env={"HPCGPU_WATCHDOG_TEST": "hang:1:25"}, timeout=180)
    log = job.log()
    assert re.search(r"hang: rank 1/2 on node \S+ stuck in phase step after step 25", log), log[-4000:]
    hang = json.loads((job.run_dir() / "hang.json").read_text())
    node = hang["exclude_nodes"][0]
    assert hang["stuck_ranks"] == [1] and hang["exit_code"] == 76
    assert _slurm.final_states(job.job_id) == [("FAILED", "76:0")], job.describe()
    # The follow-up asks for every node but this one; the CI cluster has no other, so sbatch refuses it at
    # once (on a real cluster it would start elsewhere) and the job keeps its exit code.
    assert job.returncode == 76, job.describe()
    assert re.search(rf"could not submit a follow-up job \(sbatch --dependency=afterany:{job.job_id} --nodes=1-1 "
                     rf"--exclude={node} \): sbatch: error: .*Requested node configuration is not available", log), log
    assert not (job.run_dir() / "followup-job.txt").exists()


def test_the_follow_up_continues_from_the_checkpoint_on_fewer_ranks(slurm_cluster, job_workdir):
    job = _slurm.run(SCRIPT, job_workdir, HUNG, extra_env={
        "HPCGPU_WATCHDOG_TEST": "hang:1:25", "HPCGPU_EXCLUDE_BAD_NODES": "0",
        "HPCGPU_FOLLOWUP_SBATCH": "--ntasks-per-node=1"}, timeout=180)
    assert job.returncode == 0, job.describe()
    followup = followup_id(job)
    assert wait_until_final(followup, 180)[-1] == ("COMPLETED", "0:0")
    log = (job.workdir / f"{job.name}-{followup}.log").read_text()
    assert "continuing from the newest checkpoint" in log and "HEALTHY" in log
    summary = job.summary()   # the same run directory
    assert summary["n_ranks"] == 1 and summary["first_step"] == 20 and summary["final_step"] == 60


def test_a_check_failing_everywhere_stops_the_job_before_the_app(slurm_cluster, job_workdir):
    job = _slurm.run(SCRIPT, job_workdir, HUNG, extra_env={"HPCGPU_CHECK_FLAGS": "--need 1000T --no-probes"},
                     timeout=120)
    log = job.log()
    assert job.returncode == 4, job.describe()
    assert "hpcgpu check: FAILED" in log and "free space" in log
    assert "[hpcgpu-job] launch:" not in log and "not tied to a node" in log
    assert json.loads((job.run_dir() / "check.json").read_text())["exit_code"] == 4

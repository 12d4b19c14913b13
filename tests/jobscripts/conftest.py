"""Fixtures for the job-script tests: the one-node Slurm cluster and a scratch working directory.

The cluster is the one ``.ci/slurm/start-cluster.sh`` starts (Debian's Slurm 22.05, munged,
slurmctld and slurmd on this machine, 2 fake GPUs with ``SLURM_CI_FAKE_GPUS=2``); ``.ci/run`` starts it
before the tests. The tests only use it: when it is not running they are skipped with the reason,
and under CI (``CI=true``) they fail instead, so a broken cluster can never pass CI silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.jobscripts import _slurm


@dataclass(frozen=True)
class Cluster:
    fake_gpus: int        # gres/gpu count of the node (0: GPU scripts are rejected at submission)


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    problem = _slurm.cluster_problem()
    if problem is not None:
        if _slurm.in_ci():
            pytest.fail(f"CI=true but no usable Slurm cluster: {problem}; {_slurm.HOW_TO_START}", pytrace=False)
        pytest.skip(f"no Slurm cluster: {problem}; {_slurm.HOW_TO_START}")
    return Cluster(fake_gpus=_slurm.fake_gpu_count())


@pytest.fixture(scope="session")
def job_workdir(tmp_path_factory):
    """Working directory of the submitted jobs (runs/ inside it), shared by the session's jobs."""
    workdir = tmp_path_factory.mktemp("slurm-jobs")
    (workdir / "runs").mkdir()
    return workdir

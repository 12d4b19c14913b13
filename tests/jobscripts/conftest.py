"""Fixtures for the job-script tests: the one-node Slurm cluster and a scratch working directory.

The cluster is ``.ci/slurm/start-cluster.sh`` (Debian's Slurm 22.05, munged, slurmctld and slurmd on
this machine, 2 fake GPUs). Without root or apt the Slurm tests are skipped with the reason; under
CI (``CI=true``) they fail instead, so a broken cluster can never pass CI silently.
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
    reason, fake_gpus = _slurm.start_cluster()
    if reason is not None:
        if _slurm.in_ci():
            pytest.fail(f"CI=true but the Slurm cluster is not usable: {reason}", pytrace=False)
        pytest.skip(f"no Slurm cluster: {reason}")
    return Cluster(fake_gpus=fake_gpus)


@pytest.fixture(scope="session")
def job_workdir(tmp_path_factory):
    """Working directory of the submitted jobs (runs/ inside it), shared by the session's jobs."""
    workdir = tmp_path_factory.mktemp("slurm-jobs")
    (workdir / "runs").mkdir()
    return workdir

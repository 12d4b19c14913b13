"""The CPU job scripts submitted to a real Slurm (the one-node CI cluster), and the GPU scripts checked by it.

Each job runs the script exactly as written, with the problem shrunk through ``HPCGPU_APP_ARGS``
(appended to the app's flags, so the last value of a flag wins). The tests check what a user
would look at: the exit state in Slurm's record, the topology report at the top of the log, and
the summary JSON in the job's run directory.
"""

from __future__ import annotations

import importlib
import json
import re
import sys

import pytest

from tests.jobscripts import _slurm
from tests.jobscripts._slurm import JOBSCRIPTS

pytestmark = pytest.mark.slow


def _train_importable() -> bool:
    try:
        importlib.import_module("apps.train.app")
    except Exception:
        return False
    return True


SMALL = {
    "stencil": "--model swe --nx 48 --ny 24 --steps 20",
    "md": "--cells 6 --steps 20 --precision fp64",
    "train": "--model mlp --steps 20 --batch-size 100 --precision fp32 --zero 0",
}
APPS = ["stencil", "md",
        pytest.param("train", marks=pytest.mark.skipif(not _train_importable(), reason="apps.train is not importable"))]
RANKS = {"single-node": 2, "multi-node": 4, "preemptible": 2, "sweep": 2}   # multi-node: 4 overcommitted tasks


def check_info_report(log: str, n_ranks: int) -> None:
    """``python -m hpcgpu info`` ran first: its rank table precedes the app's launch."""
    assert re.search(rf"^ranks: {n_ranks} on 1 node\(s\)", log, re.M), log
    table = log.index("rank node")
    assert table < log.index("[hpcgpu-job] launch:")
    rows = re.findall(r"^\s+(\d+) \S+\s+(\d+)\s", log[table:log.index("[hpcgpu-job] launch:")], re.M)
    assert [int(rank) for rank, _ in rows] == list(range(n_ranks))


@pytest.mark.parametrize("kind", ["single-node", "multi-node", "preemptible", "sweep"])
@pytest.mark.parametrize("app", APPS)
def test_cpu_script_completes_with_info_report_and_summary(slurm_cluster, job_workdir, app, kind):
    """Every CPU script, as written, on a small problem (sweeps: their first array task only)."""
    sweep = kind == "sweep"
    job = _slurm.run(JOBSCRIPTS / "cpu" / f"{app}-{kind}.sbatch", job_workdir, SMALL[app],
                     sbatch_args=["--array=0"] if sweep else [], timeout=180)
    task = 0 if sweep else None
    assert job.returncode == 0, job.describe(task)
    assert _slurm.final_states(job.job_id) == [("COMPLETED", "0:0")], job.describe(task)
    log = job.log(task)
    check_info_report(log, RANKS[kind])
    assert "SLURM_RESTART_COUNT=0" in log and "OMP_NUM_THREADS=1" in log
    assert (job.run_dir(task) / "info.txt").read_text().strip() in log
    summary = job.summary(task)
    assert summary["app"] == f"apps.{app}"
    assert summary["n_ranks"] == RANKS[kind] and summary["steps"] == 20
    assert summary["checksum"].startswith("sha256:")
    assert (job.run_dir(task) / "environment.json").exists()
    if kind == "preemptible":
        # Not interrupted: one run, from the beginning (no --restart without a checkpoint), no requeue.
        assert "starting from the beginning" in log and "--restart latest" not in log
        assert "requeueing" not in log and "SIGUSR1" not in log


def test_sweep_array_runs_one_task_per_value_in_its_own_directory(slurm_cluster, job_workdir):
    script = JOBSCRIPTS / "cpu" / "stencil-sweep.sbatch"
    values = re.search(r"^VALUES=\((.*)\)$", script.read_text(), re.M).group(1).split()
    job = _slurm.run(script, job_workdir, SMALL["stencil"], sbatch_args=["--array=0-1"], timeout=180)
    assert job.returncode == 0, job.describe(0) + job.describe(1)
    checksums = []
    for task in (0, 1):
        summary = job.summary(task)
        assert summary["steps"] == 20, job.describe(task)
        options = json.loads((job.run_dir(task) / "environment.json").read_text())["options"]
        assert options["viscosity"] == float(values[task])
        checksums.append(summary["checksum"])
        assert "ranks: 2 on 1 node(s)" in job.log(task)
    assert checksums[0] != checksums[1], "different viscosities must give different states"


#: The GPU scripts' resources shrunk to the CI node (2 CPUs, 2 fake GPUs); every other option stays.
GPU_SHRINK = ["--nodes=1", "--gpus-per-node=2", "--ntasks-per-node=2", "--cpus-per-task=1"]
NO_FAKE_GPUS = ("the cluster has no (fake) GPUs: start it with "
                "`SLURM_CI_FAKE_GPUS=2 bash .ci/slurm/start-cluster.sh` (as .ci/run does)")


@pytest.mark.parametrize("flavour", ["cpu", "gpu"])
def test_every_script_is_accepted_by_sbatch_test_only(slurm_cluster, job_workdir, flavour):
    """sbatch validates every option of every script (GPU ones with CPU-sized counts)."""
    shrink = GPU_SHRINK if flavour == "gpu" else []
    if flavour == "gpu" and slurm_cluster.fake_gpus < 2:
        pytest.skip(NO_FAKE_GPUS)
    for script in sorted((JOBSCRIPTS / flavour).glob("*.sbatch")):
        result = _slurm.sbatch_test_only(script, job_workdir, shrink)
        assert result.returncode == 0 and "to start at" in result.stderr, f"{script}: {result.stderr}"


def test_gpu_script_shows_every_task_the_node_gpus(slurm_cluster, job_workdir, tmp_path):
    """The GPU single-node script on the cluster's 2 fake GPUs: each task sees both GPUs of the node.

    The scripts bind no GPU per task (CUDA IPC between a node's ranks needs its peers visible; hpcgpu
    picks GPU local_rank % G itself). The fake GPUs are /dev/null-like device files; CuPy is absent, so
    the app falls back to the CPU, but Slurm's CUDA_VISIBLE_DEVICES is real. A shim interpreter records it.
    """
    if not _slurm.fake_gpus_are_devices(slurm_cluster.fake_gpus):
        pytest.skip(f"the cluster has no fake GPU devices (mknod refused?); {NO_FAKE_GPUS}")
    record = tmp_path / "gpu-map.txt"
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/bash\necho "task=$SLURM_PROCID gpus=$CUDA_VISIBLE_DEVICES" >> {record}\n'
                    f'exec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    job = _slurm.run(JOBSCRIPTS / "gpu" / "stencil-single-node.sbatch", job_workdir, SMALL["stencil"],
                     sbatch_args=GPU_SHRINK, extra_env={"HPCGPU_PYTHON": str(shim)}, timeout=180)
    assert job.returncode == 0, job.describe()
    assert "GPUs per node 2" in job.log(), job.describe()
    lines = sorted(set(record.read_text().splitlines()))
    assert lines == ["task=0 gpus=0,1", "task=1 gpus=0,1"], lines   # same for the info step and the app
    assert job.summary()["n_ranks"] == 2

"""``hpcgpu jobscript --container IMAGE``: every rank of info, check and the app runs in the image.

The fast tests run the written script as a batch shell would, with stand-ins for srun and the
container runtime that record their arguments and run the command on this machine's Python (the
runtimes are not installed here). The slow test submits the Podman script to the CI's Slurm with the
CI's image (.ci/container/build-image.sh): two ranks started by srun, each in its own container, talk
through the PMI-2 channel srun passes in, and the checksum equals the same run outside the container.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from hpcgpu.jobs.launch import run_mpi
from tests.containers import _podman
from tests.jobscripts import _slurm
from tests.jobscripts._slurm import ROOT
from tests.jobscripts.test_jobscript_cli import SMALL_STENCIL, run_batch_script, write

#: A stand-in for apptainer / singularity / podman: records its arguments, drops them up to the image
#: and runs the rest (the interpreter and its arguments) here.
FAKE_RUNTIME = """#!/bin/bash
echo "$(basename "$0") $*" >> "$FAKE_RUNTIME_RECORD"
while [ $# -gt 0 ] && [ "$1" != "$FAKE_IMAGE" ]; do shift; done
shift
exec "$@"
"""
IMAGE = "registry.example.org/hpcgpu:cuda12"


def fake_runtime(workdir, name):
    bin_dir = workdir / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(FAKE_RUNTIME)
    (bin_dir / name).chmod(0o755)


def test_container_script_exports_the_image_and_runtime_and_not_the_host_python(tmp_path):
    assert write(tmp_path, "md", "--gpus-per-node", "4", "--container", IMAGE, "-o", "md.sbatch") == 0
    text = (tmp_path / "md.sbatch").read_text()
    assert f"export HPCGPU_CONTAINER=${{HPCGPU_CONTAINER:-{IMAGE}}}" in text
    assert "export HPCGPU_CONTAINER_RUNTIME=${HPCGPU_CONTAINER_RUNTIME:-apptainer}" in text
    assert "HPCGPU_PYTHON" not in text and f"runs in the container image {IMAGE}" in text


def test_a_container_image_with_spaces_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        write(tmp_path, "md", "--container", "my image", "-o", "bad.sbatch")
    assert exit_info.value.code == 2 and "--container 'my image'" in capsys.readouterr().err


@pytest.mark.parametrize("runtime, expected", [
    ("apptainer", "apptainer exec --nv --bind {workdir} --pwd {workdir} " + IMAGE + " python -m apps.stencil"),
    ("singularity", "singularity exec --nv --bind {workdir} --pwd {workdir} " + IMAGE + " python -m apps.stencil"),
    ("podman", "podman run --rm --network=host --ipc=host --pid=host --uts=host --user {uid}:{gid} "
               "--volume {workdir}:{workdir} --workdir {workdir} --env SLURM_* --env PMI_* --env PMIX_* "
               "--env HPCGPU_* --env NCCL_* --env OMP_NUM_THREADS --env PYTHONUNBUFFERED "
               "--device nvidia.com/gpu=all " + IMAGE + " python -m apps.stencil"),
])
def test_every_rank_runs_in_the_runtime_with_the_gpus_passed_through(tmp_path, runtime, expected):
    workdir = tmp_path / "submit"
    workdir.mkdir()
    assert write(workdir, "stencil", "--gpus-per-node", "1", "--container", IMAGE, "--container-runtime", runtime,
                 "-o", "job.sbatch", "--", *SMALL_STENCIL) == 0
    fake_runtime(workdir, runtime)
    result = run_batch_script(workdir / "job.sbatch", workdir, extra={
        "FAKE_RUNTIME_RECORD": str(workdir / "runtime.txt"), "FAKE_IMAGE": IMAGE, "PYTHONPATH": str(ROOT),
        "SLURM_NTASKS_PER_NODE": "1", "HPCGPU_CHECK": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((workdir / "runs" / "stencil-77" / "summary.json").read_text())["app"] == "apps.stencil"
    recorded = (workdir / "runtime.txt").read_text().splitlines()
    assert len(recorded) == 1, recorded
    assert recorded[0].startswith(expected.format(workdir=workdir, uid=os.getuid(), gid=os.getgid())), recorded[0]
    assert f"[{runtime} {IMAGE}] python -m apps.stencil" in result.stdout


def test_pyxis_is_srun_flags_and_no_runtime_command(tmp_path):
    workdir = tmp_path / "submit"
    workdir.mkdir()
    assert write(workdir, "stencil", "--gpus-per-node", "1", "--container", IMAGE, "--container-runtime", "pyxis",
                 "-o", "job.sbatch", "--", *SMALL_STENCIL) == 0
    result = run_batch_script(workdir / "job.sbatch", workdir, extra={"PYTHONPATH": str(ROOT), "HPCGPU_CHECK": "0",
                                                                    "SLURM_NTASKS_PER_NODE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    srun = (workdir / "srun.txt").read_text()
    assert f"--container-image={IMAGE} --container-mounts={workdir} --container-workdir={workdir}" in srun


def test_a_missing_runtime_is_one_message_and_exit_2(tmp_path):
    workdir = tmp_path / "submit"
    workdir.mkdir()
    assert write(workdir, "stencil", "--cpu", "--container", IMAGE, "-o", "job.sbatch") == 0
    result = run_batch_script(workdir / "job.sbatch", workdir)
    assert result.returncode == 2
    assert "HPCGPU_CONTAINER_RUNTIME=apptainer but no apptainer command on this node" in result.stderr


@pytest.fixture(scope="module")
def podman_image() -> str:
    problem = _podman.image_problem()
    if problem is not None:
        if _podman.in_ci():
            pytest.fail(f"CI=true but the container image is not usable: {problem}; {_podman.HOW_TO_BUILD}",
                        pytrace=False)
        pytest.skip(f"no container image: {problem}; {_podman.HOW_TO_BUILD}")
    return _podman.IMAGE


@pytest.mark.slow
def test_podman_script_under_slurm_runs_each_rank_in_the_image_with_the_checksum_of_a_run_outside(
        slurm_cluster, podman_image, job_workdir, tmp_path):
    app_args = ["--model", "swe", "--nx", "48", "--ny", "24", "--steps", "20", "--no-plot", "--snapshot-every", "0"]
    script = tmp_path / "stencil-podman.sbatch"
    assert write(tmp_path, "stencil", "--cpu", "--ntasks-per-node", "2", "--time", "00:10:00", "--job-name",
                 "stencil-podman", "--container", podman_image, "--container-runtime", "podman",
                 "-o", str(script), "--", *app_args) == 0
    job = _slurm.run(script, job_workdir, timeout=400)
    assert job.returncode == 0, job.describe()
    assert _slurm.final_states(job.job_id) == [("COMPLETED", "0:0")], job.describe()
    log = job.log()
    assert "inside a podman container (/run/.containerenv)" in log, log[-6000:]
    assert "ranks: 2 on 1 node(s)" in log, log[-6000:]
    assert f"[podman {podman_image}] python -m apps.stencil" in log
    inside = job.summary()
    assert inside["n_ranks"] == 2
    reference = run_mpi(2, [sys.executable, "-m", "apps.stencil", "--quiet", *app_args, "--output", str(tmp_path / "o"),
                            "--summary", str(tmp_path / "outside.json")], timeout=300)
    assert reference.returncode == 0, reference.output
    assert inside["checksum"] == json.loads((tmp_path / "outside.json").read_text())["checksum"]

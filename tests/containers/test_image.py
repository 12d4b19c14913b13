"""The CPU image of container/Containerfile, run with Podman: what docs/containers.md promises.

* its default command is ``python -m hpcgpu info``, as a non-root user, and the report says it runs
  inside a Podman container;
* ``mpiexec -n 2 python -m apps.stencil --steps 50`` inside (the image's MPICH, checkpoints every 25
  steps) gives the checksum of the same run outside, and so does its checkpoint at step 25 restarted
  inside the container;
* ``hpcgpu check`` inside a container limited to fewer CPUs than the node flags the CPU set.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from hpcgpu.jobs.launch import run_command, run_mpi
from tests.containers._podman import IMAGE, PODMAN, podman_run

pytestmark = pytest.mark.slow

STENCIL = ["python", "-m", "apps.stencil", "--steps", "50", "--quiet"]


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> dict:
    """The reference: the same run on this machine's Python, outside the container."""
    directory = tmp_path_factory.mktemp("outside")
    result = run_mpi(2, [sys.executable, *STENCIL[1:], "--output", str(directory / "out"),
                         "--summary", str(directory / "summary.json")], timeout=600)
    assert result.returncode == 0, result.output
    return json.loads((directory / "summary.json").read_text())


def test_default_command_is_hpcgpu_info_as_a_non_root_user_and_names_podman(image):
    result = podman_run([], timeout=180)
    assert result.returncode == 0, result.output
    assert result.output.startswith("hpcgpu "), result.output
    assert "Container on " in result.output and "inside a podman container (/run/.containerenv)" in result.output
    assert "backend: cpu" in result.output
    user = run_command([*PODMAN, "run", "--rm", "--network=host", IMAGE, "id", "-u"], timeout=120)
    assert user.returncode == 0 and int(user.output.strip()) != 0, user.output


@pytest.fixture(scope="module")
def inside(image, tmp_path_factory) -> tuple[dict, str]:
    """The run inside, with a checkpoint every 25 steps: (its summary, its checkpoint directory)."""
    directory = tmp_path_factory.mktemp("inside")
    result = podman_run(["mpiexec", "-n", "2", *STENCIL, "--checkpoint-every", "25", "--checkpoint-dir",
                         str(directory / "checkpoints"), "--output", str(directory / "out"),
                         "--summary", str(directory / "summary.json")], timeout=600, workdir=directory)
    assert result.returncode == 0, result.output
    return json.loads((directory / "summary.json").read_text()), str(directory / "checkpoints")


def test_stencil_on_two_ranks_inside_equals_the_run_outside(inside, outside):
    summary, _ = inside
    assert summary["n_ranks"] == 2 and summary["steps"] == 50
    assert summary["checksum"] == outside["checksum"]
    assert summary["version"] == outside["version"]


def test_checkpoint_at_25_restarted_inside_equals_50_steps_outside(inside, outside):
    _, checkpoints = inside
    directory = os.path.dirname(checkpoints)
    step_25 = os.path.join(checkpoints, "ckpt_000000025")
    assert os.path.isdir(step_25), os.listdir(checkpoints)
    result = podman_run(["mpiexec", "-n", "2", *STENCIL, "--restart", step_25, "--output", f"{directory}/restart",
                         "--summary", f"{directory}/restart.json"], timeout=600, workdir=directory)
    assert result.returncode == 0, result.output
    with open(f"{directory}/restart.json") as handle:
        assert json.load(handle)["checksum"] == outside["checksum"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a node of 2 or more CPUs to give the container fewer")
def test_check_inside_a_container_with_one_cpu_flags_the_cpu_set(image, tmp_path):
    result = podman_run(["python", "-m", "hpcgpu", "check", "--no-probes", "--checkpoint-dir", str(tmp_path),
                         "--json", str(tmp_path / "check.json")],
                        timeout=180, options=["--cpuset-cpus", "0"], workdir=tmp_path)
    assert result.returncode == 3, result.output           # warnings only: the job can run, slower
    finding, = [f for f in json.loads((tmp_path / "check.json").read_text())["findings"] if f["check"] == "container"]
    assert finding["status"] == "warn"
    assert "podman container" in finding["detail"] and "CPU set smaller than the node" in finding["detail"]
    assert f"the node has {os.cpu_count()}" in finding["detail"]

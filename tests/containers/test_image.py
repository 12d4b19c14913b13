"""The CPU image of container/Containerfile, run with Podman: what docs/containers.md promises.

* its default command is ``python -m hpcgpu info``, as a non-root user, and the report says it runs
  inside a Podman container;
* ``mpiexec -n 2 python -m apps.stencil --steps 50`` inside (the image's MPICH) gives the checksum of
  the same run outside, and so does a checkpoint at step 25 restarted inside the container;
* ``hpcgpu check`` inside a container limited to fewer CPUs than the node flags the CPU set.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from hpcgpu.launch import run_command, run_mpi
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


def test_stencil_on_two_ranks_inside_equals_the_run_outside(image, outside, tmp_path):
    result = podman_run(["mpiexec", "-n", "2", *STENCIL, "--output", str(tmp_path / "out"),
                         "--summary", str(tmp_path / "summary.json")], timeout=600, workdir=tmp_path)
    assert result.returncode == 0, result.output
    inside = json.loads((tmp_path / "summary.json").read_text())
    assert inside["n_ranks"] == 2 and inside["steps"] == 50
    assert inside["checksum"] == outside["checksum"]
    assert inside["version"] == outside["version"]


def test_checkpoint_at_25_restarted_inside_equals_50_steps_outside(image, outside, tmp_path):
    checkpoints = str(tmp_path / "checkpoints")
    first = podman_run(["mpiexec", "-n", "2", *STENCIL[:3], "--steps", "25", "--quiet", "--checkpoint-every", "25",
                        "--checkpoint-dir", checkpoints, "--output", str(tmp_path / "first")],
                       timeout=600, workdir=tmp_path)
    assert first.returncode == 0, first.output
    assert os.path.isdir(os.path.join(checkpoints, "ckpt_000000025")), os.listdir(checkpoints)
    second = podman_run(["mpiexec", "-n", "2", *STENCIL, "--restart", "latest", "--checkpoint-dir", checkpoints,
                         "--output", str(tmp_path / "second"), "--summary", str(tmp_path / "summary.json")],
                        timeout=600, workdir=tmp_path)
    assert second.returncode == 0, second.output
    assert json.loads((tmp_path / "summary.json").read_text())["checksum"] == outside["checksum"]


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

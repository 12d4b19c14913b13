"""Running the CI's container image (``.ci/container/build-image.sh``) with Podman, bounded in time.

The tests use an image that is there and never build one: ``.ci/run`` installs Podman, writes its
configuration and builds the image before the tests. Without Podman or the image the tests skip and
say why; under ``CI=true`` they fail instead, so a broken image can never pass CI silently.

Podman runs here as root with runc, the cgroupfs manager and host networking (no CNI set-up); a
container is named, so one that outlives its timeout is removed with its processes, not left behind
under conmon.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

from hpcgpu.jobs.launch import RunResult, run_command
from tests.jobscripts._slurm import in_ci

#: The image .ci/container/build-image.sh builds (same variable, same default).
IMAGE = os.environ.get("HPCGPU_TEST_IMAGE", "localhost/hpcgpu:ci-cpu")
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
HOW_TO_BUILD = ("`.ci/run` builds it with `bash .ci/container/build-image.sh` (as root, with podman, runc and "
                "debootstrap installed); see docs/containers.md")

__all__ = ["IMAGE", "HOW_TO_BUILD", "image_problem", "in_ci", "podman_run"]


def image_problem(timeout: float = 60) -> str | None:
    """Why the test image cannot be used here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman not found"
    try:
        result = subprocess.run([*PODMAN, "image", "exists", IMAGE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"podman image exists {IMAGE} did not answer within {timeout:.0f} s"
    if result.returncode != 0:
        return f"no image {IMAGE} (podman image exists: exit {result.returncode} {result.stderr.strip()})"
    return None


def podman_run(command: list[str], timeout: float, options: list[str] = (), workdir=None) -> RunResult:
    """``podman run --rm`` of ``command`` in :data:`IMAGE` as the caller's user, with ``workdir`` (a host
    directory) mounted at its own path and used as the working directory; removed after ``timeout``."""
    name = f"hpcgpu-test-{uuid.uuid4().hex[:12]}"
    mounts = ["--volume", f"{workdir}:{workdir}", "--workdir", str(workdir)] if workdir else []
    run = [*PODMAN, "run", "--rm", "--name", name, "--network=host", "--user", f"{os.getuid()}:{os.getgid()}",
           *mounts, *options, IMAGE, *command]
    result = run_command(run, timeout, label="podman")
    if result.timed_out:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", name], capture_output=True, timeout=60)
    return result

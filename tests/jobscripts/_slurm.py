"""Submitting the job scripts to the one-node CI Slurm cluster (``.ci/slurm``) and reading what they left.

The tests use that cluster when it runs and never set it up: installing Slurm and munge, writing
/etc/slurm and starting the daemons is ``.ci/slurm/start-cluster.sh``'s job (``.ci/run`` calls it
before the tests). Without a cluster the Slurm tests skip and say why (under ``CI=true`` they fail).

Every wait is bounded: a job that outlives its timeout is cancelled and the test fails with the
job's log. Jobs run in a scratch working directory (``sbatch`` is started there, so it is
``SLURM_SUBMIT_DIR``); ``HPCGPU_ROOT`` points the scripts at this checkout and ``HPCGPU_PYTHON`` at
the interpreter running the tests.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOBSCRIPTS = ROOT / "jobscripts"
FAKE_GPU_DIR = Path("/var/lib/slurm-ci")
#: ``ClusterName`` in the slurm.conf that ``.ci/slurm/start-cluster.sh`` writes.
CI_CLUSTER_NAME = "ci"
HOW_TO_START = ("`.ci/run` starts one with `bash .ci/slurm/start-cluster.sh` (as root; SLURM_CI_FAKE_GPUS=2 "
                "adds the fake GPUs the GPU-script tests need); see docs/testing.md")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE"}


def in_ci() -> bool:
    """True when the CI runs us (CI=true): then an unusable cluster is a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _ask(command: list[str], timeout: float) -> tuple[int, str]:
    """(exit code, stdout + stderr) of a Slurm client command; 124 with a note if it hangs."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"{shlex.join(command)} did not answer within {timeout:.0f} s"
    return result.returncode, (result.stdout + result.stderr).strip()


def cluster_problem(timeout: float = 30) -> str | None:
    """Why no usable CI Slurm cluster answers here, or None when one does.

    Only asks (``sinfo``, ``scontrol show config``): the test suite never installs, configures or
    starts Slurm or munge. ``.ci/slurm/start-cluster.sh`` does that (``.ci/run`` calls it first).
    A cluster that is not the CI one (``ClusterName=ci``) is not used: the tests submit jobs and
    rely on its settings (2 CPUs, ``jobcomp/filetxt`` for ``sacct -c``, quick requeues).
    """
    if os.environ.get("HPCGPU_SKIP_SLURM") == "1" and not in_ci():
        return "HPCGPU_SKIP_SLURM=1"
    missing = [name for name in ("sinfo", "sbatch", "scancel", "scontrol", "sacct") if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not found (Slurm's client commands are not installed)"
    code, out = _ask(["sinfo", "-h", "-o", "%T"], timeout)
    if code != 0:
        return f"slurmctld not answering (sinfo exit {code}: {out[-500:]})"
    states = out.split()
    if not any(state.rstrip("*~#!%$@^-") in ("idle", "mixed", "allocated", "completing") for state in states):
        return f"no node is up (sinfo node states: {', '.join(states) or 'none'})"
    code, out = _ask(["scontrol", "show", "config"], timeout)
    name = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.M)
    if code != 0 or name is None:
        return f"scontrol show config failed (exit {code}: {out[-500:]})"
    if name.group(1) != CI_CLUSTER_NAME:
        return (f"the Slurm cluster here is {name.group(1)!r}, not the CI test cluster {CI_CLUSTER_NAME!r}; "
                "the job-script tests submit jobs only to that one")
    return None


def job_variables(environment) -> list[str]:
    """Names of Slurm job variables in ``environment`` (all ``SLURM_*`` but ``SLURM_CONF``).

    A pytest started inside a Slurm job has them; passed on, they would make the reference run (and,
    through ``--export=ALL``, the test's jobs, since 22.05 does not set ``SLURM_JOB_END_TIME`` itself)
    take that job's wall-time limit.
    """
    return [name for name in environment if name.startswith("SLURM_") and name != "SLURM_CONF"]


def submit_environment() -> dict[str, str]:
    """This process's environment without Slurm job variables: what sbatch gets and exports."""
    excluded = set(job_variables(os.environ))
    return {name: value for name, value in os.environ.items() if name not in excluded}


def fake_gpu_count(timeout: float = 30) -> int:
    """gres/gpu count of the cluster's node (0 without fake GPUs)."""
    _, out = _ask(["sinfo", "-h", "-o", "%G"], timeout)
    match = re.search(r"gpu:(\d+)", out)
    return int(match.group(1)) if match else 0


def fake_gpus_are_devices(count: int) -> bool:
    """Slurm sets CUDA_VISIBLE_DEVICES only for GPU files that are device nodes (mknod may be refused)."""
    return count > 0 and all((FAKE_GPU_DIR / f"fake-gpu{i}").is_char_device() for i in range(count))


def script_app_line(script: Path) -> tuple[str, list[str]]:
    """(function, [app, args...]) of the script's ``hpcgpu_run``/``hpcgpu_run_preemptible`` call."""
    for line in script.read_text().splitlines():
        if line.split()[:1] in (["hpcgpu_run"], ["hpcgpu_run_preemptible"]):   # comments may hold a lone quote
            words = shlex.split(line, comments=True)
            return words[0], words[1:]
    raise AssertionError(f"{script}: no hpcgpu_run / hpcgpu_run_preemptible line")


@dataclass
class Job:
    """A submitted job: id, where it ran, and what it left behind."""

    job_id: str
    workdir: Path
    name: str
    returncode: int | None = None
    sbatch_output: str = ""
    process: subprocess.Popen | None = field(default=None, repr=False)

    def _stem(self, array_task: int | None) -> str:
        return f"{self.name}-{self.job_id}" if array_task is None else f"{self.name}-{self.job_id}_{array_task}"

    def run_dir(self, array_task: int | None = None) -> Path:
        """runs/<job-name>-<job-id>[_<task>]: the app's output, summary.json, checkpoints/, info.txt."""
        return self.workdir / "runs" / self._stem(array_task)

    def log_path(self, array_task: int | None = None) -> Path:
        """<job-name>-<job-id>[_<task>].log in the working directory: the job's stdout and stderr (--output)."""
        return self.workdir / f"{self._stem(array_task)}.log"

    def log(self, array_task: int | None = None) -> str:
        path = self.log_path(array_task)
        return path.read_text(errors="replace") if path.exists() else f"(no log at {path})"

    def summary(self, array_task: int | None = None) -> dict:
        path = self.run_dir(array_task) / "summary.json"
        assert path.exists(), f"no summary at {path}; job log:\n{self.log(array_task)[-6000:]}"
        return json.loads(path.read_text())

    def states(self) -> list[tuple[str, str]]:
        """(State, ExitCode) of every finished run of the job (requeued runs first), from the jobcomp record."""
        return sacct_states(self.job_id)

    def describe(self, array_task: int | None = None) -> str:
        return (f"job {self.job_id} ({self.name}) sbatch exit {self.returncode}, runs {self.states()}\n"
                f"sbatch said: {self.sbatch_output.strip()}\n--- log {self.log_path(array_task)}:\n"
                f"{self.log(array_task)[-8000:]}")


def sacct_states(job_id: str) -> list[tuple[str, str]]:
    out = subprocess.run(["sacct", "-c", "-j", job_id, "--format=JobID,State,ExitCode", "-P", "-n"],
                         capture_output=True, text=True, timeout=30).stdout
    return [tuple(line.split("|")[1:3]) for line in out.splitlines() if line.split("|")[0] == job_id]


def final_states(job_id: str, timeout: float = 30) -> list[tuple[str, str]]:
    """The job's runs once the last one is recorded as finished (the record lags the end by a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        states = sacct_states(job_id)
        if states and states[-1][0] in FINAL_STATES or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def _export(app_args: str, extra_env: dict[str, str] | None) -> str:
    values = {"HPCGPU_ROOT": str(ROOT), "HPCGPU_PYTHON": sys.executable, "HPCGPU_APP_ARGS": app_args,
              **(extra_env or {})}
    for name, value in values.items():
        assert "," not in value, f"{name}={value!r}: sbatch --export splits values at commas"
    return "--export=ALL," + ",".join(f"{name}={value}" for name, value in values.items())


def start(script: Path, workdir: Path, app_args: str = "", sbatch_args=(), extra_env=None) -> Job:
    """Submit ``script`` with ``sbatch --wait`` in the background; returns once the job id is known."""
    workdir.mkdir(parents=True, exist_ok=True)  # the scripts' --output goes here; Slurm would not create it
    name = re.search(r"^#SBATCH --job-name=(\S+)", script.read_text(), re.M).group(1)
    command = ["sbatch", "--parsable", "--wait", _export(app_args, extra_env), *sbatch_args, str(script)]
    process = subprocess.Popen(command, cwd=workdir, env=submit_environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    first_line = process.stdout.readline().strip()
    if not first_line:
        _, error = process.communicate(timeout=30)
        raise AssertionError(f"sbatch refused {script.name} (exit {process.returncode}): {error.strip()}\n"
                             f"command: {shlex.join(command)}")
    return Job(job_id=first_line.split(";")[0], workdir=workdir, name=name, process=process)


def wait(job: Job, timeout: float) -> Job:
    """Wait for ``sbatch --wait`` to return (it waits across requeues); cancel the job after ``timeout``."""
    try:
        out, error = job.process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cancel(job)
        job.process.kill()
        out, error = job.process.communicate()
        job.returncode, job.sbatch_output = -9, out + error
        raise AssertionError(f"job {job.job_id} did not finish within {timeout:.0f} s (cancelled)\n"
                             f"{job.describe()}") from None
    job.returncode, job.sbatch_output = job.process.returncode, out + error
    return job


def run(script: Path, workdir: Path, app_args: str = "", sbatch_args=(), extra_env=None,
        timeout: float = 120) -> Job:
    """Submit ``script`` and wait for it (bounded)."""
    return wait(start(script, workdir, app_args, sbatch_args, extra_env), timeout)


def cancel(job: Job) -> None:
    subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30)


def sbatch_test_only(script: Path, workdir: Path, sbatch_args=()) -> subprocess.CompletedProcess:
    """``sbatch --test-only``: validates the script's options against the cluster; creates no job."""
    return subprocess.run(["sbatch", "--test-only", _export("", None), *sbatch_args, str(script)], cwd=workdir,
                          env=submit_environment(), capture_output=True, text=True, timeout=30)

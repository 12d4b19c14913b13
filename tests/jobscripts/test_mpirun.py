"""Launchers for machines without Slurm: the GPU-per-rank wrapper and the MPICH / Open MPI scripts.

The MPICH script really runs here (2 ranks of apps.stencil with the wheel's hydra mpiexec); Open
MPI is not installed, so its script runs against a stand-in ``mpirun`` that records its flags and
starts the command as a single rank.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import mpiexec_path
from tests.jobscripts._slurm import JOBSCRIPTS

WRAPPER = JOBSCRIPTS / "mpirun" / "gpu-per-rank.sh"
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "PALS_LOCAL_RANKID",
                        "MV2_COMM_WORLD_LOCAL_RANK", "FLUX_TASK_LOCAL_ID", "SLURM_LOCALID")
SMALL_JACOBI = ["--model", "jacobi", "--nx", "64", "--ny", "40", "--norm-every", "5", "--steps", "30"]


def wrapped_device(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in LOCAL_RANK_VARIABLES and k not in ("CUDA_VISIBLE_DEVICES", "HPCGPU_GPUS_PER_NODE")}
    clean["PATH"] = "/usr/bin:/bin"  # no nvidia-smi: the GPU count comes from the environment only
    return subprocess.run([str(WRAPPER), "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'], env={**clean, **env},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("variable", LOCAL_RANK_VARIABLES)
def test_wrapper_gives_local_rank_i_the_ith_gpu(variable):
    result = wrapped_device({variable: "3", "HPCGPU_GPUS_PER_NODE": "8"})
    assert result.returncode == 0 and result.stdout.strip() == "3" and not result.stderr


def test_wrapper_picks_from_a_visible_list_and_keeps_a_single_bound_gpu():
    assert wrapped_device({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}).stdout.strip() == "6"
    # srun --gpus-per-task=1 already bound the task: leave it alone whatever the local rank.
    assert wrapped_device({"SLURM_LOCALID": "5", "CUDA_VISIBLE_DEVICES": "2"}).stdout.strip() == "2"


def test_wrapper_prefers_the_mpi_local_rank_over_slurm_localid():
    # mpiexec under Slurm starts its proxies with srun: every rank inherits the proxy's SLURM_LOCALID=0.
    result = wrapped_device({"MPI_LOCALRANKID": "1", "SLURM_LOCALID": "0", "HPCGPU_GPUS_PER_NODE": "4"})
    assert result.stdout.strip() == "1"


def test_wrapper_warns_when_ranks_must_share_a_gpu():
    result = wrapped_device({"OMPI_COMM_WORLD_LOCAL_RANK": "5", "HPCGPU_GPUS_PER_NODE": "4"})
    assert result.stdout.strip() == "1"
    assert "share GPU 1" in result.stderr


def test_wrapper_without_a_launcher_runs_the_command_unchanged():
    result = wrapped_device({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.returncode == 0 and result.stdout.strip() == "0,1"
    assert "no node-local rank" in result.stderr


def run_dir_of(output: str, workdir: Path) -> Path:
    match = re.search(r"run directory (\S+);", output)
    assert match, output
    return workdir / match.group(1)


def test_mpich_script_runs_two_bound_ranks_each_with_its_own_gpu(tmp_path):
    env = {**os.environ, "HPCGPU_PYTHON": sys.executable, "HPCGPU_MPIEXEC": mpiexec_path(), "GPUS_PER_NODE": "2",
           "CPUS_PER_RANK": "1", "HPCGPU_GPU_WRAPPER_VERBOSE": "1", "HPCGPU_APP_ARGS": "--quiet"}
    result = subprocess.run([str(JOBSCRIPTS / "mpirun" / "run-mpich.sh"), "apps.stencil", *SMALL_JACOBI],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "-n 2 -ppn 2 -bind-to core:1" in output
    for rank in (0, 1):   # once each for hpcgpu info, hpcgpu check and the app
        assert output.count(f"local rank {rank} (MPI_LOCALRANKID) -> CUDA_VISIBLE_DEVICES={rank}") == 3, output
    assert "hpcgpu check: HEALTHY" in output
    run_dir = run_dir_of(output, tmp_path)
    info = (run_dir / "info.txt").read_text()
    assert "ranks: 2 on 1 node(s)" in info
    if len(os.sched_getaffinity(0)) >= 2:
        # -bind-to core:1: each rank alone on its core (the CPUs column of the report).
        cpus = re.findall(r"^\s+(\d+) \S+\s+\d+\s+-\s+-\s+(\S+)", info, re.M)
        assert len(cpus) == 2 and cpus[0][1] != cpus[1][1] and all("-" not in c and "," not in c for _, c in cpus), info
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["n_ranks"] == 2 and summary["steps"] == 30


@pytest.mark.parametrize("script, variable", [("run-mpich.sh", "HPCGPU_MPIEXEC"), ("run-openmpi.sh", "HPCGPU_MPIRUN")])
def test_a_missing_launcher_is_one_line_and_exit_2_before_anything_runs(tmp_path, script, variable):
    env = {**os.environ, "HPCGPU_PYTHON": sys.executable, variable: str(tmp_path / "no-such-launcher"),
           "GPUS_PER_NODE": "1"}
    result = subprocess.run([str(JOBSCRIPTS / "mpirun" / script), "apps.stencil", *SMALL_JACOBI],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stdout + result.stderr
    assert f"the launcher {tmp_path / 'no-such-launcher'} is not a command here" in result.stderr
    assert variable in result.stderr and "anyway" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_openmpi_script_maps_binds_and_exports(tmp_path):
    record = tmp_path / "mpirun-args.txt"
    fake = tmp_path / "mpirun"
    # A stand-in for Open MPI's mpirun: record the flags, then start the wrapped command as rank 0 of 1.
    fake.write_text(f"""#!/bin/bash
printf '%s\\n' "$@" > {record}
while [ $# -gt 0 ] && [[ "$1" != */gpu-per-rank.sh ]]; do shift; done
OMPI_COMM_WORLD_LOCAL_RANK=0 exec "$@"
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "HPCGPU_PYTHON": sys.executable, "HPCGPU_MPIRUN": str(fake), "GPUS_PER_NODE": "4",
           "CPUS_PER_RANK": "6", "N_NODES": "2", "NCCL_DEBUG": "WARN", "HPCGPU_APP_ARGS": "--quiet"}
    result = subprocess.run([str(JOBSCRIPTS / "mpirun" / "run-openmpi.sh"), "apps.stencil", *SMALL_JACOBI],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    args = record.read_text().split("\n")
    assert args[:2] == ["-np", "8"]
    assert "--map-by" in args and args[args.index("--map-by") + 1] == "ppr:4:node:pe=6"
    assert args[args.index("--bind-to") + 1] == "core" and "--report-bindings" in args
    exported = {args[i + 1] for i, a in enumerate(args) if a == "-x"}
    assert {"PATH", "PYTHONPATH", "OMP_NUM_THREADS", "NCCL_DEBUG", "HPCGPU_ROOT", "HPCGPU_PYTHON"} <= exported
    assert args[args.index(str(WRAPPER)) + 1:][:3] == [sys.executable, "-m", "apps.stencil"]
    run_dir = run_dir_of(output, tmp_path)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 30

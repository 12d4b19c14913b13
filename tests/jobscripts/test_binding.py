"""The job scripts apply the binding the topology report recommends (``hpcgpu info --apply-to``).

``common.sh`` runs ``python -m hpcgpu info --apply-to RUN_DIR/topology.sh`` before the app; where that
file exports a recommendation (GPU nodes with NUMA / InfiniBand information), every rank starts through
a wrapper that sources it for its node-local rank and runs under ``taskset -c``. Here the recommendation
is written by hand (this machine has no GPU), and one batch script runs end to end with a stand-in srun.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from tests.jobscripts._slurm import JOBSCRIPTS, ROOT
from tests.jobscripts.test_jobscript_cli import SMALL_STENCIL, run_batch_script, write

ALLOWED = sorted(os.sched_getaffinity(0))
PROBE = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), os.environ.get('NCCL_IB_HCA'))"]


def recommendation(cpus_of_rank0: str) -> str:
    """What ``hpcgpu info --apply`` prints on a node with two GPUs, one HCA each."""
    return "\n".join([
        "# hpcgpu info --apply: computed on gpu01; bind with: taskset -c \"$HPCGPU_RECOMMENDED_CPUS\" ...",
        'case "${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${PMI_LOCAL_RANK:-${PALS_LOCAL_RANKID:-'
        '${SLURM_LOCALID:-0}}}}}" in',
        f"  0) export HPCGPU_RECOMMENDED_CPUS={cpus_of_rank0} NCCL_IB_HCA='=mlx5_0' ;;",
        f"  1) export HPCGPU_RECOMMENDED_CPUS={ALLOWED[-1]} NCCL_IB_HCA='=mlx5_1' ;;",
        "esac", ""])


def wrapped_probe(tmp_path, topology_text: str, env: dict[str, str]):
    """Source common.sh, pick the binding for ``topology_text``, and run the probe through the wrapper."""
    topology = tmp_path / "topology.sh"
    topology.write_text(topology_text)
    command = shlex.join(PROBE)
    snippet = f'_hpcgpu_binding "{topology}" && "${{HPCGPU_RANK_WRAPPER[@]}}" {command}'
    base = {"PATH": "/usr/bin:/bin", "HPCGPU_ROOT": str(ROOT), "HPCGPU_PYTHON": "bash", "HOME": "/tmp"}
    return subprocess.run(["bash", "-c", f'source "{JOBSCRIPTS}/common.sh" && {snippet}'],
                          env={**base, **env}, capture_output=True, text=True, timeout=30)


def test_each_local_rank_gets_its_recommended_cpus_and_hca(tmp_path):
    for local_rank, cpus, hca in (("0", [ALLOWED[0]], "=mlx5_0"), ("1", [ALLOWED[-1]], "=mlx5_1")):
        result = wrapped_probe(tmp_path, recommendation(str(ALLOWED[0])), {"SLURM_LOCALID": local_rank})
        assert result.returncode == 0, result.stderr
        assert "binding: as the report recommends" in result.stdout
        assert result.stdout.splitlines()[-1] == f"{cpus} {hca}"


def test_a_user_hca_wins_and_forbidden_cpus_keep_the_launcher_binding(tmp_path):
    kept = wrapped_probe(tmp_path, recommendation(str(ALLOWED[0])), {"SLURM_LOCALID": "0", "NCCL_IB_HCA": "mlx5_4"})
    assert kept.stdout.splitlines()[-1] == f"[{ALLOWED[0]}] mlx5_4"
    forbidden = wrapped_probe(tmp_path, recommendation("100000"), {"SLURM_LOCALID": "0", "SLURM_PROCID": "3"})
    assert forbidden.returncode == 0
    assert forbidden.stdout.splitlines()[-1] == f"{ALLOWED} =mlx5_0"
    assert "rank 3: cannot bind to CPUs 100000 (not allowed for this job); keeping the launcher binding" in forbidden.stderr


def test_no_recommendation_or_launcher_binding_means_no_wrapper(tmp_path):
    nothing = "# hpcgpu info --apply: nothing to export on vm (no GPU, or no NUMA / IB information)\n"
    plain = wrapped_probe(tmp_path, nothing, {})
    assert "binding: the launcher's (the report recommends none here" in plain.stdout
    assert plain.stdout.splitlines()[-1] == f"{ALLOWED} None"
    declined = wrapped_probe(tmp_path, recommendation(str(ALLOWED[0])), {"HPCGPU_BIND": "launcher"})
    assert "binding: the launcher's (HPCGPU_BIND=launcher)" in declined.stdout
    assert declined.stdout.splitlines()[-1] == f"{ALLOWED} None"


def test_info_flags_default_to_the_nccl_view_on_gpu_nodes():
    def flags(env):
        base = {"PATH": "/usr/bin:/bin", "HPCGPU_ROOT": str(ROOT), "HPCGPU_PYTHON": "bash", "HOME": "/tmp"}
        return subprocess.run(["bash", "-c", f'source "{JOBSCRIPTS}/common.sh" && echo "[$HPCGPU_INFO_FLAGS]"'],
                              env={**base, **env}, capture_output=True, text=True, timeout=30).stdout.split()[-1]

    assert flags({"SLURM_GPUS_ON_NODE": "8"}) == "[--nccl-topology]"
    assert flags({}) == "[]"
    assert flags({"SLURM_GPUS_ON_NODE": "8", "HPCGPU_INFO_FLAGS": ""}) == "[]"


def test_batch_script_writes_the_report_and_its_recommendation(tmp_path):
    """A written GPU script through the stand-in srun, the info step on: info.txt, topology.sh, the binding
    line, then the app (this machine recommends nothing, so no wrapper)."""
    workdir = tmp_path / "submit"
    workdir.mkdir()
    assert write(workdir, "stencil", "--gpus-per-node", "1", "-o", "job.sbatch", "--", *SMALL_STENCIL) == 0
    result = run_batch_script(workdir / "job.sbatch", workdir, extra={"HPCGPU_INFO": "1", "SLURM_NTASKS_PER_NODE": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = workdir / "runs" / "stencil-77"
    assert "ranks: 1 on 1 node(s)" in (run_dir / "info.txt").read_text()
    assert (run_dir / "topology.sh").read_text().startswith("# hpcgpu info --apply")
    log = result.stdout
    assert log.index("-m hpcgpu info --nccl-topology --apply-to") < log.index("binding: ") < log.index("launch: ")
    assert json.loads((run_dir / "summary.json").read_text())["n_ranks"] == 1

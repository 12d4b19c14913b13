"""The job scripts as text: GPU and CPU twins differ only in resource lines; common.sh's pieces.

The CPU twins are what CI submits to a real Slurm (test_slurm_jobs.py); these checks make that
evidence carry over to the GPU scripts: same commands, same app flags, same Slurm behaviour
options, and GPU resource lines that ask for one task per GPU, every GPU of a node visible to its ranks.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.jobscripts._slurm import JOBSCRIPTS, ROOT

APPS = ("stencil", "md", "train")
KINDS = ("single-node", "multi-node", "preemptible", "sweep")
GPUS_PER_NODE = 8
#: #SBATCH options that size and place a job; the only ones allowed to differ between the twins.
RESOURCE_OPTIONS = {
    "nodes", "ntasks", "ntasks-per-node", "gpus-per-task", "gpus-per-node", "gpus", "gres", "gpu-bind",
    "cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "overcommit", "oversubscribe",
    "exclusive", "time", "partition", "constraint",
}
GPU_OPTIONS = {"gpus-per-task", "gpus-per-node", "gpus", "gres", "gpu-bind", "cpus-per-gpu", "mem-per-gpu"}
SBATCH_LINE = re.compile(r"^#SBATCH\s+--([a-z-]+)(?:=(\S+))?\s*$")


def sbatch_options(text: str) -> dict[str, str | None]:
    """The ``#SBATCH --name[=value]`` lines (``##SBATCH`` is a comment to Slurm and ignored here)."""
    options = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            match = SBATCH_LINE.match(line)
            assert match, f"write #SBATCH lines as '--name=value' (one per line), found {line!r}"
            options[match.group(1)] = match.group(2)
    return options


def without_resources(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if not ((match := SBATCH_LINE.match(line)) and match.group(1) in RESOURCE_OPTIONS)]


PAIRS = [(app, kind) for app in APPS for kind in KINDS]


def test_every_app_has_every_kind_in_both_flavours_and_nothing_else():
    expected = {f"{app}-{kind}.sbatch" for app, kind in PAIRS}
    assert {p.name for p in (JOBSCRIPTS / "gpu").glob("*.sbatch")} == expected
    assert {p.name for p in (JOBSCRIPTS / "cpu").glob("*.sbatch")} == expected


@pytest.mark.parametrize("app,kind", PAIRS, ids=[f"{a}-{k}" for a, k in PAIRS])
def test_gpu_and_cpu_scripts_differ_only_in_resource_lines(app, kind):
    gpu = (JOBSCRIPTS / "gpu" / f"{app}-{kind}.sbatch").read_text()
    cpu = (JOBSCRIPTS / "cpu" / f"{app}-{kind}.sbatch").read_text()
    gpu_lines, cpu_lines = without_resources(gpu), without_resources(cpu)
    assert gpu_lines == cpu_lines, "\n".join(
        f"gpu: {g!r}\ncpu: {c!r}" for g, c in zip(gpu_lines, cpu_lines) if g != c) or "line counts differ"


@pytest.mark.parametrize("app,kind", PAIRS, ids=[f"{a}-{k}" for a, k in PAIRS])
def test_gpu_scripts_ask_for_one_task_per_gpu_and_keep_peers_visible(app, kind):
    options = sbatch_options((JOBSCRIPTS / "gpu" / f"{app}-{kind}.sbatch").read_text())
    assert options.get("gpus-per-node") == str(GPUS_PER_NODE)
    assert options.get("ntasks-per-node") == options["gpus-per-node"], "one task per GPU"
    assert "ntasks" not in options, "the task count follows from --nodes x --ntasks-per-node"
    # Per-task GPU binding hides the neighbours' GPUs and breaks CUDA IPC (--peer-halo, MD peer exchange,
    # --allreduce peer); hpcgpu picks GPU local_rank % G itself.
    assert "gpus-per-task" not in options and "gpu-bind" not in options
    assert int(options["cpus-per-task"]) >= 1
    nodes = int(options["nodes"])
    assert nodes > 1 if kind == "multi-node" else nodes == 1
    assert re.fullmatch(r"\d+:\d\d:\d\d", options["time"])


@pytest.mark.parametrize("app,kind", PAIRS, ids=[f"{a}-{k}" for a, k in PAIRS])
def test_cpu_scripts_say_they_are_ci_fixtures(app, kind):
    text = (JOBSCRIPTS / "cpu" / f"{app}-{kind}.sbatch").read_text()
    assert "CI fixture, sized for a\n# 2-core test machine" in text


@pytest.mark.parametrize("app,kind", PAIRS, ids=[f"{a}-{k}" for a, k in PAIRS])
def test_cpu_scripts_ask_for_no_gpus(app, kind):
    options = sbatch_options((JOBSCRIPTS / "cpu" / f"{app}-{kind}.sbatch").read_text())
    assert not GPU_OPTIONS & set(options)
    assert int(options["cpus-per-task"]) >= 1


@pytest.mark.parametrize("app,kind", PAIRS, ids=[f"{a}-{k}" for a, k in PAIRS])
def test_common_options_and_launch_line(app, kind):
    text = (JOBSCRIPTS / "cpu" / f"{app}-{kind}.sbatch").read_text()
    options = sbatch_options(text)
    assert options["job-name"] == f"{app}-{kind}"
    assert "open-mode" in options and options["open-mode"] == "append"
    assert 'source "${HPCGPU_ROOT:-$SLURM_SUBMIT_DIR}/jobscripts/common.sh"' in text
    if kind == "sweep":
        assert options["output"] == "%x-%A_%a.log"   # the submit directory: Slurm cannot create a directory
        first, last = (int(v) for v in options["array"].split("-"))
        values = re.search(r"^VALUES=\((.*)\)$", text, re.M).group(1).split()
        assert (first, last) == (0, len(values) - 1), "--array must cover VALUES exactly"
    else:
        assert options["output"] == "%x-%j.log"
        assert "array" not in options
    if kind == "preemptible":
        assert options["signal"] == "B:USR1@120"
        assert "requeue" in options
        assert re.search(rf"^hpcgpu_run_preemptible apps\.{app} .*--checkpoint-every \d+", text, re.M)
    else:
        assert "requeue" not in options and "signal" not in options
        assert re.search(rf"^hpcgpu_run apps\.{app} ", text, re.M)


def test_all_shell_files_parse():
    files = [*JOBSCRIPTS.glob("*/*.sbatch"), *JOBSCRIPTS.glob("*.sh"), *JOBSCRIPTS.glob("mpirun/*.sh")]
    assert len(files) >= 2 * len(PAIRS) + 4
    for path in files:
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path}: {result.stderr}"


def common(snippet: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``snippet`` in bash after sourcing common.sh with a clean Slurm-less environment."""
    base = {"PATH": "/usr/bin:/bin", "HPCGPU_ROOT": str(ROOT), "HPCGPU_PYTHON": "bash", "HOME": "/tmp"}
    return subprocess.run(["bash", "-c", f'source "{JOBSCRIPTS}/common.sh" && {snippet}'],
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=30)


def test_srun_mpi_plugin_is_the_site_default_unless_set():
    assert common('echo "${HPCGPU_LAUNCH[*]}"').stdout.split() == ["srun", "--cpu-bind=cores"]
    launch = common('echo "${HPCGPU_LAUNCH[*]}"', {"HPCGPU_SRUN_MPI": "pmix", "HPCGPU_CPU_BIND": "",
                                                  "HPCGPU_SRUN_FLAGS": "--distribution=block:block"})
    assert launch.stdout.split() == ["srun", "--mpi=pmix", "--distribution=block:block"]


def test_ranks_per_node_follow_the_gpus_slurm_gave():
    def launch(gpus, tasks, nodes="2"):
        return common('echo "${HPCGPU_LAUNCH[*]}"', {"SLURM_GPUS_ON_NODE": gpus, "SLURM_NTASKS_PER_NODE": tasks,
                                                   "SLURM_JOB_NUM_NODES": nodes})

    fewer_gpus = launch("4", "8")
    assert fewer_gpus.stdout.split()[-3:] == ["--cpu-bind=cores", "--ntasks-per-node=4", "--ntasks=8"]
    assert "starting 4 ranks per node, one per GPU" in fewer_gpus.stdout
    assert launch("8", "8(x2)").stdout.split() == ["srun", "--cpu-bind=cores"]
    idle = launch("8", "4")
    assert idle.stdout.split() == ["srun", "--cpu-bind=cores"] and "--ntasks-per-node=8" in idle.stderr
    assert launch("", "8").stdout.split() == ["srun", "--cpu-bind=cores"]   # a CPU job


def test_installed_hpcgpu_needs_no_checkout(tmp_path):
    """Outside a checkout (no HPCGPU_ROOT, submit directory not a checkout) nothing goes on PYTHONPATH."""
    env = {"PATH": "/usr/bin:/bin", "HPCGPU_PYTHON": "bash", "HOME": "/tmp", "SLURM_SUBMIT_DIR": str(tmp_path)}
    result = subprocess.run(["bash", "-c", f'source "{JOBSCRIPTS}/common.sh" && echo "root=$HPCGPU_ROOT '
                             'path=$PYTHONPATH"'], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["root=", "path="]
    checkout = subprocess.run(["bash", "-c", f'source "{JOBSCRIPTS}/common.sh" && echo "$HPCGPU_ROOT"'],
                              env={**env, "SLURM_SUBMIT_DIR": str(ROOT)}, capture_output=True, text=True, timeout=30)
    assert checkout.stdout.strip() == str(ROOT)


def test_threads_follow_cpus_per_task():
    result = common('echo "$OMP_NUM_THREADS $SRUN_CPUS_PER_TASK $PYTHONPATH"', {"SLURM_CPUS_PER_TASK": "7"})
    assert result.stdout.split() == ["7", "7", str(ROOT)]


def test_run_directory_names():
    def run_dir(env):
        return common("hpcgpu_run_dir stencil", env).stdout.strip()

    assert run_dir({"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "stencil-single-node"}) == "runs/stencil-single-node-42"
    assert run_dir({"SLURM_JOB_ID": "43", "SLURM_JOB_NAME": "md-sweep", "SLURM_ARRAY_JOB_ID": "40",
                    "SLURM_ARRAY_TASK_ID": "3"}) == "runs/md-sweep-40_3"
    chained = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "x", "HPCGPU_RUN_DIR": "/scratch/chain"}
    assert run_dir(chained) == "/scratch/chain"
    assert re.fullmatch(r"out/stencil-local-\d{8}-\d{6}-\d+", run_dir({"HPCGPU_RUNS_DIR": "out"}))


def test_sweep_value_picks_the_array_task_and_rejects_a_task_beyond_the_list():
    assert common("hpcgpu_sweep_value a b c", {"SLURM_ARRAY_TASK_ID": "2"}).stdout.strip() == "c"
    beyond = common("hpcgpu_sweep_value a b c", {"SLURM_ARRAY_TASK_ID": "3"})
    assert beyond.returncode == 2 and "--array=0-2" in beyond.stderr


def test_a_wrong_root_or_python_stops_with_a_message():
    wrong_root = common("true", {"HPCGPU_ROOT": "/nonexistent"})
    assert wrong_root.returncode == 2 and "HPCGPU_ROOT" in wrong_root.stderr
    wrong_python = common("true", {"HPCGPU_PYTHON": "/nonexistent/python"})
    assert wrong_python.returncode == 2 and "HPCGPU_PYTHON" in wrong_python.stderr

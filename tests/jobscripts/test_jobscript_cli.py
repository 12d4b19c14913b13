"""``hpcgpu jobscript`` and launching from an installed package (issue 24).

Fast tests write scripts with the checkout's ``hpcgpu.jobs.jobscript`` and run one through a stand-in
``srun`` (1 rank, no Slurm); ``--help`` of every app is checked with mpi4py made unimportable. The
slow test builds a wheel, installs it (not editable) in a fresh virtual environment outside the
checkout and runs the ``hpcgpu`` console script there; a real Slurm is used only when the CI cluster answers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from hpcgpu.jobs import jobscript
from tests.jobscripts._slurm import JOBSCRIPTS, ROOT, cluster_problem

#: A stand-in for srun: records its flags, drops them and runs the command once (one rank, no Slurm).
FAKE_SRUN = """#!/bin/bash
echo "srun $*" >> "$FAKE_SRUN_RECORD"
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
exec "$@"
"""
SMALL_STENCIL = ["--model", "jacobi", "--nx", "32", "--ny", "32", "--steps", "2", "--no-plot"]


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def write(tmp_path, *argv, python=sys.executable, cwd=None):
    """Run ``hpcgpu jobscript ARGV`` in-process in ``cwd`` (default tmp_path); returns the exit code."""
    argv = list(argv)
    at = argv.index("--") if "--" in argv else len(argv)
    old = Path.cwd()
    os.chdir(cwd or tmp_path)
    try:
        return jobscript.main([*argv[:at], "--python", python, *argv[at:]])
    finally:
        os.chdir(old)


def run_batch_script(script: Path, workdir: Path, python_dir: Path | None = None, extra=None):
    """Run ``script`` as Slurm would start it (batch shell, job variables), with the stand-in srun."""
    bin_dir = workdir / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{python_dir or Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workdir),
           "SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "stencil", "SLURM_SUBMIT_DIR": str(workdir),
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "8", "SLURM_GPUS_ON_NODE": "1",
           "FAKE_SRUN_RECORD": str(workdir / "srun.txt"), "HPCGPU_INFO": "0", **(extra or {})}
    return subprocess.run(["bash", str(script)], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)


def test_gpu_script_has_the_asked_shape_and_parses(tmp_path):
    assert write(tmp_path, "stencil", "--nodes", "2", "--gpus-per-node", "4", "--time", "01:00:00",
                 "--partition", "gpu", "--account", "proj42", "-o", "job.sbatch", "--", "--model", "swe",
                 "--steps", "50") == 0
    text = (tmp_path / "job.sbatch").read_text()
    assert sbatch_lines(text) == [
        "#SBATCH --job-name=stencil", "#SBATCH --output=%x-%j.log", "#SBATCH --open-mode=append",
        "#SBATCH --partition=gpu", "#SBATCH --account=proj42", "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4", "#SBATCH --time=01:00:00"]
    assert "gpus-per-task" not in text and "gpu-bind" not in text   # CUDA IPC peers stay visible
    assert f"source {jobscript.common_sh()} || exit 2" in text and jobscript.common_sh().is_file()
    assert f"HPCGPU_PYTHON=${{HPCGPU_PYTHON:-{sys.executable}}}" in text
    assert re.search(r"^hpcgpu_run apps\.stencil --model swe --steps 50$", text, re.M)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0


def test_cpu_and_preemptible_scripts(tmp_path):
    assert write(tmp_path, "md", "--cpu", "--ntasks-per-node", "64", "--cpus-per-task", "2", "--time", "30",
                 "--preemptible", "--sbatch=--constraint=icelake", "-o", "md.sbatch") == 0
    lines = sbatch_lines((tmp_path / "md.sbatch").read_text())
    assert "#SBATCH --ntasks-per-node=64" in lines and "#SBATCH --cpus-per-task=2" in lines
    assert {"#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --constraint=icelake"} <= set(lines)
    assert not [line for line in lines if "gpu" in line]
    assert "hpcgpu_run_preemptible apps.md" in (tmp_path / "md.sbatch").read_text()


@pytest.mark.parametrize("argv,message", [
    (["stencil", "--gpus-per-node", "4", "--ntasks-per-node", "8"], "one rank per GPU"),
    (["stencil", "--time", "2h"], "--time"),
    (["stencil", "--log", "logs-%j/%x.log"], "directory part"),
    (["stencil", "--cpu", "--gpus-per-node", "2"], "exclude each other"),
    (["--nodes", "2"], "expected an app"),
    (["stencil", "--", "--stepz", "10"], "unrecognized arguments: --stepz"),   # the app's own parser decides
    (["md", "--", "--steps", "-3"], "apps.md would refuse its arguments"),
    (["train", "--", "--config", "missing.toml"], "missing.toml: file not found"),
])
def test_bad_input_is_one_message_and_exit_2(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        write(tmp_path, *argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("*.sbatch"))


def test_an_existing_script_is_kept_unless_forced(tmp_path, capsys):
    (tmp_path / "stencil.sbatch").write_text("mine")
    with pytest.raises(SystemExit):
        write(tmp_path, "stencil")
    assert (tmp_path / "stencil.sbatch").read_text() == "mine"
    assert write(tmp_path, "stencil", "--force") == 0
    assert (tmp_path / "stencil.sbatch").read_text().startswith("#!/bin/bash")


def test_a_log_directory_is_created_because_slurm_would_not(tmp_path):
    assert write(tmp_path, "train", "--log", "logs/%x-%j.log") == 0
    assert (tmp_path / "logs").is_dir()
    assert "#SBATCH --output=logs/%x-%j.log" in (tmp_path / "train.sbatch").read_text()


def test_list_names_every_shipped_template(capsys):
    assert jobscript.main(["--list"]) == 0
    listing = capsys.readouterr().out
    shipped = sorted(str(p.relative_to(JOBSCRIPTS)) for p in JOBSCRIPTS.rglob("*") if p.suffix in (".sbatch", ".sh"))
    assert len(shipped) == 29   # 24 sbatch, common.sh, 4 mpirun/ wrappers and launchers
    for name in shipped:
        assert name in listing


def test_package_templates_are_the_checkout_jobscripts():
    """hpcgpu/jobs/jobscripts (package data) is the top-level jobscripts/ itself: no second copy to drift."""
    assert jobscript.TEMPLATES == JOBSCRIPTS.resolve()
    assert (ROOT / "hpcgpu" / "jobs" / "jobscripts").is_symlink()


def test_copied_templates_source_the_copied_common_sh(tmp_path):
    assert write(tmp_path, "--copy-templates", "mine") == 0
    copied = tmp_path / "mine"
    assert (copied / "common.sh").is_file() and len(list(copied.glob("*/*.sbatch"))) == 24
    script = (copied / "gpu" / "md-single-node.sbatch").read_text()
    assert f"source {copied / 'common.sh'} || exit 2" in script and "HPCGPU_ROOT:-" not in script
    for path in copied.rglob("*.s*"):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path
    with pytest.raises(SystemExit):   # refuses to overwrite
        write(tmp_path, "--copy-templates", "mine")


def test_generated_script_runs_the_app_through_srun(tmp_path):
    """The script as a batch shell would run it: one rank per GPU from SLURM_GPUS_ON_NODE, no --mpi
    unless asked for, the run directory made, the app's summary written."""
    workdir = tmp_path / "submit"
    workdir.mkdir()
    assert write(workdir, "stencil", "--gpus-per-node", "8", "-o", "job.sbatch", "--", *SMALL_STENCIL) == 0
    result = run_batch_script(workdir / "job.sbatch", workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((workdir / "runs" / "stencil-77" / "summary.json").read_text())
    assert summary["app"] == "apps.stencil" and summary["n_ranks"] == 1
    srun = (workdir / "srun.txt").read_text()
    assert "--ntasks-per-node=1 --ntasks=1" in srun and "--mpi" not in srun   # 8 tasks, 1 GPU: 1 rank
    assert "starting 1 ranks per node, one per GPU" in result.stdout


BLOCK_MPI4PY = textwrap.dedent("""\
    import sys
    class _NoMpi:
        def find_spec(self, name, path=None, target=None):
            if name == "mpi4py" or name.startswith("mpi4py."):
                raise ModuleNotFoundError("mpi4py is hidden by the test", name=name)
    sys.meta_path.insert(0, _NoMpi())
    """)


@pytest.mark.parametrize("module", ["apps.stencil", "apps.md", "apps.train", "hpcgpu"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_needs_no_mpi(tmp_path, module, flag):
    """``--help`` prints before MPI starts: works with mpi4py unimportable (no MPI library)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCK_MPI4PY)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    for name in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", module, flag], env=env, capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m"), result.stdout[:200]
    assert "Traceback" not in result.stderr
    if module != "hpcgpu":   # under a launcher only rank 0 prints
        quiet = subprocess.run([sys.executable, "-m", module, flag], env={**env, "PMI_RANK": "1"},
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert quiet.returncode == 0 and quiet.stdout == ""


# ------------------------------------------------------------------ the installed package
def _copy_source(target: Path) -> Path:
    """The checkout without virtual environments, build output or VCS data (building must not write into it)."""
    anywhere = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__",
                                      ".pytest_cache")
    top_level = {"runs", "output", "scratch", "benchmarks"}   # run outputs of the checkout (not hpcgpu/output)

    def ignore(directory, names):
        skipped = set(anywhere(directory, names))
        return skipped | (top_level & set(names)) if Path(directory) == ROOT else skipped

    shutil.copytree(ROOT, target, symlinks=True, ignore=ignore)
    return target


@pytest.mark.slow
def test_installed_wheel_writes_and_runs_scripts_without_a_checkout(tmp_path):
    """Build a wheel, install it non-editable in a fresh venv outside the checkout, use `hpcgpu jobscript`."""
    source = _copy_source(tmp_path / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q",
                            "-w", str(tmp_path / "wheel"), str(source)],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    if built.returncode != 0 and re.search(r"(?i)could not find a version|connection|network|resolve",
                                           built.stdout + built.stderr):
        pytest.skip(f"cannot build a wheel here (needs setuptools>=68 and wheel from an index): {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "wheel").glob("hpcgpu-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # The dependencies come from this interpreter's site-packages as a plain path (a .pth line): its
    # .pth files are not processed, so an editable hpcgpu installed there stays invisible.
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for library in (Path(sys.prefix) / "lib").glob("*mpi*"):   # the mpich wheel's libmpi, as its install puts it
        (venv / "lib" / library.name).symlink_to(library)
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    workdir = tmp_path / "submit"
    workdir.mkdir()
    where = subprocess.run([str(python), "-c", "import hpcgpu, apps; print(hpcgpu.__file__, apps.__file__)"],
                           capture_output=True, text=True, cwd=workdir, check=True).stdout
    assert str(ROOT) not in where and str(purelib) in where, where

    hpcgpu_command = str(venv / "bin" / "hpcgpu")
    made = subprocess.run([hpcgpu_command, "jobscript", "stencil", "--nodes", "2", "--gpus-per-node", "4",
                           "--time", "01:00:00", "--partition", "gpu", "--account", "proj42", "--output",
                           "job.sbatch", "--", *SMALL_STENCIL], capture_output=True, text=True, cwd=workdir,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    text = (workdir / "job.sbatch").read_text()
    assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
            "#SBATCH --time=01:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj42",
            "#SBATCH --output=%x-%j.log"} <= set(sbatch_lines(text))
    common = purelib / "hpcgpu" / "jobs" / "jobscripts" / "common.sh"
    assert f"source {common} || exit 2" in text and common.is_file()
    assert subprocess.run(["bash", "-n", str(workdir / "job.sbatch")]).returncode == 0
    listing = subprocess.run([hpcgpu_command, "jobscript", "--list"], capture_output=True, text=True, check=True)
    assert "gpu/stencil-single-node.sbatch" in listing.stdout and str(purelib) in listing.stdout
    copied = subprocess.run([hpcgpu_command, "jobscript", "--copy-templates", "templates"], cwd=workdir,
                            capture_output=True, text=True, timeout=60)
    assert copied.returncode == 0 and (workdir / "templates" / "gpu" / "train-sweep.sbatch").is_file()

    # The script runs with no checkout anywhere: common.sh of the package, the venv's interpreter.
    result = run_batch_script(workdir / "job.sbatch", workdir, python_dir=venv / "bin",
                              extra={"SLURM_GPUS_ON_NODE": "", "SLURM_NTASKS_PER_NODE": "1", "HPCGPU_INFO": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "installed hpcgpu (no HPCGPU_ROOT checkout)" in result.stdout
    summary = json.loads((workdir / "runs" / "stencil-77" / "summary.json").read_text())
    assert summary["n_ranks"] == 1 and (workdir / "runs" / "stencil-77" / "info.txt").is_file()

    if os.environ.get("HPCGPU_SKIP_SLURM") == "1":
        pytest.skip("HPCGPU_SKIP_SLURM=1: the installed script was checked with a stand-in srun only")
    problem = cluster_problem()
    if problem is not None:
        pytest.skip(f"{problem}: the installed script was checked with a stand-in srun only "
                    "(tests/jobscripts/test_slurm_*.py submit the templates to the CI cluster)")
    cpu_script = subprocess.run([hpcgpu_command, "jobscript", "stencil", "--cpu", "--ntasks-per-node", "1",
                                 "--time", "5", "-o", "cpu.sbatch", "--", *SMALL_STENCIL], cwd=workdir,
                                capture_output=True, text=True, timeout=60)
    assert cpu_script.returncode == 0, cpu_script.stderr
    submitted = subprocess.run(["sbatch", "--wait", "--parsable", "cpu.sbatch"], cwd=workdir, capture_output=True,
                               text=True, timeout=300)
    job_id = submitted.stdout.strip().split(";")[0]
    log = workdir / f"stencil-{job_id}.log"
    assert submitted.returncode == 0, f"{submitted.stderr}\n{log.read_text() if log.exists() else 'no log'}"
    assert json.loads((workdir / "runs" / f"stencil-{job_id}" / "summary.json").read_text())["n_ranks"] == 1


def test_an_unreachable_peer_gpu_gets_a_message_naming_the_binding(monkeypatch):
    """Per-task GPU binding enforced by the node makes cudaIpcOpenMemHandle fail: the error says why and
    what to do, and stays a RuntimeError (the MD exchange's automatic NCCL fallback catches those)."""
    import types

    from hpcgpu.errors import BackendError
    from hpcgpu.transport import cuda_ipc

    class CUDARuntimeError(RuntimeError):
        pass

    def refuse(handle):
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    runtime = types.SimpleNamespace(CUDARuntimeError=CUDARuntimeError, getDevice=lambda: 0,
                                    ipcOpenMemHandle=refuse)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(cuda_ipc.PeerAccessError) as error:
        cuda_ipc.open_peer_pointer((b"\x01" * 64, 0))
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, BackendError)
    message = str(error.value)
    assert "CUDA_VISIBLE_DEVICES=3" in message and "--gpus-per-node=G" in message and "--gpu-bind" in message

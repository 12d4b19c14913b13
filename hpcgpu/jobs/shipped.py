"""The shipped job scripts: the values that make each of them, rendered from the one template.

``jobscripts/gpu/`` and ``jobscripts/cpu/`` hold a Slurm script for each app (stencil, md, train) and
each kind of job (single node, multi node, preemptible chain, sweep): the GPU script and its CPU twin,
sized as a CI fixture for a 2-core machine, which differ only in their resource lines.
``jobscripts/mpirun/run-openmpi.sh`` and ``run-mpich.sh`` start the same apps without Slurm. All of them
are the output of the templates in ``jobscripts/template/`` (:mod:`hpcgpu.jobs.template`) filled
with the values below; the files are kept in git so that they can be read, copied and submitted as
they are. After changing a template or a value here, write them again::

    python -m hpcgpu jobscript --write-shipped jobscripts        # from the repository root

``tests/jobscripts/test_shipped_scripts.py`` fails while a shipped file differs from its rendering.
``common.sh``, ``mpirun/gpu-per-rank.sh`` and ``mpirun/simulate-nodes.sh`` are written by hand: each is
the only one of its kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcgpu.jobs.template import BatchScript, Sweep, render_batch_script, render_launcher

#: How the shipped batch scripts find common.sh: in the checkout they are submitted from (or HPCGPU_ROOT).
CHECKOUT_SOURCE_LINE = 'source "${HPCGPU_ROOT:-$SLURM_SUBMIT_DIR}/jobscripts/common.sh" || exit 2'
#: The command that rewrites the shipped scripts (run from the repository root).
WRITE_COMMAND = "python -m hpcgpu jobscript --write-shipped jobscripts"


@dataclass(frozen=True)
class ShippedApp:
    """One app's shipped scripts: what it is, and its flags for each kind of job."""

    description: str
    arguments: dict[str, str]     # kind -> the app's flags (plain words, no quoting needed)
    sweep: Sweep                  # what the sweep script varies


@dataclass(frozen=True)
class JobKind:
    """One kind of job: what its header says and how the GPU script sizes it."""

    summary: str                  # the header's second line
    notes: tuple[str, ...]        # more header lines ({name}: the script's name)
    gpu_nodes: int
    gpu_time: str
    preemptible: bool = False
    sweep: bool = False


APPS: dict[str, ShippedApp] = {
    "stencil": ShippedApp(
        description="the climate stencil (shallow water jet, --model swe)",
        arguments={
            "single-node": "--model swe --nx 8192 --ny 4096 --steps 5000 --snapshot-every 0 --no-plot",
            "multi-node": "--model swe --nx 16384 --ny 8192 --steps 5000 --snapshot-every 0 --no-plot",
            "preemptible": "--model swe --nx 8192 --ny 4096 --days 60 --checkpoint-every 5000 --snapshot-every 0 "
                           "--no-plot",
            "sweep": "--model swe --nx 4096 --ny 2048 --days 10 --no-plot",
        },
        sweep=Sweep("viscosity", "--viscosity", ("250", "500", "1000", "2000"))),
    "md": ShippedApp(
        description="Lennard-Jones molecular dynamics (LAMMPS bench/in.lj, fp32 pair forces)",
        arguments={
            "single-node": "--cells 80 --steps 2000 --precision fp32 --thermo-every 200 --no-plot",
            "multi-node": "--cells 160 --steps 2000 --precision fp32 --thermo-every 200 --no-plot",
            "preemptible": "--cells 80 --steps 200000 --precision fp32 --thermo-every 5000 --checkpoint-every 10000 "
                           "--no-plot",
            "sweep": "--cells 60 --steps 20000 --precision fp32 --thermostat langevin --thermo-every 1000 --no-plot",
        },
        sweep=Sweep("temperature", "--target-temperature", ("0.8", "1.0", "1.2", "1.44"))),
    "train": ShippedApp(
        description="data-parallel training (a deep MLP, mixed precision)",
        arguments={
            "single-node": "--model large-mlp --depth 8 --width 4096 --batch-size 4096 --precision fp16 --steps 2000 "
                           "--no-plot",
            "multi-node": "--model large-mlp --depth 8 --width 4096 --batch-size 8192 --precision fp16 --zero 1 "
                          "--steps 2000 --no-plot",
            "preemptible": "--model large-mlp --depth 8 --width 4096 --batch-size 4096 --precision fp16 --steps 100000 "
                           "--checkpoint-every 2000 --no-plot",
            "sweep": "--model large-mlp --depth 8 --width 2048 --batch-size 2048 --precision fp16 --steps 5000 "
                     "--no-plot",
        },
        sweep=Sweep("learning_rate", "--lr", ("3e-4", "1e-3", "3e-3", "1e-2"))),
}

KINDS: dict[str, JobKind] = {
    "single-node": JobKind(
        summary="one node, one MPI rank per GPU (8 GPUs here; any G: sbatch --gpus-per-node=G --ntasks-per-node=G).",
        notes=(), gpu_nodes=1, gpu_time="02:00:00"),
    "multi-node": JobKind(
        summary="N nodes x 8 GPUs, one MPI rank per GPU (any G per node: --gpus-per-node=G --ntasks-per-node=G).",
        notes=("  sbatch --nodes=16 jobscripts/gpu/{name}.sbatch     # any node count",),
        gpu_nodes=4, gpu_time="02:00:00"),
    "preemptible": JobKind(
        summary="a long run as a chain of requeued jobs (checkpoint on SIGUSR1 / exit 75 -> requeue -> --restart "
                "latest).",
        notes=("The app checkpoints every --checkpoint-every steps and, on SIGUSR1 (sent 120 s before the time",
               "limit, or by `scancel --signal=USR1 --batch JOBID`) or near the limit, writes a final checkpoint",
               "and exits 75; common.sh then runs `scontrol requeue`, and the next run (SLURM_RESTART_COUNT=1,",
               "2, ...) continues from the newest checkpoint in the same run directory."),
        gpu_nodes=1, gpu_time="04:00:00", preemptible=True),
    "sweep": JobKind(
        summary="a parameter sweep, one job-array task per value.",
        notes=("One array task per value of VALUES below (keep --array=0-<count-1> in step with it).",),
        gpu_nodes=1, gpu_time="01:00:00", sweep=True),
}

#: Said by every shipped batch script, GPU and CPU alike (the twins differ only in their resource lines).
TWINS_NOTE = (
    "jobscripts/gpu/ holds the GPU script; jobscripts/cpu/ the same script as a CI fixture, sized for a",
    "2-core test machine (for real CPU nodes raise --ntasks-per-node, --cpus-per-task and --time). The",
    "two differ only in the resource lines below. Submit from the repository root (the log goes to the",
    "submit directory, which always exists; the run directory to runs/, created by common.sh):",
)
CLOSING_NOTE = (
    "From an installed hpcgpu (no checkout): `hpcgpu jobscript --help` writes a script like this one.",
    "Knobs (environment variables) and every option: docs/jobscripts.md; NCCL knobs: common.sh.",
)
RESOURCE_NOTE = (
    "resources: the only lines that differ between jobscripts/gpu and jobscripts/cpu; one rank per GPU",
    "(--ntasks-per-node = --gpus-per-node), every rank sees its node's GPUs (CUDA IPC between them works)",
)
#: GPUs and cores per rank of the GPU scripts; the CPU twins' shape is in :func:`resources`.
GPUS_PER_NODE = 8
CPUS_PER_GPU = 8
CPU_FIXTURE_TIME = "00:10:00"


def resources(flavour: str, kind: str) -> tuple[str, ...]:
    """The resource options of a shipped script (``flavour`` ``gpu`` or ``cpu``)."""
    if flavour == "gpu":
        return (f"--nodes={KINDS[kind].gpu_nodes}", f"--gpus-per-node={GPUS_PER_NODE}",
                f"--ntasks-per-node={GPUS_PER_NODE}", f"--cpus-per-task={CPUS_PER_GPU}",
                f"--time={KINDS[kind].gpu_time}")
    if kind == "multi-node":
        # 4 ranks on the 2-core CI node: oversubscribed, as a multi-node job's rank count would be.
        return ("--nodes=1", "--ntasks=4", "--cpus-per-task=1", "--overcommit", f"--time={CPU_FIXTURE_TIME}")
    return ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", f"--time={CPU_FIXTURE_TIME}")


def batch_script(flavour: str, app: str, kind: str) -> BatchScript:
    """The shipped script ``jobscripts/FLAVOUR/APP-KIND.sbatch``."""
    name = f"{app}-{kind}"
    shape, details = APPS[app], KINDS[kind]
    about = (f"apps.{app}: {shape.description};", details.summary, *TWINS_NOTE,
             f"  sbatch jobscripts/gpu/{name}.sbatch", *(note.format(name=name) for note in details.notes),
             *CLOSING_NOTE)
    return BatchScript(
        about=about, job_name=name, log="%x-%A_%a.log" if details.sweep else "%x-%j.log",
        resources=resources(flavour, kind), app_module=f"apps.{app}",
        app_arguments=tuple(shape.arguments[kind].split()), source_common=(CHECKOUT_SOURCE_LINE,),
        resource_note=RESOURCE_NOTE, preemptible=details.preemptible,
        sweep=shape.sweep if details.sweep else None, account_placeholder=True)


LAUNCHERS: dict[str, tuple[str, str]] = {
    "run-openmpi.sh": (
        """\
run-openmpi.sh APP [APP ARGS...]: one MPI rank per GPU with Open MPI's mpirun, no Slurm needed.

  GPUS_PER_NODE=8 CPUS_PER_RANK=8 N_NODES=2 HOSTFILE=hosts jobscripts/mpirun/run-openmpi.sh apps.md --cells 80

Starts `python -m hpcgpu info` and then the app on N_RANKS ranks: GPUS_PER_NODE per node, each
bound to CPUS_PER_RANK cores (--map-by ppr:G:node:pe=C --bind-to core: consecutive ranks get
consecutive cores, so on most 8-GPU nodes local rank i sits on the socket of GPU i; mpirun prints
the bindings with --report-bindings, the info report checks them against each GPU's NUMA node),
each given its GPU by gpu-per-rank.sh (from OMPI_COMM_WORLD_LOCAL_RANK). mpirun forwards only
the variables named with -x: PATH, LD_LIBRARY_PATH, PYTHONPATH and the thread settings, plus
every NCCL_*, UCX_*, OMPI_MCA_* and HPCGPU_* variable set when this script starts.
Open MPI 5 spells --report-bindings as --display bindings (the old flag still works, with a note).
Knobs (environment): N_NODES [1], GPUS_PER_NODE [SLURM_GPUS_ON_NODE, else `nvidia-smi -L`], CPUS_PER_RANK [8], N_RANKS
[N_NODES x GPUS_PER_NODE], HOSTFILE [none: localhost, or the Slurm allocation], HPCGPU_MPIRUN
[mpirun], HPCGPU_MPIRUN_FLAGS [""], and the common ones: docs/jobscripts.md.""",
        r"""exports=()
for name in PATH LD_LIBRARY_PATH PYTHONPATH PYTHONUNBUFFERED OMP_NUM_THREADS CUDA_DEVICE_ORDER \
            $(compgen -e | grep -E '^(NCCL|UCX|OMPI_MCA|HPCGPU)_'); do
    [ -n "${!name+set}" ] && exports+=(-x "$name")
done
read -r -a launcher_flags <<< "${HPCGPU_MPIRUN_FLAGS:-}"
HPCGPU_LAUNCH=("${HPCGPU_MPIRUN:-mpirun}" -np "$N_RANKS" ${HOSTFILE:+--hostfile "$HOSTFILE"}
               --map-by "ppr:$GPUS_PER_NODE:node:pe=$CPUS_PER_RANK" --bind-to core --report-bindings
               "${exports[@]}" "${launcher_flags[@]}" "$here/gpu-per-rank.sh")"""),
    "run-mpich.sh": (
        """\
run-mpich.sh APP [APP ARGS...]: one MPI rank per GPU with MPICH's mpiexec (hydra), no Slurm needed.

  GPUS_PER_NODE=8 CPUS_PER_RANK=8 N_NODES=2 HOSTFILE=hosts jobscripts/mpirun/run-mpich.sh apps.stencil --steps 1000

Starts `python -m hpcgpu info` (rank -> node -> GPU -> CPUs, warnings) and then the app on
N_RANKS ranks, GPUS_PER_NODE per node (-ppn), each bound to CPUS_PER_RANK consecutive cores
(-bind-to core:C: local rank i gets cores i*C .. i*C+C-1, which on most 8-GPU nodes lie on the
socket of GPU i; the info report says "NO" in its "near GPU" column when they do not), each given
its GPU by gpu-per-rank.sh (from MPI_LOCALRANKID). Output: runs/<app>-local-<time>-<pid>/ and the
terminal. Hydra passes the whole environment to the ranks, NCCL_* included.
Knobs (environment): N_NODES [1], GPUS_PER_NODE [SLURM_GPUS_ON_NODE, else `nvidia-smi -L`], CPUS_PER_RANK [8], N_RANKS
[N_NODES x GPUS_PER_NODE], HOSTFILE [none: hydra's default, or the Slurm allocation],
HPCGPU_MPIEXEC [mpiexec on PATH, else the one beside HPCGPU_PYTHON], HPCGPU_MPIEXEC_FLAGS [""],
and the common ones (HPCGPU_PYTHON, HPCGPU_APP_ARGS, HPCGPU_RUN_DIR ...): docs/jobscripts.md.""",
        r"""mpiexec=${HPCGPU_MPIEXEC:-$(command -v mpiexec || echo "$(dirname "$(command -v "$HPCGPU_PYTHON")")/mpiexec")}
read -r -a launcher_flags <<< "${HPCGPU_MPIEXEC_FLAGS:-}"
HPCGPU_LAUNCH=("$mpiexec" -n "$N_RANKS" -ppn "$GPUS_PER_NODE" ${HOSTFILE:+-f "$HOSTFILE"}
               -bind-to "core:$CPUS_PER_RANK" "${launcher_flags[@]}" "$here/gpu-per-rank.sh")"""),
}


def shipped_scripts() -> dict[str, str]:
    """``{path relative to jobscripts/: text}`` of every rendered shipped script."""
    scripts = {f"{flavour}/{app}-{kind}.sbatch": render_batch_script(batch_script(flavour, app, kind))
               for flavour in ("gpu", "cpu") for app in APPS for kind in KINDS}
    for name, (about, launch) in LAUNCHERS.items():
        scripts[f"mpirun/{name}"] = render_launcher(tuple(about.splitlines()), tuple(launch.splitlines()))
    return scripts


def write_shipped(directory: Path) -> list[Path]:
    """Write every shipped script into ``directory`` (a checkout's ``jobscripts/``), executable.

    Returns the paths whose text changed (written); the others are left untouched.
    """
    directory = Path(directory)
    changed = []
    for relative, text in shipped_scripts().items():
        path = directory / relative
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
        path.chmod(0o755)
    return changed


def stale_shipped(directory: Path) -> list[str]:
    """The shipped scripts of ``directory`` that differ from their rendering or are missing, and the
    ``gpu/`` / ``cpu/`` scripts that no rendering makes (relative paths, sorted)."""
    directory = Path(directory)
    expected = shipped_scripts()
    stale = [relative for relative, text in expected.items()
             if not (directory / relative).is_file() or (directory / relative).read_text() != text]
    extra = [str(path.relative_to(directory)) for flavour in ("gpu", "cpu")
             for path in (directory / flavour).glob("*.sbatch") if str(path.relative_to(directory)) not in expected]
    return sorted(stale + extra)

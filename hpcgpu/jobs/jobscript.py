"""``hpcgpu jobscript``: Slurm batch scripts from an installed hpcgpu, no source checkout needed.

The job scripts (``jobscripts/`` of a checkout) ship inside the package as ``hpcgpu/jobs/jobscripts/``
(package data; in a checkout that path is a link to ``jobscripts/``, so the two cannot drift). Every
batch script, shipped or written here, is rendered from one template, ``jobscripts/template/job.sbatch.in``
(:mod:`hpcgpu.jobs.template`). This module

* writes a ready-to-submit script for one app and one job shape::

      hpcgpu jobscript stencil --nodes 2 --gpus-per-node 4 --time 01:00:00 -- --model swe --steps 5000
      sbatch stencil.sbatch

  The script asks for ``--gpus-per-node=G`` and ``--ntasks-per-node=G`` (one MPI rank per GPU, every
  rank sees its node's GPUs so CUDA IPC between them works; hpcgpu picks GPU ``local_rank % G``),
  writes its log next to where it is submitted (Slurm cannot create a directory for ``--output``),
  sources the installed ``common.sh`` (run directory, info report, srun line, requeue) and runs the
  app with the interpreter that wrote it;
* lists the shipped scripts (``--list``) and copies them for editing (``--copy-templates DIR``),
  pointing each copy at the installed ``common.sh`` and interpreter;
* rewrites the shipped scripts from the templates after a change to them (``--write-shipped DIR``,
  :mod:`hpcgpu.jobs.shipped`).

Nothing here starts MPI or touches a GPU.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

import hpcgpu
from hpcgpu.app.cli import CommandParser
from hpcgpu.jobs.shipped import CHECKOUT_SOURCE_LINE, WRITE_COMMAND, write_shipped
from hpcgpu.jobs.template import SCRIPTS, BatchScript, render_batch_script

#: The shipped scripts: package data of hpcgpu (a link to the checkout's jobscripts/ in a checkout).
TEMPLATES = SCRIPTS
APPS = ("stencil", "md", "train")
#: What starts a rank's container (jobscripts/common.sh, HPCGPU_CONTAINER_RUNTIME).
CONTAINER_RUNTIMES = ("apptainer", "singularity", "pyxis", "podman")
#: Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME_FORMAT = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")

EPILOG = """\
examples:
  hpcgpu jobscript stencil --nodes 2 --gpus-per-node 4 --time 01:00:00 -- --model swe --steps 5000
  hpcgpu jobscript md --gpus-per-node 8 --cpus-per-task 14 --partition gpu --account proj42 --preemptible
  hpcgpu jobscript train --cpu --ntasks-per-node 64 --time 30 -o train-cpu.sbatch -- --backend numpy
  hpcgpu jobscript stencil --nodes 4 --gpus-per-node 4 --container hpcgpu.sif   every rank in the image
  hpcgpu jobscript --list                  the shipped templates (single/multi-node, preemptible, sweep)
  hpcgpu jobscript --copy-templates DIR    copies of them to edit, pointing at this installation
  hpcgpu jobscript --write-shipped jobscripts   (in a checkout) the shipped scripts again, after a change
                                                to jobscripts/template/ or hpcgpu/jobs/shipped.py
Then: sbatch FILE. Every knob of the scripts (HPCGPU_APP_ARGS, HPCGPU_SRUN_MPI, NCCL_*): docs/jobscripts.md
"""


def build_parser(prog: str = "hpcgpu jobscript") -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Write a Slurm batch script for an hpcgpu app (one MPI rank per GPU), or list / copy the "
                    "shipped templates. App flags go after `--`.")
    parser.add_argument("app", nargs="?", choices=APPS, help="the app: stencil, md or train")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the shipped templates and where they are")
    what.add_argument("--copy-templates", metavar="DIR", type=Path,
                      help="copy the templates (gpu/, cpu/, mpirun/, common.sh) into DIR, ready to edit and submit")
    what.add_argument("--write-shipped", metavar="DIR", type=Path,
                      help="render the shipped scripts (gpu/, cpu/, mpirun/run-*.sh) from jobscripts/template/ "
                           "into DIR, a checkout's jobscripts/ (for developers of hpcgpu)")
    shape = parser.add_argument_group("job shape (#SBATCH lines)")
    shape.add_argument("--nodes", type=_positive_int, default=1, metavar="N", help="nodes [1]")
    shape.add_argument("--gpus-per-node", type=_positive_int, default=None, metavar="G",
                       help="GPUs per node, one MPI rank each [8]")
    shape.add_argument("--cpu", action="store_true", help="a CPU job: no GPUs, --ntasks-per-node ranks per node")
    shape.add_argument("--ntasks-per-node", type=_positive_int, default=None, metavar="R",
                       help="ranks per node; GPU jobs: must equal --gpus-per-node [G; CPU jobs: 1]")
    shape.add_argument("--cpus-per-task", type=_positive_int, default=None, metavar="C",
                       help="cores per rank, also OMP_NUM_THREADS [Slurm's default, 1]; e.g. cores per node / G")
    shape.add_argument("--time", default="01:00:00", help="wall-time limit, as sbatch --time [01:00:00]")
    shape.add_argument("--partition", metavar="P", help="partition [the site's default]")
    shape.add_argument("--account", metavar="A", help="account to charge [your default]")
    shape.add_argument("--job-name", metavar="NAME", help="job name; names the log and the run directory [APP]")
    shape.add_argument("--log", metavar="PATTERN", default="%x-%j.log",
                       help="Slurm's --output, relative to the submit directory [%%x-%%j.log]; a directory in "
                            "it is created now, because Slurm does not create it and would lose the log")
    shape.add_argument("--preemptible", action="store_true",
                       help="checkpoint on SIGUSR1 120 s before the limit, requeue and continue (add "
                            "--checkpoint-every N to the app flags to survive crashes too; docs/jobscripts.md)")
    shape.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                       help="any other #SBATCH option, repeatable, e.g. --sbatch=--constraint=h100")
    image = parser.add_argument_group("container (docs/containers.md)")
    image.add_argument("--container", metavar="IMAGE",
                       help="run info, check and the app inside IMAGE, one container per rank started by srun "
                            "(the image's python and hpcgpu; the submit directory mounted at its path)")
    image.add_argument("--container-runtime", choices=CONTAINER_RUNTIMES, default="apptainer",
                       help="what starts each rank's container: apptainer (or singularity) exec IMAGE, srun "
                            "--container-image=IMAGE (pyxis + enroot), or podman run IMAGE [apptainer]")
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", metavar="FILE", help="the script to write, - for stdout [JOB-NAME.sbatch]")
    out.add_argument("--python", default=sys.executable,
                     help="interpreter the job runs (its environment must have hpcgpu) [this one]")
    out.add_argument("--force", action="store_true", help="overwrite existing files")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def common_sh() -> Path:
    """The shipped ``common.sh`` that generated and copied scripts source."""
    return TEMPLATES / "common.sh"


def templates() -> list[Path]:
    """Every shipped script, relative to :data:`TEMPLATES` (gpu/, cpu/, mpirun/ and common.sh)."""
    found = sorted(p.relative_to(TEMPLATES) for p in TEMPLATES.rglob("*") if p.suffix in (".sbatch", ".sh"))
    if not found:
        raise FileNotFoundError(f"no job-script templates in {TEMPLATES}: the hpcgpu installation is incomplete; "
                                "reinstall it (pip install --force-reinstall hpcgpu)")
    return found


def _summary(path: Path) -> str:
    """One line saying what a template is, from its header comment."""
    comments = [line[2:].strip() for line in path.read_text().splitlines()[1:6] if line.startswith("# ")]
    if path.suffix == ".sbatch" and len(comments) >= 2:
        return f"{comments[0].split(':')[0]}: {comments[1].split(' (')[0].rstrip('.')}"
    return comments[0] if comments else ""


def list_templates(file=None) -> None:
    file = sys.stdout if file is None else file
    print(f"hpcgpu {hpcgpu.__version__} job-script templates in {TEMPLATES}:", file=file)
    for relative in templates():
        print(f"  {str(relative):32s} {_summary(TEMPLATES / relative)}", file=file)
    print("gpu/: 8 GPUs per node (sbatch --gpus-per-node=G --ntasks-per-node=G for others); cpu/: the same "
          "scripts as CI fixtures for a 2-core machine.\nCopy them with --copy-templates DIR, or write one "
          "for your job shape: hpcgpu jobscript APP --help", file=file)


def copy_templates(directory: Path, python: str, force: bool = False) -> list[Path]:
    """Copy the templates into ``directory``; each copied sbatch script sources the copied ``common.sh``.

    Returns the written paths. Raises FileExistsError unless ``force`` when a target exists.
    """
    directory = directory.resolve()
    targets = [(TEMPLATES / relative, directory / relative) for relative in templates()]
    readme = TEMPLATES / "README.md"
    existing = [str(target) for _, target in targets if target.exists()]
    if existing and not force:
        raise FileExistsError(f"{len(existing)} file(s) exist already, e.g. {existing[0]}; "
                              "choose an empty directory or pass --force")
    written = []
    for source, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        if target.suffix == ".sbatch":
            text = target.read_text()
            if CHECKOUT_SOURCE_LINE in text:
                target.write_text(text.replace(CHECKOUT_SOURCE_LINE, _source_lines(python, directory / "common.sh")))
        written.append(target)
    if readme.exists():
        shutil.copy2(readme, directory / "README.md")
    return written


def _source_lines(python: str, common: Path) -> str:
    return (f"export HPCGPU_PYTHON=${{HPCGPU_PYTHON:-{shlex.quote(python)}}}   # the interpreter with hpcgpu\n"
            f"source {shlex.quote(str(common))} || exit 2")


def _check_value(parser, flag: str, value: str | None) -> None:
    if value is not None and (not value or any(c.isspace() for c in value)):
        parser.error(f"{flag} {value!r}: expected a value without spaces")


def render(options, app_args: list[str], command_line: str) -> str:
    """The text of the batch script for parsed ``options`` (see :func:`build_parser`), from the template."""
    app = options.app
    about = [f"Written by `{command_line}`",
             f"(hpcgpu {hpcgpu.__version__}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)."]
    if options.cpu:
        ranks = options.ntasks_per_node or 1
        about.append(f"apps.{app} on {options.nodes} node(s) x {ranks} rank(s), CPU backend.")
        resources = [f"--nodes={options.nodes}", f"--ntasks-per-node={ranks}"]
    else:
        gpus = options.gpus_per_node or 8
        about += [f"apps.{app} on {options.nodes} node(s) x {gpus} GPU(s), one MPI rank per GPU. Every rank sees",
                  "its node's GPUs and hpcgpu picks GPU local_rank % G (CUDA IPC between ranks works); common.sh",
                  "starts one rank per GPU that Slurm gave (SLURM_GPUS_ON_NODE)."]
        resources = [f"--nodes={options.nodes}", f"--gpus-per-node={gpus}", f"--ntasks-per-node={gpus}"]
    about += ["common.sh runs `hpcgpu check` on every rank before the app; a failing or hung node is left out of a",
              "follow-up job that continues from the newest checkpoint (docs/health.md; HPCGPU_CHECK=0: no check).",
              "The log goes to --output below, relative to the directory you submit from; run directories to",
              "runs/<job-name>-<job-id>/ (HPCGPU_RUNS_DIR). Submit: sbatch THIS-FILE. Knobs: docs/jobscripts.md"]
    source_common = _source_lines(options.python, common_sh()).splitlines()
    if options.container:
        about += [f"Every rank runs in the container image {options.container} ({options.container_runtime}; "
                  "HPCGPU_CONTAINER* knobs),",
                  "with the image's python and hpcgpu; docs/containers.md."]
        source_common = [f"export HPCGPU_CONTAINER=${{HPCGPU_CONTAINER:-{shlex.quote(options.container)}}}",
                         f"export HPCGPU_CONTAINER_RUNTIME=${{HPCGPU_CONTAINER_RUNTIME:-{options.container_runtime}}}",
                         "# the image's python runs (HPCGPU_CONTAINER_PYTHON: python); common.sh runs on the host",
                         source_common[-1]]
    if options.cpus_per_task:
        resources.append(f"--cpus-per-task={options.cpus_per_task}")
    resources.append(f"--time={options.time}")
    return render_batch_script(BatchScript(
        about=tuple(about), job_name=options.job_name or app, log=options.log, resources=tuple(resources),
        app_module=f"apps.{app}", app_arguments=tuple(map(shlex.quote, app_args)),
        source_common=tuple(source_common),
        preemptible=options.preemptible, partition=options.partition, account=options.account,
        extra_options=tuple(options.sbatch)))


def app_argument_problem(python: str, app: str, app_args: list[str]) -> str | None:
    """Why ``python -m apps.APP APP_ARGS`` would refuse its arguments (None: they parse).

    Runs the app's own parser, exactly as the job will run it, without MPI (``HPCGPU_PARSE_ONLY=1``,
    :func:`hpcgpu.app.main.check_arguments`), from the current directory, so a ``--config`` file is
    looked for where the job will be submitted.
    """
    import os
    import subprocess

    environment = dict(os.environ, HPCGPU_PARSE_ONLY="1")
    try:
        result = subprocess.run([python, "-m", f"apps.{app}", *app_args], env=environment, capture_output=True,
                                text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python} -m apps.{app} to check them ({exc})"
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    text = "\n".join(lines[-6:]) or f"exit code {result.returncode}"
    return text[len("error: "):] if text.startswith("error: ") else text


def main(argv=None, prog: str = "hpcgpu jobscript") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    app_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, app_args = argv[:at], argv[at + 1:]
    parser = build_parser(prog)
    options = parser.parse_args(argv)
    if options.list:
        list_templates()
        return 0
    if options.write_shipped is not None:
        if not options.write_shipped.is_dir():
            parser.error(f"--write-shipped {options.write_shipped}: expected the jobscripts/ directory of a "
                         f"checkout, found no directory; from the repository root: {WRITE_COMMAND}")
        changed = write_shipped(options.write_shipped)
        print(f"rendered the shipped scripts into {options.write_shipped.resolve()}: {len(changed)} changed"
              + "".join(f"\n  {path}" for path in changed))
        return 0
    if options.copy_templates is not None:
        try:
            written = copy_templates(options.copy_templates, options.python, options.force)
        except FileExistsError as exc:
            parser.error(str(exc))
        print(f"copied {len(written)} scripts to {options.copy_templates.resolve()}; the sbatch scripts source "
              f"{options.copy_templates.resolve() / 'common.sh'} and run {options.python}.\n"
              f"Submit one from the directory that should hold its log: sbatch "
              f"{options.copy_templates.resolve() / 'gpu' / 'stencil-single-node.sbatch'}")
        return 0
    if options.app is None:
        parser.error("expected an app (stencil, md or train), --list or --copy-templates DIR")
    if options.cpu and options.gpus_per_node:
        parser.error("--cpu and --gpus-per-node exclude each other: a CPU job asks for no GPUs")
    if not options.cpu and options.ntasks_per_node and options.ntasks_per_node != (options.gpus_per_node or 8):
        parser.error(f"--ntasks-per-node {options.ntasks_per_node} but {options.gpus_per_node or 8} GPUs per node: "
                     "a GPU job runs one rank per GPU; give --gpus-per-node only")
    if not TIME_FORMAT.fullmatch(options.time):
        parser.error(f"--time {options.time!r}: expected minutes, HH:MM:SS or D-HH:MM:SS (as sbatch --time)")
    for flag in ("partition", "account", "job_name", "log", "container"):
        _check_value(parser, "--" + flag.replace("_", "-"), getattr(options, flag))
    for option in options.sbatch:
        if not option.startswith("-") or "\n" in option:
            parser.error(f"--sbatch {option!r}: expected one sbatch option, e.g. --sbatch=--constraint=h100")
    log_directory = Path(options.log).parent
    if "%" in str(log_directory):
        parser.error(f"--log {options.log}: the directory part may not hold %-patterns (Slurm creates no "
                     "directories, so the job would fail without a log); keep patterns in the file name")
    problem = app_argument_problem(options.python, options.app, app_args)
    if problem:
        parser.error(f"apps.{options.app} would refuse its arguments: {problem}")
    command_line = " ".join(["hpcgpu jobscript", *map(shlex.quote, argv), *(["--", *map(shlex.quote, app_args)]
                                                                              if app_args else [])])
    text = render(options, app_args, command_line)
    if options.output == "-":
        sys.stdout.write(text)
        return 0
    target = Path(options.output or f"{options.job_name or options.app}.sbatch")
    if target.exists() and not options.force:
        parser.error(f"{target} exists already; pass --force to overwrite it or -o another file")
    target.write_text(text)
    target.chmod(0o755)
    if str(log_directory) not in ("", "."):
        log_directory.mkdir(parents=True, exist_ok=True)   # Slurm opens --output before the script runs
    print(f"wrote {target}: apps.{options.app}, {options.nodes} node(s) x "
          + (f"{options.ntasks_per_node or 1} CPU rank(s)" if options.cpu else f"{options.gpus_per_node or 8} GPU(s)")
          + f", --time {options.time}. Submit from this directory: sbatch {shlex.quote(str(target))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

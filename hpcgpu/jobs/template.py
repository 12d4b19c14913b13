"""The templates of hpcgpu's job scripts, and how they are filled.

``jobscripts/template/`` of a checkout (package data: ``hpcgpu/jobs/jobscripts/template/``) holds the one
source of every script hpcgpu ships or writes:

* ``job.sbatch.in``: every Slurm batch script, the shipped ``jobscripts/gpu/*.sbatch`` and
  ``jobscripts/cpu/*.sbatch`` (:mod:`hpcgpu.jobs.shipped` holds the values that differ between
  them) as well as each script ``hpcgpu jobscript APP`` writes (:mod:`hpcgpu.jobs.jobscript`);
* ``mpirun.sh.in``: the launchers without Slurm, ``jobscripts/mpirun/run-openmpi.sh`` and ``run-mpich.sh``.

A template is the script's text with slots ``{{NAME}}``. A slot alone on its line is a block: it becomes
the lines given for it, and with none the line goes. A slot inside a line becomes the text given for
it (trailing blanks of a line are dropped). Lines ``{{# ...}}`` are notes for whoever edits the
template and are left out. Every slot of a template must be given a value, and no other.

Nothing here runs a process, starts MPI or touches a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The shipped scripts: package data of hpcgpu (in a checkout, ``hpcgpu/jobs/jobscripts`` links to ``jobscripts/``).
SCRIPTS = (Path(__file__).parent / "jobscripts").resolve()
#: Where the templates are, inside :data:`SCRIPTS`.
TEMPLATE_DIRECTORY = SCRIPTS / "template"
BATCH_TEMPLATE = "job.sbatch.in"
LAUNCHER_TEMPLATE = "mpirun.sh.in"

_SLOT = re.compile(r"\{\{([A-Z][A-Z_]*)\}\}")
_NOTE = re.compile(r"\{\{#.*\}\}")


def read_template(name: str) -> str:
    """The text of the template ``name`` (``job.sbatch.in`` or ``mpirun.sh.in``)."""
    path = TEMPLATE_DIRECTORY / name
    try:
        return path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"no job-script template {path}: the hpcgpu installation is incomplete; "
                                "reinstall it (pip install --force-reinstall hpcgpu)") from None


def fill(template: str, values: dict[str, str | list[str] | tuple[str, ...]]) -> str:
    """``template`` with its slots replaced by ``values`` (see the module docstring).

    Parameters
    ----------
    template : str
        Text with ``{{NAME}}`` slots and ``{{# ...}}`` note lines.
    values : dict
        For a slot alone on its line, a list (or tuple) of lines; for a slot inside a line, a str.

    Raises
    ------
    ValueError
        When a slot has no value, a value has no slot, or a value has the wrong kind for its slot.
    """
    lines = [line for line in template.splitlines() if not _NOTE.fullmatch(line.strip())]
    slots = {name for line in lines for name in _SLOT.findall(line)}
    if slots != set(values):
        raise ValueError(f"template slots {sorted(slots)} but values for {sorted(values)}: expected one value "
                         f"per slot (missing {sorted(slots - set(values))}, unknown {sorted(set(values) - slots)})")
    filled: list[str] = []
    for line in lines:
        block = _SLOT.fullmatch(line)
        if block:
            value = values[block.group(1)]
            if isinstance(value, str):
                raise ValueError(f"slot {{{{{block.group(1)}}}}} stands alone on its line: expected a list of "
                                 f"lines, got the str {value!r}")
            filled.extend(value)
            continue

        def text(match):
            value = values[match.group(1)]
            if not isinstance(value, str):
                raise ValueError(f"slot {{{{{match.group(1)}}}}} is inside a line: expected a str, got {value!r}")
            return value

        filled.append(_SLOT.sub(text, line).rstrip())
    return "\n".join(filled) + "\n"


@dataclass(frozen=True)
class Sweep:
    """A job array over values of one app flag: task ``i`` passes ``flag VALUES[i]``.

    Attributes
    ----------
    variable : str
        The shell variable holding this task's value (``temperature``).
    flag : str
        The app's flag it is passed to (``--target-temperature``).
    values : tuple of str
        One per array task, as the shell should see them (no quoting needed).
    """

    variable: str
    flag: str
    values: tuple[str, ...]

    @property
    def array(self) -> str:
        """sbatch's ``--array`` for one task per value."""
        return f"0-{len(self.values) - 1}"


@dataclass(frozen=True)
class BatchScript:
    """What a batch script says; :func:`render_batch_script` lays it out as ``job.sbatch.in`` does.

    Attributes
    ----------
    about : tuple of str
        The header comment, one line each, without its ``# ``.
    job_name : str
        ``#SBATCH --job-name``; also names the log and the run directory.
    log : str
        ``#SBATCH --output``, relative to the submit directory (``%x-%j.log``).
    resources : tuple of str
        sbatch options that size and place the job, in order (``--nodes=2``, ``--overcommit``).
    app_module : str
        What runs, as ``python -m`` takes it (``apps.md``).
    app_arguments : tuple of str
        The app's flags, as shell words (quoted where needed).
    source_common : tuple of str
        The lines that find and source ``common.sh``.
    resource_note : tuple of str
        Comment lines above the resource lines, without their ``# ``.
    preemptible : bool
        Requeue on SIGUSR1 120 s before the limit and continue from the newest checkpoint.
    sweep : Sweep or None
        A job array, one task per value.
    partition, account : str or None
        ``#SBATCH --partition`` / ``--account`` (None: the site's or the user's default).
    account_placeholder : bool
        Without an account, write ``##SBATCH --account=YOUR_ACCOUNT`` (off to Slurm) as a hint.
    extra_options : tuple of str
        More sbatch options, after the resources.
    """

    about: tuple[str, ...]
    job_name: str
    log: str
    resources: tuple[str, ...]
    app_module: str
    app_arguments: tuple[str, ...]
    source_common: tuple[str, ...]
    resource_note: tuple[str, ...] = ()
    preemptible: bool = False
    sweep: Sweep | None = None
    partition: str | None = None
    account: str | None = None
    account_placeholder: bool = False
    extra_options: tuple[str, ...] = ()


def _comment(lines) -> list[str]:
    return [f"# {line}".rstrip() for line in lines]


def render_batch_script(script: BatchScript) -> str:
    """The text of ``script``, from the template ``job.sbatch.in``."""
    placement = [f"#SBATCH --partition={script.partition}"] if script.partition else []
    if script.account:
        placement.append(f"#SBATCH --account={script.account}")
    elif script.account_placeholder:
        placement.append("##SBATCH --account=YOUR_ACCOUNT")
    arguments = list(script.app_arguments)
    sweep_lines = []
    if script.sweep is not None:
        sweep = script.sweep
        sweep_lines = [f"VALUES=({' '.join(sweep.values)})",
                       f'{sweep.variable}=$(hpcgpu_sweep_value "${{VALUES[@]}}") || exit 2']
        arguments += [sweep.flag, f'"${sweep.variable}"']
    return fill(read_template(BATCH_TEMPLATE), {
        "ABOUT": _comment(script.about),
        "JOB_NAME": script.job_name,
        "ARRAY": [f"#SBATCH --array={script.sweep.array}"] if script.sweep is not None else [],
        "LOG": script.log,
        "REQUEUE": ["#SBATCH --requeue", "#SBATCH --signal=B:USR1@120"] if script.preemptible else [],
        "PLACEMENT": placement,
        "RESOURCES": [*_comment(script.resource_note), *(f"#SBATCH {option}" for option in script.resources),
                      *(f"#SBATCH {option}" for option in script.extra_options)],
        "SOURCE_COMMON": list(script.source_common),
        "SWEEP": sweep_lines,
        "RUN_FUNCTION": "hpcgpu_run_preemptible" if script.preemptible else "hpcgpu_run",
        "APP_MODULE": script.app_module,
        "APP_ARGUMENTS": " ".join(arguments),
    })


def render_launcher(about: tuple[str, ...], launch: tuple[str, ...]) -> str:
    """The text of an mpirun launcher from ``mpirun.sh.in``: its header comment (lines without ``# ``)
    and the lines that set ``HPCGPU_LAUNCH``, the command each rank is started with."""
    return fill(read_template(LAUNCHER_TEMPLATE), {"ABOUT": _comment(about), "LAUNCH": list(launch)})

"""What a result depends on: versions, hardware and the git commit, recorded with every run."""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path

import hpcgpu
from hpcgpu import provenance
from hpcgpu.app.cli import FrozenOptions
from hpcgpu.app.directory_lock import LOCK_NAME, hold_run_directories
from hpcgpu.runtime.fault_injection import maybe_fail
from hpcgpu.app.jsonio import write_json
from hpcgpu.errors import ConfigurationError
from hpcgpu.transport.nccl import nccl_version


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except Exception:
        return None
    return getattr(module, "__version__", "unknown")


def environment(comm, arch) -> dict:
    """Collective: software versions, MPI, CUDA/NCCL and the GPU models of all ranks."""
    from mpi4py import MPI   # here, not at import: --help and the path checks run without an MPI library

    facts = {
        "hpcgpu": hpcgpu.__version__,
        "git_commit": provenance.git_commit(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
        "h5py": _version("h5py"),
        "mpi4py": _version("mpi4py"),
        "mpi_library": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
        "platform": platform.platform(),
        "backend": arch.name,
        "backend_reason": arch.reason,
    }
    gpu = None
    if arch.is_gpu:
        import cupy

        facts["cupy"] = cupy.__version__
        facts["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        facts["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        facts["nccl"] = nccl_version()
        gpu = f"{arch.identity.name} ({arch.identity.uuid})"
    hosts_and_gpus = comm.mpi.allgather((comm.hostname, gpu))
    facts["hosts"] = sorted({host for host, _ in hosts_and_gpus})
    facts["gpus"] = [g for _, g in hosts_and_gpus if g]
    return facts


def _probe_directory(directory: Path, is_target: bool = True) -> str | None:
    """What is wrong with writing files into ``directory`` (created later if missing), or None.

    Walks up to the nearest existing ancestor: it must be a directory in which a probe file can be
    created and removed (the only reliable test: permissions, read-only mounts, quotas, ACLs).
    ``is_target``: ``directory`` is the path the user named (else the directory of a named file).
    """
    existing = directory
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return (f"{existing} is a {'regular file' if existing.is_file() else 'non-directory'}, not a directory"
                if existing != directory or not is_target else "exists and is a regular file, not a directory")
    try:
        handle, probe = tempfile.mkstemp(prefix=".hpcgpu-write-probe-", dir=existing)
        os.close(handle)
        os.remove(probe)
    except OSError as exc:
        where = ("it" if is_target else f"{existing}") if existing == directory else \
            f"{existing} (the nearest existing parent)"
        return f"cannot create files in {where} ({exc.strerror or exc})"
    return None


def output_path_problems(paths: dict) -> list[str]:
    """Rank 0's check of the run's output paths; one message per unusable path (empty: all writable).

    ``paths`` maps a flag to ``(path, kind)`` with kind ``"dir"`` (created if missing) or ``"file"``
    (its directory is created if missing). Paths set to None are skipped.
    """
    problems = []
    for flag, (path, kind) in paths.items():
        if path is None:
            continue
        path = Path(path)
        if kind == "dir":
            problem = _probe_directory(path)
            fix = f"pass a writable directory as {flag}"
        else:
            if path.is_dir():
                problem, fix = "is a directory", f"pass a file name as {flag}, e.g. {path / 'summary.json'}"
            elif path.exists() and not os.access(path, os.W_OK):
                problem, fix = "exists and is not writable", f"make it writable or pass another {flag} FILE"
            else:
                problem = _probe_directory(path.parent, is_target=False)
                fix = f"pass a {flag} FILE in a writable directory"
        if problem is not None:
            problems.append(f"{flag} {path}: {problem}; {fix}")
    return problems


def checkpoint_directory(options) -> Path:
    """Where the run's checkpoints go: ``--checkpoint-dir``, by default ``OUTPUT/checkpoints``."""
    return Path(getattr(options, "checkpoint_dir", None) or Path(options.output) / "checkpoints")


def check_output_paths(comm, options, files: dict | None = None) -> None:
    """Collective: raise the same ConfigurationError on every rank if an output path is unusable.

    Checked before step 1, so a run never fails (or loses its summary) at the end: ``--output``,
    ``--checkpoint-dir`` (default ``OUTPUT/checkpoints``), ``--summary`` and the app's own output
    files in ``files`` (``{"--write-data": path}``). Rank 0 probes the file system (one node decides:
    outputs are written by rank 0, and the parallel file system is shared) and broadcasts the result.
    """
    output = Path(options.output)
    paths = {"--output": (output, "dir"), "--checkpoint-dir": (checkpoint_directory(options), "dir"),
             "--summary": (getattr(options, "summary", None), "file")}
    paths.update({flag: (path, "file") for flag, path in (files or {}).items()})
    problems = output_path_problems(paths) if comm.rank == 0 else None
    problems = comm.broadcast(problems)
    if problems:
        # Only the first, so the message stays one line; the others are usually the same cause.
        raise ConfigurationError(problems[0])


def prepare_output(comm, arch, options, files: dict | None = None) -> Path:
    """Collective: check the output paths, then lock ``--output`` and the checkpoint directory for this
    job (creating them); returns the output directory.

    Every app calls this once it has validated its own options, before it writes anything. The locks
    (:mod:`hpcgpu.app.directory_lock`) are held until the job ends (:func:`hpcgpu.app.main.run_app`
    releases them on every way out); with ``--wait-for-lock[=SECONDS]`` (``options.wait_for_lock``) a
    directory held by another job is waited for instead of refused.

    Raises
    ------
    ConfigurationError
        On every rank when ``--output``, the checkpoint directory, ``--summary`` or one of ``files``
        (``{"--write-data": path}``) cannot be written (see :func:`check_output_paths`).
    DirectoryLockedError
        On every rank when another job holds ``--output`` or the checkpoint directory.

    Nothing is written yet but the locks: ``environment.json`` follows once the run has passed every
    check (:func:`write_environment`, called by the simulation driver), and a directory made here is
    removed again when the job ends with it empty, so a refused run leaves no trace. ``arch`` is
    accepted for symmetry with :func:`write_environment`.
    """
    del arch
    maybe_fail("output", comm.rank)
    check_output_paths(comm, options, files)
    output = Path(options.output)
    hold_run_directories(comm, {"--output": output, "--checkpoint-dir": checkpoint_directory(options)},
                         wait_seconds=getattr(options, "wait_for_lock", None))
    return output


def write_environment(comm, arch, options, output) -> None:
    """Collective: write ``OUTPUT/environment.json`` = ``{"environment": environment(comm, arch), "options": ...}``.

    The options as resolved by the app when ``options`` is a :class:`~hpcgpu.app.cli.FrozenOptions`,
    so that any result in the directory can be reproduced. Written atomically by rank 0.
    """
    facts = environment(comm, arch)
    if comm.rank == 0:
        recorded = options.as_dict() if isinstance(options, FrozenOptions) else vars(options)
        write_json(Path(output) / "environment.json", {"environment": facts, "options": recorded})


def files_written(output, summary=None, checkpoint_dir=None, checkpoints_written: bool = False) -> list[str]:
    """Lines for the end of a run saying where its files went (rank 0, after they were written).

    Lists the output directory with its files (snapshots, plots, ``environment.json``), the summary
    file and the checkpoint directory when checkpoints were written there.
    """
    output = Path(output)
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in output.iterdir()
                   if not p.name.startswith(LOCK_NAME)) if output.is_dir() else []
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} entries)" if len(names) > 12 else "")
    lines = [f"output: {output}/ ({shown})" if names else f"output: {output}/"]
    if summary:
        lines.append(f"summary: {summary}")
    if checkpoint_dir is not None and checkpoints_written:
        lines.append(f"checkpoints: {checkpoint_dir}")
    return lines

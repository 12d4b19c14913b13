"""What a result depends on: versions, hardware and the git commit, recorded with every run."""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path


@functools.cache
def git_commit() -> str | None:
    """The commit of the hpcgpu checkout in use (``$HPCGPU_GIT_COMMIT`` if set; None outside git)."""
    import os

    if os.environ.get("HPCGPU_GIT_COMMIT"):
        # Set by job scripts that run a copy of the tree without .git (e.g. on a remote GPU machine).
        return os.environ["HPCGPU_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except Exception:
        return None
    return getattr(module, "__version__", "unknown")


def environment(comm, arch) -> dict:
    """Collective: software versions, MPI, CUDA/NCCL and the GPU models of all ranks."""
    from mpi4py import MPI

    import hpcgpu

    facts = {
        "hpcgpu": hpcgpu.__version__,
        "git_commit": git_commit(),
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

        from hpcgpu.transport.nccl import nccl_version

        facts["cupy"] = cupy.__version__
        facts["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        facts["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        facts["nccl"] = nccl_version()
        gpu = f"{arch.identity.name} ({arch.identity.uuid})"
    hosts_and_gpus = comm.mpi.allgather((comm.hostname, gpu))
    facts["hosts"] = sorted({host for host, _ in hosts_and_gpus})
    facts["gpus"] = [g for _, g in hosts_and_gpus if g]
    return facts


def prepare_output(comm, arch, options) -> Path:
    """Collective: create ``options.output`` (rank 0) and record the run's environment and options there.

    Writes ``OUTPUT/environment.json`` = ``{"environment": environment(comm, arch), "options": vars(options)}``,
    so that any result in the directory can be reproduced. Returns the output directory.
    """
    from hpcgpu.app.summary import write_json

    output = Path(options.output)
    if comm.rank == 0:
        output.mkdir(parents=True, exist_ok=True)
    facts = environment(comm, arch)
    if comm.rank == 0:
        write_json(output / "environment.json", {"environment": facts, "options": vars(options)})
    return output

"""``--profile``: the Nsight Systems command that records a timeline of this very run.

It does not profile by itself: on rank 0 it prints the exact ``nsys profile`` command (CUDA API and
kernels, NVTX ranges named after the phases of :mod:`hpcgpu.app.timers`, MPI calls), one report per
rank, and the app exits. Under nsys already, the run goes on. See ``docs/profiling.md``. The flag is
added with the monitor's (:func:`hpcgpu.observe.monitor.add_monitor_arguments`).
"""

from __future__ import annotations

import os
import shlex
import sys


def under_nsys(environ=None) -> bool:
    """True when this process runs under Nsight Systems (it sets ``NSYS_*`` variables in the target)."""
    environ = os.environ if environ is None else environ
    return any(key.startswith("NSYS_") for key in environ)


def mpi_implementation() -> str:
    """``openmpi`` or ``mpich`` (MPICH and its derivatives: Intel MPI, MVAPICH, Cray MPICH), for nsys."""
    from mpi4py import MPI

    return "openmpi" if "Open MPI" in MPI.Get_library_version() else "mpich"


def nsys_command(app: str, app_args: list[str], n_ranks: int, launcher: str = "mpiexec",
                 mpi_impl: str = "openmpi") -> str:
    """The command line that records one Nsight Systems report per rank for ``python -m app app_args``.

    ``%q{VAR}`` is expanded by nsys from each rank's environment, so every rank writes its own file:
    the rank variable is ``SLURM_PROCID`` under srun, ``OMPI_COMM_WORLD_RANK`` (Open MPI) or
    ``PMI_RANK`` (MPICH) under mpiexec.
    """
    if launcher == "srun":
        start, rank_variable = ["srun", "-n", str(n_ranks)], "SLURM_PROCID"
    else:
        start = ["mpiexec", "-n", str(n_ranks)]
        rank_variable = "OMPI_COMM_WORLD_RANK" if mpi_impl == "openmpi" else "PMI_RANK"
    nsys = ["nsys", "profile", "-t", "cuda,nvtx,mpi", f"--mpi-impl={mpi_impl}",
            "-o", f"profile_%q{{{rank_variable}}}", "--force-overwrite", "true"]
    return shlex.join(start + nsys + ["python", "-m", app, *app_args])


def handle_profile_flag(comm, options, app: str, argv=None) -> bool:
    """``--profile``: on rank 0 print how to record a timeline; True when the app should exit now (0).

    Under nsys already it prints a note and returns False: the run goes on with its NVTX ranges.
    """
    if not getattr(options, "profile", False):
        return False
    if under_nsys():
        if comm.rank == 0:
            print("--profile: running under Nsight Systems; NVTX ranges mark every phase", flush=True)
        return False
    if comm.rank == 0:
        args = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--profile"]
        impl = mpi_implementation()
        print("Record a timeline of this run (CUDA kernels and copies, NVTX phase ranges, MPI calls), one "
              "report per rank:\n")
        print("  " + nsys_command(app, args, comm.size, "mpiexec", impl))
        print("\nor inside a Slurm allocation:\n")
        print("  " + nsys_command(app, args, comm.size, "srun", impl))
        print("\nthen open profile_0.nsys-rep in Nsight Systems, or summarise it with: "
              "nsys stats profile_0.nsys-rep (NVTX ranges, kernels, MPI calls)", flush=True)
    return True

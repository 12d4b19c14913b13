"""Test-suite plumbing: the ``mpi`` marker and the ``gpu`` marker.

``@pytest.mark.mpi(ranks=[1, 2, 3, 4])`` reruns a test body under ``mpiexec -n N`` for every N (as in
Devito's ``parallel`` marker). In the parent pytest the test only launches the child job and checks
its exit code; in the children (``HPCGPU_MPI_CHILD=1``) the body runs on every rank with the ``comm``
fixture. Each launch has a timeout (default 120 s, ``mpi(timeout=...)``), so a deadlock fails fast.
An exception on any rank aborts the child job (MPI_Abort) instead of hanging the other ranks.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import pytest

CHILD = os.environ.get("HPCGPU_MPI_CHILD") == "1"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RANKS = (1, 2, 3, 4)
DEFAULT_TIMEOUT = 120


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("mpi")
    if marker is not None and "mpi_ranks" in metafunc.fixturenames:
        ranks = marker.kwargs.get("ranks", DEFAULT_RANKS)
        metafunc.parametrize("mpi_ranks", ranks, ids=[f"ranks{n}" for n in ranks])


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def _gpu_available() -> bool:
    from hpcgpu.runtime.device import probe_cupy

    return probe_cupy()[0]


@pytest.fixture(scope="session")
def cupy():
    """CuPy, for tests marked ``gpu``; the marker already skips them where no GPU is usable."""
    return pytest.importorskip("cupy")


@pytest.fixture
def mpi_ranks(request):
    """Number of ranks of this parametrisation (set by the ``mpi`` marker)."""
    return getattr(request, "param", 1)


@pytest.fixture
def comm(mpi_ranks):
    """The job's :class:`hpcgpu.Communicator` inside an MPI child; None in the launching parent."""
    if not CHILD:
        return None
    import hpcgpu

    return hpcgpu.Communicator()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker("mpi")
    if marker is None:
        return None
    if CHILD:
        try:
            testfunction = pyfuncitem.obj
            names = pyfuncitem._fixtureinfo.argnames
            testfunction(**{name: pyfuncitem.funcargs[name] for name in names})
        except BaseException as exc:  # any failure on one rank must end all ranks
            if isinstance(exc, pytest.skip.Exception):
                raise
            from mpi4py import MPI

            rank = MPI.COMM_WORLD.Get_rank()
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            # Straight to file descriptor 2: pytest's capture would swallow it when MPI_Abort kills us.
            os.write(2, "".join(f"[rank {rank}] {line}\n" for line in text.splitlines()).encode())
            if MPI.COMM_WORLD.Get_size() > 1:
                time.sleep(1.0)  # let the launcher forward our stderr before MPI_Abort kills everyone
                MPI.COMM_WORLD.Abort(1)
            raise
        return True
    from hpcgpu.launch import run_mpi

    n_ranks = pyfuncitem.funcargs["mpi_ranks"]
    timeout = marker.kwargs.get("timeout", DEFAULT_TIMEOUT)
    args = [sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-p", "no:cacheprovider", "-x",
            "--no-header", "-o", "addopts="]
    result = run_mpi(n_ranks, args, timeout=timeout, env={"HPCGPU_MPI_CHILD": "1"}, cwd=str(ROOT))
    if result.returncode != 0:
        pytest.fail(
            f"{n_ranks}-rank run of {pyfuncitem.nodeid} failed (exit {result.returncode}"
            f"{', timed out' if result.timed_out else ''}):\n{result.output[-6000:]}",
            pytrace=False,
        )
    if "skipped" in result.output and "passed" not in result.output:
        pytest.skip(f"skipped in the {n_ranks}-rank child")
    return True

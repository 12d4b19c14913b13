"""Test-suite plumbing: the ``mpi`` marker and the ``gpu`` marker.

``@pytest.mark.mpi(ranks=[1, 2, 3, 4])`` reruns a test body under ``mpiexec -n N`` for every N (as in
Devito's ``parallel`` marker). In the parent pytest the test only launches the child job and checks
its exit code; in the children (``HPCGPU_MPI_CHILD=1``) the body runs on every rank with the ``comm``
fixture. Each launch has a timeout (default 120 s, ``mpi(timeout=...)``), so a deadlock fails fast.
An exception on any rank aborts the child job (MPI_Abort) instead of hanging the other ranks; the
failing rank's traceback is also written to a file the parent reads, so the pytest report shows it
even when MPI_Abort kills the job before its stderr is forwarded.

A ``gpu`` test that runs on more ranks than the machine has GPUs (one GPU per rank) is skipped with
the reason, and a run with GPUs ends with a short table of the GPU tests: where they ran and how
they ended.

Why not the ``pytest-isolate-mpi`` plugin (0.4.1), which has the same ``mpi(ranks=[...], timeout=...)``
marker, a fresh job per test and rank count, and the failing rank's report (through
``python -m mpi4py``, whose exit calls MPI_Abort):

- ``pytest -q`` sets verbosity -1 and the plugin turns it into a bare ``-`` argument of every child
  pytest ("file or directory not found: -"), so every multi-rank test fails;
- at its timeout ``subprocess.run`` kills the launcher alone: Open MPI 4.1's ``mpirun`` leaves its
  ranks running (MPICH's hydra ends them); :func:`hpcgpu.jobs.launch.run_mpi` kills the process group;
- the launcher is one ``mpi_executable`` from the ini file, else the first ``mpirun`` on ``PATH``
  (a system Open MPI's beside a venv's MPICH-built mpi4py when the venv is not activated), with fixed
  ``mpi_command_line_args``: MPICH's ``mpiexec`` refuses Open MPI's ``--oversubscribe``, and there is
  no ``$HPCGPU_MPIEXEC`` or launcher beside the running Python;
- its cache of session-scoped fixtures requests ``comm`` from session scope, a ``ScopeMismatch`` with
  this file's per-test ``comm`` (an :class:`hpcgpu.Communicator`);
- each rank's report is logged as a test of its own (one test at 1-4 ranks reads "10 passed").
The ``gpu`` skip logic below would have stayed ours either way. docs/testing.md says the same.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

import pytest

CHILD = os.environ.get("HPCGPU_MPI_CHILD") == "1"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RANKS = (1, 2, 3, 4)
DEFAULT_TIMEOUT = 120


def pytest_configure(config):
    config.addinivalue_line("markers", "gpus(n): a gpu test that launches n ranks itself, one GPU each "
                                       "(skipped on machines with fewer GPUs)")


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("mpi")
    if marker is not None and "mpi_ranks" in metafunc.fixturenames:
        ranks = marker.kwargs.get("ranks", DEFAULT_RANKS)
        metafunc.parametrize("mpi_ranks", ranks, ids=[f"ranks{n}" for n in ranks])


def pytest_collection_modifyitems(config, items):
    n_gpus = _gpu_count()
    if n_gpus == 0:
        skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)
        return
    for item in items:
        ranks = _ranks_of(item)
        if item.get_closest_marker("gpu") is not None and ranks > n_gpus:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {ranks} GPUs (one per rank); this machine has {n_gpus}"))


def _ranks_of(item) -> int:
    """Ranks a test runs on: its ``mpi_ranks`` parameter, or a ``gpus(n)`` marker, else 1."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "mpi_ranks" in callspec.params:
        return int(callspec.params["mpi_ranks"])
    marker = item.get_closest_marker("gpus")
    return int(marker.args[0]) if marker is not None else 1


_GPU_COUNT = None


def _gpu_count() -> int:
    """Number of usable GPUs (0 without CuPy or a driver), probed once."""
    global _GPU_COUNT
    if _GPU_COUNT is None:
        from hpcgpu.runtime.device import probe_cupy

        _GPU_COUNT = 0
        if probe_cupy()[0]:
            import cupy

            _GPU_COUNT = int(cupy.cuda.runtime.getDeviceCount())
    return _GPU_COUNT


def _gpu_available() -> bool:
    return _gpu_count() > 0


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
            # And to a file the parent reads: the launcher may kill the job before forwarding stderr.
            report_dir = os.environ.get("HPCGPU_MPI_REPORT_DIR")
            if report_dir:
                Path(report_dir, f"rank{rank}.txt").write_text(text)
            if MPI.COMM_WORLD.Get_size() > 1:
                time.sleep(1.0)  # let the launcher forward our stderr before MPI_Abort kills everyone
                MPI.COMM_WORLD.Abort(1)
            raise
        return True
    from hpcgpu.jobs.launch import run_mpi

    n_ranks = pyfuncitem.funcargs["mpi_ranks"]
    timeout = marker.kwargs.get("timeout", DEFAULT_TIMEOUT)
    args = [sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-p", "no:cacheprovider", "-x",
            "--no-header", "-o", "addopts="]
    with tempfile.TemporaryDirectory(prefix="hpcgpu-mpi-report-") as report_dir:
        result = run_mpi(n_ranks, args, timeout=timeout, cwd=str(ROOT),
                         env={"HPCGPU_MPI_CHILD": "1", "HPCGPU_MPI_REPORT_DIR": report_dir})
        tracebacks = "".join(f"--- traceback of rank {path.stem[4:]} ---\n{path.read_text()}\n"
                             for path in sorted(Path(report_dir).glob("rank*.txt")))
    if result.returncode != 0:
        pytest.fail(
            f"{n_ranks}-rank run of {pyfuncitem.nodeid} failed (exit {result.returncode}"
            f"{', timed out' if result.timed_out else ''}):\n{tracebacks}"
            f"--- output (last 6000 characters) ---\n{result.output[-6000:]}",
            pytrace=False,
        )
    if "skipped" in result.output and "passed" not in result.output:
        pytest.skip(f"skipped in the {n_ranks}-rank child")
    return True


# ---------------------------------------------------------------------- table of the GPU tests
_gpu_outcomes: dict = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if CHILD or item.get_closest_marker("gpu") is None:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        row = _gpu_outcomes[(item.nodeid.split("::")[0], _ranks_of(item))]
        row[report.outcome] += 1
        row["seconds"] += report.duration


def pytest_terminal_summary(terminalreporter):
    if CHILD or not _gpu_outcomes or _gpu_count() == 0:
        return
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    write = terminalreporter.write_line
    write("")
    write(f"GPU tests on this machine: {_gpu_count()} x {name}")
    write(f"{'test file':<58} {'ranks':>5} {'passed':>6} {'failed':>6} {'skipped':>7} {'seconds':>8}")
    for (path, ranks), row in sorted(_gpu_outcomes.items()):
        write(f"{path:<58} {ranks:>5} {row['passed']:>6} {row['failed']:>6} {row['skipped']:>7} "
              f"{row['seconds']:>8.1f}")

"""Every fault ends the job within seconds with one message, and a refused run writes nothing.

- a full disk while writing snapshots, a trajectory or a checkpoint: exit 74, one ``error:`` line
  naming the file, no traceback, every earlier record readable (in a private tmpfs: nothing on the
  machine changes);
- an exception on one rank at any phase (``HPCGPU_INJECT_FAULT``): the job ends within seconds and
  says which rank;
- a corrupt output file: the restart refuses it with a message instead of a traceback;
- a run refused because its output directory holds another run's file leaves the directory as it was, and a
  refused run creates no directory;
- no MPI library: one line.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_command, run_mpi
from hpcgpu.testing import faults

ROOT = Path(__file__).resolve().parents[2]
STENCIL = ["-m", "apps.stencil", "--nx", "64", "--ny", "32", "--no-plot", "--quiet"]


def environment(**extra):
    return dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)


def stencil(n_ranks, out, *args, timeout=120, **env):
    return run_mpi(n_ranks, [sys.executable, *STENCIL, "--output", str(out), *args], timeout=timeout,
                   env=environment(**env), cwd=str(ROOT))


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error" in line.lower() or "Traceback" in line]


# ---------------------------------------------------------------------------------- a full disk
@pytest.fixture
def full_disk(tmp_path):
    problem = faults.unshare_available()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must be able to mount a private tmpfs: {problem}")
        pytest.skip(problem)
    mount_point = tmp_path / "disk"
    mount_point.mkdir()

    def run(size, app_args, check):
        """Run the app on a tmpfs of ``size`` at ``mount_point``, then ``check`` (Python source) in the same namespace."""
        from hpcgpu.jobs.launch import mpiexec_command

        app = " ".join(map(_quote, mpiexec_command(2, [sys.executable, *app_args])))
        script = f"{app}; echo \"exit=$?\"; {_quote(sys.executable)} -c {_quote(check)}"
        return faults.in_full_filesystem(mount_point, size, ["sh", "-c", script],
                                         env=environment(HPCGPU_CHECKPOINT_SPACE_CHECK="1"), cwd=str(ROOT))
    return mount_point, run


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(str(text))


READ_SNAPSHOTS = """
import netCDF4
with netCDF4.Dataset('{path}') as d:
    print('records', len(d['time']), 'finite', bool(abs(d['h'][:]).max() < 1e30))
"""


def test_a_full_disk_while_writing_snapshots_is_one_message_exit_74_and_the_records_stay(full_disk):
    mount_point, run = full_disk
    result = run("200k", [*STENCIL, "--steps", "3000", "--snapshot-every", "20", "--output", str(mount_point),
                          "--checkpoint-dir", str(mount_point.parent / "checkpoints")],
                 READ_SNAPSHOTS.format(path=mount_point / "swe.nc"))
    assert "exit=74" in result.stdout, result.stdout[-3000:]
    errors = error_lines(result.stdout)
    assert len(errors) == 1 and "swe.nc" in errors[0] and "No space left on device" in errors[0], errors
    assert "earlier records are intact" in errors[0]
    records = [line for line in result.stdout.splitlines() if line.startswith("records")]
    assert records and int(records[0].split()[1]) >= 2 and records[0].endswith("finite True"), result.stdout


def test_a_full_disk_while_writing_a_trajectory_keeps_every_earlier_frame(full_disk):
    mount_point, run = full_disk
    check = ("import MDAnalysis, warnings\nwarnings.simplefilter('ignore')\n"
             f"u = MDAnalysis.Universe('{mount_point / 'trajectory.h5md'}')\n"
             "empty = [ts.frame for ts in u.trajectory if not u.atoms.positions.any()]\n"
             "print('frames', len(u.trajectory), 'empty', empty)")
    result = run("1200k", ["-m", "apps.md", "--cells", "4", "--backend", "numpy", "--steps", "400", "--dump-every",
                           "2", "--quiet", "--no-plot", "--output", str(mount_point)], check)
    assert "exit=74" in result.stdout, result.stdout[-3000:]
    errors = error_lines(result.stdout)
    assert len(errors) == 1 and "trajectory.h5md" in errors[0], errors
    frames = [line for line in result.stdout.splitlines() if line.startswith("frames")]
    assert frames and int(frames[0].split()[1]) >= 2, result.stdout
    assert frames[0].endswith("empty []"), frames   # no frame lost to a write the storage refused


@pytest.mark.parametrize("space_check", ["1", "0"], ids=["checked-before", "failing-write"])
def test_a_full_disk_for_a_checkpoint_is_one_line_exit_74_and_the_previous_checkpoint_stays(full_disk, space_check):
    mount_point, run = full_disk
    check = ("import os\nprint('checkpoints', sorted(n for n in os.listdir('{d}') if n.startswith('ckpt_') "
             "and not n.endswith('.tmp')))").format(d=mount_point)
    args = [*STENCIL, "--steps", "2000", "--snapshot-every", "0", "--checkpoint-every", "100",
            "--output", str(mount_point.parent / "out"), "--checkpoint-dir", str(mount_point)]
    from hpcgpu.jobs.launch import mpiexec_command

    app = " ".join(map(_quote, mpiexec_command(2, [sys.executable, *args])))
    script = f"{app}; echo \"exit=$?\"; {_quote(sys.executable)} -c {_quote(check)}"
    result = faults.in_full_filesystem(mount_point, "260k", ["sh", "-c", script], cwd=str(ROOT),
                                       env=environment(HPCGPU_CHECKPOINT_SPACE_CHECK=space_check))
    assert "exit=74" in result.stdout, result.stdout[-3000:]
    assert "Traceback" not in result.stdout and "Segmentation" not in result.stdout, result.stdout[-3000:]
    errors = error_lines(result.stdout)
    assert len(errors) == 1 and "previous checkpoint is intact" in errors[0], errors
    assert "ckpt_000000100" in result.stdout.split("checkpoints", 1)[1], result.stdout[-1000:]


# ---------------------------------------------------------------------------------- one rank fails
@pytest.mark.parametrize("phase", ["parse:1", "setup:1", "output:2", "start:1", "step@7:2", "write:0"])
def test_an_exception_on_one_rank_ends_the_job_within_seconds_naming_that_rank(tmp_path, phase):
    started = time.monotonic()
    result = stencil(3, tmp_path / "out", "--steps", "40", "--snapshot-every", "5", timeout=60,
                     HPCGPU_INJECT_FAULT=phase)
    elapsed = time.monotonic() - started
    assert result.returncode != 0 and not result.timed_out, result.output[-2000:]
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"
    rank = phase.rsplit(":", 1)[1]
    assert f"[rank {rank}/3]" in result.output and "injected fault" in result.output, result.output[-2000:]


@pytest.mark.parametrize("request_text, problem", [
    ("write:1", "output files are written by rank 0 only"),
    ("step:5", "rank '5' is not one of this job's ranks 0..1"),
    ("stepp:1", "unknown phase 'stepp'"),
    ("write@3", "only step takes @N"),
])
def test_a_fault_injection_that_can_never_fire_is_refused_in_one_line(tmp_path, request_text, problem):
    result = stencil(2, tmp_path / "out", "--steps", "5", "--snapshot-every", "5", timeout=60,
                     HPCGPU_INJECT_FAULT=request_text)
    assert result.returncode == 2 and not result.timed_out, result.output[-2000:]
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: HPCGPU_INJECT_FAULT={request_text}: {problem}"), lines


def test_fault_requests_that_can_fire_are_accepted(monkeypatch):
    from hpcgpu.runtime.fault_injection import FAULT_VARIABLE, check_request

    for text in ("", "write", "write:0", "step@7:2", "parse:1", "output"):
        monkeypatch.setenv(FAULT_VARIABLE, text)
        check_request(3)


def test_a_config_file_on_one_node_only_ends_the_job_with_that_ranks_message(tmp_path):
    # Two programs of one job in different working directories: the file exists for rank 0 only.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "run.toml").write_text("steps = 5\nnx = 32\nny = 16\n")
    from hpcgpu.jobs.launch import mpiexec_path

    command = [mpiexec_path(), "-n", "1", "-wdir", str(tmp_path / "a"), sys.executable, *STENCIL[:2], "--config",
               "run.toml", "--output", str(tmp_path / "out"), ":", "-n", "1", "-wdir", str(tmp_path / "b"),
               sys.executable, *STENCIL[:2], "--config", "run.toml", "--output", str(tmp_path / "out")]
    result = run_command(command, timeout=60, env=environment())
    assert result.returncode == 2 and not result.timed_out, result.output
    assert "[rank 1/2] --config run.toml: file not found" in result.output
    assert not (tmp_path / "out" / "environment.json").exists()


def test_an_error_said_to_be_on_every_rank_but_raised_on_one_still_ends_the_job(tmp_path):
    code = ("import hpcgpu, time\nfrom hpcgpu.errors import ConfigurationError\n"
            "comm = hpcgpu.Communicator()\nwith hpcgpu.abort_on_error(comm):\n"
            "    if comm.rank == 1:\n        raise ConfigurationError('only rank 1 sees this')\n"
            "    comm.barrier()\n")
    started = time.monotonic()
    result = run_mpi(2, [sys.executable, "-c", code], timeout=60, env=environment(), cwd=str(tmp_path))
    assert not result.timed_out and result.returncode != 0, result.output
    assert time.monotonic() - started < 30
    assert "[rank 1/2] error: only rank 1 sees this" in result.output


# ---------------------------------------------------------------------------------- refusals
def test_a_refused_run_leaves_the_directory_as_it_was(tmp_path):
    first = stencil(2, tmp_path, "--steps", "10")
    assert first.returncode == 0, first.output
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir() if p.is_file()}
    second = stencil(2, tmp_path, "--steps", "10", "--nx", "48")   # another run into the same directory
    assert second.returncode == 2 and "already exists" in second.output, second.output
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir() if p.is_file()}
    assert after == before


REFUSED_RUNS = {   # refused after parsing: by the app's own checks, or by the restart (after the directories are made)
    "md-cells-0": (["-m", "apps.md", "--cells", "0"], "--cells '0'"),
    "md-temperature-negative": (["-m", "apps.md", "--cells", "4", "--temperature", "-1"],
                                "expected a temperature >= 0"),
    "train-batch-too-large": (["-m", "apps.train", "--batch-size", "100000000"], "exceeds the"),
    "stencil-missing-restart": ([*STENCIL, "--restart", "/nonexistent/ckpt_000000010"], "file is missing"),
    "user-model-missing-restart": (["examples/gray_scott.py", "--n", "32", "--restart", "/nonexistent/ckpt_000000010"],
                                   "file is missing"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_RUNS))
def test_a_refused_run_creates_no_directory(tmp_path, case):
    args, message = REFUSED_RUNS[case]
    out = tmp_path / "new" / "out"
    result = run_mpi(2, [sys.executable, *args, "--quiet", "--output", str(out)], timeout=120, env=environment(),
                     cwd=str(ROOT))
    assert result.returncode == 2 and message in result.output, result.output
    assert not (tmp_path / "new").exists(), sorted(str(p) for p in (tmp_path / "new").rglob("*"))


def test_a_corrupt_snapshot_file_is_refused_on_restart_with_a_message(tmp_path):
    checkpoints = ["--checkpoint-every", "10", "--checkpoint-dir", str(tmp_path / "checkpoints")]
    first = stencil(2, tmp_path, "--steps", "20", "--snapshot-every", "5", *checkpoints)
    assert first.returncode == 0, first.output
    path = tmp_path / "swe.nc"
    path.write_bytes(path.read_bytes()[:40])   # the header cut short
    second = stencil(2, tmp_path, "--steps", "30", "--snapshot-every", "5", "--restart", "latest", *checkpoints)
    assert second.returncode == 2, second.output
    assert "swe.nc cannot be read as a snapshot file" in second.output and "Traceback" not in second.output


def test_without_an_mpi_library_an_app_says_so_in_one_line(tmp_path):
    result = run_command([sys.executable, *STENCIL[:2], "--steps", "3"], timeout=60,
                         env=environment(MPI4PY_LIBMPI=str(tmp_path / "libmpi-missing.so")))
    assert result.returncode == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no usable MPI library" in lines[0] and "hpcgpu[mpich]" in lines[0], lines

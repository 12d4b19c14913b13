"""Usage errors of hpcgpu's own commands and the warning about a skipped corrupt checkpoint are one clear
line each: printed once per job (rank 0), no usage block, no Python source line."""

import os
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_command, run_mpi

ROOT = Path(__file__).resolve().parents[2]


def lines_of(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_hpcgpu_check_usage_error_is_one_line_from_rank_0_only():
    result = run_mpi(2, [sys.executable, "-m", "hpcgpu", "check", "--json"], timeout=60, cwd=str(ROOT))
    assert result.returncode == 2, result.output
    assert lines_of(result.output) == ["python -m hpcgpu check: error: argument --json: expected one argument "
                                       "(run python -m hpcgpu check --help for all options)"], result.output


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["nope"], "argument app: invalid choice: 'nope'"),
    (["stencil", "--nodes", "0"], "argument --nodes"),
    (["--write-shipped", "/nonexistent-dir"], "--write-shipped /nonexistent-dir: expected the jobscripts/ directory"),
])
def test_hpcgpu_jobscript_errors_are_one_line(argv, message):
    result = run_command([sys.executable, "-m", "hpcgpu", "jobscript", *argv], timeout=60, cwd=str(ROOT),
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 2, result.output
    lines = lines_of(result.output)
    assert len(lines) == 1 and lines[0].startswith("python -m hpcgpu jobscript: error: ") and message in lines[0], lines


def test_skipping_a_corrupt_checkpoint_is_one_warning_line(tmp_path):
    common = [sys.executable, "-m", "apps.stencil", "--nx", "48", "--ny", "24", "--checkpoint-every", "10",
              "--output", str(tmp_path), "--quiet", "--no-plot"]
    first = run_mpi(1, [*common, "--steps", "20"], timeout=120, cwd=str(ROOT))
    assert first.returncode == 0, first.output
    rank_file = tmp_path / "checkpoints" / "ckpt_000000020" / "rank_00000.h5"
    data = bytearray(rank_file.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64   # inside the field data: a checksum mismatch
    rank_file.write_bytes(bytes(data))
    result = run_mpi(1, [*common, "--steps", "30", "--restart", "latest"], timeout=120, cwd=str(ROOT))
    assert result.returncode == 0, result.output
    lines = lines_of(result.output)
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: skipping checkpoint ") and "ckpt_000000020" in lines[0], lines
    assert "checksum mismatch" in lines[0] and ".py:" not in result.output

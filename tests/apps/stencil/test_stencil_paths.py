"""Every execution path of apps.stencil gives the same bits: overlapped or not (CPU ranks; the GPU
matrix in tests/validation runs the same comparisons on GPUs, graphs included)."""

import json
import sys
from pathlib import Path

import pytest

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[3]


def checksum(tmp_path, ranks, *args):
    summary = tmp_path / f"summary{len(list(tmp_path.glob('summary*')))}.json"
    command = [sys.executable, "-m", "apps.stencil", *args, "--backend", "numpy", "--snapshot-every", "0",
               "--no-plot", "--quiet", "--output", str(tmp_path / summary.stem), "--summary", str(summary)]
    result = run_mpi(ranks, command, timeout=240, cwd=str(ROOT))
    assert result.returncode == 0, result.output[-3000:]
    return json.loads(summary.read_text())["checksum"]


@pytest.mark.parametrize("grid", ["channel", "latlon"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_no_overlap_gives_the_overlapped_bits(tmp_path, grid, ranks):
    args = ["--grid", grid, "--nx", "72", "--ny", "36", "--steps", "12"]
    assert checksum(tmp_path, ranks, *args) == checksum(tmp_path, ranks, *args, "--no-overlap")

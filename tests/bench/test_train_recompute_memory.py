"""benchmarks/train_recompute_memory.py at a small size: a row per model and setting, gradients equal,
recomputation holding and peaking below the run without, and the JSON holding what the table printed;
on a GPU, the same held bytes as on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


SMALL = ["--width", "64", "--depth", "3", "--batch", "96", "--inputs", "32", "--classes", "7"]


def _run(tmp_path, *extra):
    out = tmp_path / "recompute.json"
    result = subprocess.run([sys.executable, "benchmarks/train_recompute_memory.py", *SMALL, *extra, "--json", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(out.read_text())["rows"]


def test_small_run_reports_both_models(tmp_path):
    result, rows = _run(tmp_path)
    assert [(row["model"], row["recompute"]) for row in rows] == [
        ("large-mlp", False), ("large-mlp", True), ("residual-mlp", False), ("residual-mlp", True)]
    assert all(row["grads_equal"] for row in rows)
    for without, with_ in (rows[0:2], rows[2:4]):
        assert with_["held_bytes"] < without["held_bytes"] and with_["peak_bytes"] < without["peak_bytes"]
    s, b, i, w = 4, 96, 32, 64   # float32: large-mlp holds the input, then one batch x width per hidden layer and the last
    assert rows[1]["held_bytes"] == s * (b * i + 3 * b * w + b * w)
    assert "residual-mlp: recomputation holds" in result.stdout


@pytest.mark.gpu
def test_gpu_run_holds_what_the_cpu_run_holds(tmp_path):
    """The same models on the GPU: gradients with and without recomputation bitwise equal, the held bytes
    those of the CPU run, and the device peak lower with recomputation."""
    pytest.importorskip("cupy")
    _, cpu_rows = _run(tmp_path)
    result, rows = _run(tmp_path, "--backend", "gpu")
    assert "recomputation memory, GPU" in result.stdout
    assert all(row["grads_equal"] for row in rows)
    assert [row["held_bytes"] for row in rows] == [row["held_bytes"] for row in cpu_rows]
    for without, with_ in (rows[0:2], rows[2:4]):
        assert 0 < with_["peak_bytes"] < without["peak_bytes"]

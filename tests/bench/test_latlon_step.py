"""benchmarks/latlon_step.py on the CPU at a small size: every piece gets a row, the step's rates follow
from its time, and the JSON holds what the table printed."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_run_times_every_piece(tmp_path):
    out = tmp_path / "latlon.json"
    result = subprocess.run([sys.executable, "benchmarks/latlon_step.py", "--nx", "48", "--ny", "24", "--backend", "cpu",
                             "--repeats", "2", "--json", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "cpu" and report["graphs"] is False
    pieces = [row["piece"] for row in report["rows"]]
    assert pieces == ["stage kernel", "polar filter (numpy)", "halo exchange", "step", "history entry"]
    assert all(row["us_per_call"] > 0 for row in report["rows"])
    step = report["rows"][3]
    assert abs(step["steps_per_second"] * step["us_per_call"] * 1e-6 - 1) < 1e-9
    assert abs(step["cell_updates_per_second"] - 48 * 24 * step["steps_per_second"]) < 1e-6 * step["cell_updates_per_second"]
    assert "lat-lon 48 x 24 fp64, cpu" in result.stdout

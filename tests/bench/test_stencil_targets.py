"""benchmarks/stencil_targets.py on the CPU at --quick sizes: every requested target gets a row, the
default path and --no-graph give the same checksum, and each fraction is the measured number over its goal."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_cpu_run_reports_every_target(tmp_path):
    out = tmp_path / "targets.json"
    result = subprocess.run([sys.executable, "benchmarks/stencil_targets.py", "--quick", "--backend", "cpu",
                             "--repeats", "1", "--only", "small,heat3d,latlon,kernels", "--json", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["target"]: row for row in report["rows"]}
    assert set(rows) == {"64 x 32 steps/s, default path", "64 x 32 checksums, default == --no-graph",
                         "heat3d 24^3 fp64 app", "lat-lon 72 x 36 vs channel per cell", "stage kernels"}
    assert rows["64 x 32 checksums, default == --no-graph"]["met"] is True
    assert rows["stage kernels"]["met"] is None            # GPU only
    heat3d = rows["heat3d 24^3 fp64 app"]
    rate = float(heat3d["measured"].split()[0])
    assert abs(heat3d["fraction"] - rate * 16 / report["copy_bytes_per_second"]) < 1e-3 * heat3d["fraction"]
    assert "stencil targets (issue 25), cpu" in result.stdout

"""benchmarks/md_lammps_cpu.sh at a tiny size: both programs run, alternated, and the JSON holds the
medians, the CPU times, the load and each program's phase breakdown (skipped without LAMMPS's ``lmp``)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("lmp") is None, reason="no LAMMPS binary 'lmp' (Debian/Ubuntu: apt-get install lammps)")
def test_one_rank_run_writes_both_programs_phases_and_load(tmp_path):
    out = tmp_path / "md_lammps_cpu.json"
    result = subprocess.run(["bash", "benchmarks/md_lammps_cpu.sh", "--cells", "5", "--steps", "10", "--repeats", "2",
                             "--cases", "1", "--json", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["conditions"]["lammps"] != "unknown" and report["conditions"]["steps"] == 10
    # 2 repeats x 2 programs x (0 steps, 10 steps), alternated program by program
    assert [(run["program"], run["steps"]) for run in report["runs"][:4]] == [
        ("lammps", 0), ("lammps", 10), ("apps.md", 0), ("apps.md", 10)]
    assert len(report["runs"]) == 8
    (row,) = report["table"]
    assert row["n_atoms"] == 500 and row["case"] == "1 rank x 1 thread"
    for program in ("lammps", "apps.md"):
        assert row[program]["wall_seconds"] > 0
        assert {"forces", "neighbor", "communication"} <= set(row[program]["phases_seconds"])
    assert row["ratio_wall"] == pytest.approx(row["lammps"]["wall_seconds"] / row["apps.md"]["wall_seconds"])
    assert "ratio = LAMMPS time / apps.md time" in result.stdout

"""apps.md reports what this job did and checks its output paths first (issue 24).

The final table's "% wall" added up to 113%: the initial thermo and H5MD frame (before the timed loop)
and the final gather (after it) were timed as phases of a loop that did not contain them. An
unwritable ``--write-data`` was noticed only after the whole run, losing its summary.
"""

import json
import sys
from pathlib import Path

from hpcgpu.jobs.launch import run_mpi

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--cells", "4", "--steps", "20", "--thermo-every", "5", "--no-plot"]


def test_phases_and_wall_cover_the_same_interval(tmp_path):
    summary = tmp_path / "s.json"
    result = run_mpi(2, [sys.executable, "-m", "apps.md", *SMALL, "--dump-every", "5", "--output", str(tmp_path / "o"),
                         "--summary", str(summary), "--write-data", str(tmp_path / "final.data")],
                     timeout=180, cwd=str(ROOT))
    assert result.returncode == 0, result.output
    record = json.loads(summary.read_text())
    total = sum(row["mean"] for row in record["timers"].values())
    # host overhead = wall - phases on each rank, clamped at 0: phases timed outside wall push the sum above
    # it (it was 113%). Each rank's wall ends when it leaves the loop, so the mean may exceed rank 0's a little.
    assert total <= record["wall_seconds"] * 1.03, (total, record["wall_seconds"], record["timers"])
    # on every rank the phases fit in its wall: the clamp never hit (it did on rank 0 before, at 0.000 s)
    assert record["timers"]["host overhead"]["min"] > 0, record["timers"]
    assert (record["steps"], record["first_step"], record["final_step"]) == (20, 0, 20)
    shares = [float(line.split()[-2].rstrip("%")) for line in result.output.splitlines()
              if line.split() and line.split()[-1].endswith("%") and line.split()[-2].endswith("%")]
    assert shares and sum(shares) <= 103, result.output
    lines = result.output.rstrip().splitlines()
    assert f"data file: {tmp_path / 'final.data'}" in lines
    assert lines[-1] == f"summary: {summary}"
    assert lines[-2].startswith(f"output: {tmp_path / 'o'}/ (") and "trajectory.h5" in lines[-2]


def test_an_unwritable_write_data_path_is_refused_before_the_run(tmp_path):
    regular = tmp_path / "a_file"
    regular.write_text("x")
    result = run_mpi(2, [sys.executable, "-m", "apps.md", *SMALL, "--output", str(tmp_path / "o"),
                         "--summary", str(tmp_path / "s.json"), "--write-data", str(regular / "final.data")],
                     timeout=120, cwd=str(ROOT))
    assert result.returncode == 2, result.output
    assert result.output.strip() == (f"error: --write-data {regular / 'final.data'}: {regular} is a regular file, "
                                     "not a directory; pass a --write-data FILE in a writable directory")
    assert not (tmp_path / "o").exists()

"""benchmarks/pair_targets.py on two CPU ranks at its quick sizes, every section: every run starts, the checksums of the
Jacobi schedules and of the pretend-node runs equal the plain ones, the split-model losses agree with
one rank and their communication bytes with the formula; speed goals are shown, not judged, off the
GPU pair; an existing output directory is refused."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, "benchmarks/pair_targets.py", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_quick_cpu_campaign_checks_what_it_claims(tmp_path):
    out, rows_path = tmp_path / "campaign", tmp_path / "rows.json"
    result = _run("--quick", "--backend", "cpu", "--rounds", "2", "--timeout", "300", "--output", str(out),
                  "--json", str(rows_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rows = json.loads(rows_path.read_text())["rows"]
    by_target = {row["target"]: row for row in rows}
    assert not [row for row in rows if "did not finish" in row["target"]], result.stdout[-3000:]
    assert by_target["jacobi checksums, 1 rank == every 2-rank schedule"]["met"] is True
    for app in ("jacobi", "swe", "md", "train"):
        assert by_target[f"{app}: checksum, pretend nodes == plain"]["met"] is True
    for grid, kind in (("T = 2", "tensor"), ("P = 2, M = 4", "pipeline")):
        assert by_target[f"{grid}: loss curve against 1 rank (6 steps)"]["met"] is True
        assert by_target[f"{grid}: {kind} bytes per step and rank, measured / computed"]["met"] is True
    speed = [row for row in rows if row["goal"] != "-" and row["section"] in ("jacobi", "swe", "md", "train")
             and "checksums" not in row["target"]]
    assert [row["target"] for row in speed if row["section"] == "jacobi"] == ["jacobi 96^2 x 40, 2 ranks, fastest schedule"]
    assert {row["section"] for row in speed} == {"jacobi", "swe", "md", "train"}
    assert all(row["met"] is None and "not judged here" in row["goal"] for row in speed)
    assert [row["target"] for row in rows if row["section"] == "md"] == [
        "MD weak 1 -> 2 ranks, 256 atoms per rank", "MD weak 1 -> 2 ranks, 500 atoms per rank"]
    assert any(row["target"].startswith("lat-lon weak 1 -> 2 ranks") for row in rows)
    assert [row["target"] for row in rows if row["section"] == "train"] == ["training 1 -> 2 ranks, fp32"]
    assert "median of 2 pairs" in next(row["measured"] for row in rows if row["section"] == "train")
    # every run kept its command and log
    runs = sorted(path for path in out.iterdir() if path.is_dir())
    assert len(runs) >= 15 and all((run / "command.txt").is_file() and (run / "log.txt").is_file() for run in runs)
    assert "pair targets (issue 28), cpu, 2 ranks, quick sizes" in result.stdout


def test_existing_output_directory_is_refused(tmp_path):
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "keep.txt").write_text("an earlier campaign")
    result = _run("--quick", "--backend", "cpu", "--only", "split", "--output", str(tmp_path / "earlier"), timeout=120)
    assert result.returncode != 0 and "exists" in (result.stdout + result.stderr)
    assert (tmp_path / "earlier" / "keep.txt").read_text() == "an earlier campaign"

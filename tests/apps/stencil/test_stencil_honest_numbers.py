"""apps.stencil reports what this job did (issue 24).

After a restart the throughput counted the absolute steps (9.7 Gcell/s for 150 real steps) and the
header printed the steps of ``--days`` when ``--steps`` was given.
"""

import json
import sys

from hpcgpu.jobs.launch import run_mpi

JACOBI = ["--model", "jacobi", "--nx", "48", "--ny", "32", "--norm-every", "0"]


def run_app(n_ranks, *args, timeout=180):
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", *args], timeout=timeout)
    assert result.returncode == 0, result.output
    return result


def test_a_restarted_run_counts_its_own_steps(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_app(2, *JACOBI, "--quiet", "--steps", "30", "--checkpoint-every", "30", "--checkpoint-dir", str(ckpt),
            "--output", str(tmp_path / "a"), "--summary", str(tmp_path / "a.json"))
    second = run_app(2, *JACOBI, "--steps", "40", "--restart", "latest", "--checkpoint-dir", str(ckpt),
                     "--output", str(tmp_path / "b"), "--summary", str(tmp_path / "b.json"))
    first, restarted = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("a", "b"))
    assert (first["steps"], first["first_step"], first["final_step"]) == (30, 0, 30)
    assert (restarted["steps"], restarted["first_step"], restarted["final_step"]) == (10, 30, 40)
    expected = restarted["updates_per_step"] * 10 / restarted["wall_seconds"]
    assert abs(restarted["throughput"] - expected) <= 1e-9 * expected   # this job's 10 steps, not 40
    output = second.output
    assert "steps: 10 (continuing from step 30 to step 40)" in output
    assert "\n10 steps in " in output


def test_the_header_describes_the_steps_that_will_run_and_the_end_says_where_files_went(tmp_path):
    summary = tmp_path / "s.json"
    result = run_app(1, "--model", "swe", "--nx", "32", "--ny", "16", "--steps", "6", "--snapshot-every", "3",
                     "--no-plot", "--output", str(tmp_path / "out"), "--summary", str(summary))
    header = result.output.splitlines()[0]
    assert " 6 steps = " in header, header   # not the ~6 days' worth of steps of the default --days
    assert "steps: 6\n" in result.output
    tail = result.output.rstrip().splitlines()[-2:]
    assert tail[0].startswith(f"output: {tmp_path / 'out'}/ (") and "environment.json" in tail[0]
    assert "swe.nc" in tail[0]
    assert tail[1] == f"summary: {summary}"
    assert json.loads(summary.read_text())["steps"] == 6

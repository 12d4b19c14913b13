"""The scaling study (python -m hpcgpu.bench scaling): planning, analysis, and real CPU series at 1 and 2 ranks."""

from __future__ import annotations

import csv
import json
import math

import pytest

from hpcgpu.bench.__main__ import main as bench_main
from hpcgpu.bench.scaling import analyse, plan_series
from hpcgpu.errors import ConfigurationError


@pytest.fixture(autouse=True)
def one_thread_per_rank(monkeypatch):
    """One Numba thread per rank: on a small, shared CPU machine a multi-threaded rank waits for a busy
    core at every parallel loop, which makes the 1-rank baseline erratic."""
    monkeypatch.setenv("NUMBA_NUM_THREADS", "1")


def read_result(directory):
    result = json.loads((directory / "scaling.json").read_text())
    with open(directory / "scaling.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert (directory / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return result, table


def run_summaries(directory, ranks):
    return {n: json.loads((directory / f"ranks{n}" / "summary.json").read_text()) for n in ranks}


def check_series(result, table, ranks):
    assert [row["n_ranks"] for row in result["rows"]] == ranks
    assert [int(row["n_ranks"]) for row in table] == ranks
    base = result["rows"][0]
    for row in result["rows"]:
        assert row["status"] == "ok", row
        # The definition, exactly (a timing bound would fail on a busy machine: tiny runs on shared cores
        # can come out superlinear, which the study reports as a warning, not an error).
        assert row["efficiency"] > 0
        assert row["efficiency"] == pytest.approx((row["throughput"] / row["n_ranks"])
                                                  / (base["throughput"] / base["n_ranks"]))
        assert row["seconds_per_step"] == pytest.approx(row["wall_seconds"] / row["steps"])
        assert {"compute", "host overhead"} <= set(row["phases"])
    assert result["rows"][0]["efficiency"] == pytest.approx(1.0)
    assert result["bottleneck"]["message"]
    assert result["bottleneck"]["phase"] in (None, *result["phases"])
    if result["bottleneck"]["phase"] is not None:
        assert result["bottleneck"]["message"].endswith("the bottleneck")


def test_stencil_strong_series(tmp_path, capsys):
    code = bench_main(["scaling", "--app", "stencil", "--ranks", "1,2", "--strong", "--output", str(tmp_path),
                       "--timeout", "120", "--", "--nx", "96", "--ny", "64", "--steps", "20", "--monitor"])
    assert code == 0
    result, table = read_result(tmp_path)
    check_series(result, table, [1, 2])
    summaries = run_summaries(tmp_path, [1, 2])
    # Strong: the same global grid on both rank counts.
    assert summaries[1]["decomposition"]["global_shape"] == summaries[2]["decomposition"]["global_shape"] == [64, 96]
    assert summaries[2]["gpu_monitor"]["reason"].startswith("no GPU")   # --monitor reached the app
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("wrote scaling.json")
    assert "time/step" in out and "eff." in out


def test_stencil_weak_series_keeps_cells_per_rank(tmp_path):
    code = bench_main(["scaling", "--app", "stencil", "--ranks", "1,2", "--weak", "--output", str(tmp_path),
                       "--", "--nx", "64", "--ny", "64", "--steps", "20"])
    assert code == 0
    result, table = read_result(tmp_path)
    check_series(result, table, [1, 2])
    summaries = run_summaries(tmp_path, [1, 2])
    per_rank = {n: math.prod(s["decomposition"]["global_shape"]) / s["n_ranks"] for n, s in summaries.items()}
    assert per_rank[1] == per_rank[2] == 64 * 64
    assert [row["size_per_rank"] for row in result["rows"]] == [4096, 4096]
    # Weak efficiency is T1 / TN.
    one, two = result["rows"]
    assert two["efficiency"] == pytest.approx(one["seconds_per_step"] / two["seconds_per_step"], rel=1e-6)


def test_md_weak_series_keeps_atoms_per_rank(tmp_path):
    code = bench_main(["scaling", "--app", "md", "--ranks", "1,2", "--weak", "--output", str(tmp_path),
                       "--", "--cells", "4", "--steps", "10"])
    assert code == 0
    result, table = read_result(tmp_path)
    check_series(result, table, [1, 2])
    summaries = run_summaries(tmp_path, [1, 2])
    assert summaries[1]["n_atoms"] == 256 and summaries[2]["n_atoms"] == 512
    assert [row["size_per_rank"] for row in result["rows"]] == [256, 256]
    # Each rank started with 256 lattice sites; a few atoms have migrated by the end.
    final = summaries[2]["diagnostics"]["atoms_per_rank"]
    assert 240 <= final["min"] <= 256 <= final["max"] <= 272


def test_a_failing_run_gives_a_clear_row(tmp_path, capsys):
    code = bench_main(["scaling", "--app", "md", "--ranks", "1", "--output", str(tmp_path),
                       "--", "--cells", "4", "--steps", "2", "--potential", "bogus"])
    assert code == 1
    result, table = read_result(tmp_path)
    row = result["rows"][0]
    assert row["status"] == "failed (exit 2)" and "bogus" in row["error"]
    assert result["bottleneck"] is None
    assert "FAILED (exit 2)" in capsys.readouterr().out
    assert "bogus" in table[0]["error"]


def test_weak_plans_replicate_the_baseline_block():
    plans = plan_series("md", [1, 2, 4, 8], "weak", ["--cells", "8,6,6"])
    assert [p.size_per_rank for p in plans] == [8 * 6 * 6 * 4] * 4
    eight = plans[-1].app_args
    assert eight[eight.index("--cells") + 1] == "16,12,12" and eight[eight.index("--dims") + 1] == "2,2,2"
    stencil = plan_series("stencil", [1, 2, 4], "weak", ["--model", "heat3d", "--nx", "32", "--ny", "32", "--nz", "32"])
    assert [p.size_per_rank for p in stencil] == [32**3] * 3
    strong = plan_series("stencil", [1, 2, 4], "strong", [])
    assert [p.global_size for p in strong] == [1024 * 1024] * 3 and "--dims" not in strong[-1].app_args
    train = plan_series("train", [1, 2, 4], "weak", ["--batch-size", "64"])
    assert [p.app_args[p.app_args.index("--batch-size") + 1] for p in train] == ["64", "128", "256"]
    # A fixed grid that cannot hold the baseline is a row that does not run, not a crash.
    impossible = plan_series("stencil", [1, 2], "weak", ["--dims", "2,1"])
    assert all(p.error and "cannot split" in p.error for p in impossible)
    with pytest.raises(ConfigurationError):
        plan_series("md", [1, 2], "weak", ["--data", "atoms.data"])


def fake_row(n_ranks, compute, communication, steps=10):
    phases = {"compute": {"mean": compute * steps, "max": compute * steps, "imbalance": 0.0},
              "communication": {"mean": communication * steps, "max": communication * steps, "imbalance": 0.0}}
    wall = (compute + communication) * steps
    from hpcgpu.bench.scaling import RunPlan, make_row

    record = {"status": "ok", "command": "", "log": "", "error": None,
              "summary": {"steps": steps, "wall_seconds": wall, "throughput": 1000 * n_ranks / wall * steps,
                          "unit": "cells/s", "timers": phases}}
    return make_row(RunPlan(n_ranks, [], 1000.0 * n_ranks, "cells", ""), record)


def test_analysis_flags_the_phase_that_grows():
    # Weak series: compute per step constant, communication 1 ms -> 4.1 ms: communication is the bottleneck.
    rows = [fake_row(1, 0.010, 0.001), fake_row(2, 0.010, 0.002), fake_row(4, 0.010, 0.0041)]
    bottleneck = analyse(rows, "weak")
    assert bottleneck["phase"] == "communication"
    assert bottleneck["growth"] == pytest.approx(4.1)
    assert bottleneck["message"].startswith("communication grows 4.1x from 1 to 4 ranks")
    assert bottleneck["share_of_lost_time"] == pytest.approx(1.0)
    assert rows[2]["efficiency"] == pytest.approx(0.011 / 0.0141)
    assert [r.get("grows_most") for r in rows] == [None, "communication", "communication"]
    # Strong series with perfect compute scaling and no communication: nothing is flagged.
    ideal = [fake_row(1, 0.008, 0.0, steps=10), fake_row(2, 0.004, 0.0, steps=10)]
    for row, n in zip(ideal, (1, 2)):
        row["throughput"] = 1000 / (0.008 / n)   # same problem: throughput doubles
    assert analyse(ideal, "strong")["phase"] is None

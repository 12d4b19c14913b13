"""Hang detection: the watchdog's timeouts per phase (one rank, in-process), the rule that names the
stuck rank, and whole apps on 2-4 CPU ranks where one rank hangs on purpose (``HPCGPU_WATCHDOG_TEST``)
and is named, with its node, within bounded time."""

import json
import re
import sys
import time

import pytest

from hpcgpu.health.hang import name_stuck_ranks
from hpcgpu.health.watchdog import EXIT_HANG, Watchdog, WatchdogSettings
from hpcgpu.jobs.launch import run_mpi

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_timeouts_follow_the_phase_and_never_fire_on_a_slow_start(tmp_path):
    import hpcgpu

    comm = hpcgpu.Communicator()
    aborted, lines = [], []
    settings = WatchdogSettings(startup_s=3.0, step_s=0.5, checkpoint_s=1.5, factor=4.0, interval_s=0.05)
    watchdog = Watchdog(comm, settings, output=tmp_path, emit_fn=lines.append, abort_fn=aborted.append).start()
    try:
        time.sleep(1.2)                 # a slow start (compilation): longer than a step may take
        for step in range(1, 4):
            time.sleep(0.2 if step == 3 else 0.01)
            watchdog.step_done(step)
        assert watchdog.timeout_for("step") == pytest.approx(0.8, abs=0.1)   # 4 x the longest step (0.2 s)
        with watchdog.phase("checkpoint"):
            time.sleep(1.0)             # the first checkpoint: longer than a step, inside its own floor
        watchdog.step_done(4)
        assert aborted == [] and lines == []
        time.sleep(3.0)                 # no step for longer than 0.8 s: expired, ended after the grace
        assert aborted == [EXIT_HANG]
    finally:
        watchdog.stop()
    assert "no progress for" in lines[0] and "phase step" in lines[0] and "last completed step 4" in lines[0]
    assert "test_watchdog.py" in lines[0]   # the main thread's stack: it was sleeping in this test
    verdict = json.loads((tmp_path / "hang.json").read_text())
    assert verdict["stuck_ranks"] == [0] and verdict["exclude_nodes"] == [comm.hostname]
    assert verdict["exit_code"] == EXIT_HANG and "rank 0/1" in verdict["summary"]


def test_the_stuck_rank_is_the_one_behind_outside_communication():
    waiting = {"step": 11, "waiting": True}
    assert name_stuck_ranks({0: waiting, 1: {"step": 11, "waiting": False}, 2: waiting}, 3)[0] == [1]
    assert name_stuck_ranks({0: {"step": 12, "waiting": True}, 1: waiting, 2: {"step": 12, "waiting": True}}, 3)[0] == [1]
    assert name_stuck_ranks({0: waiting, 2: waiting}, 3)[0] == [1]                      # silent: first
    ranks, reason = name_stuck_ranks({0: waiting, 1: waiting}, 2)
    assert ranks == [0, 1] and "dead link" in reason


def ended_with_exit_hang(result) -> bool:
    """The job ended through the watchdog's ``MPI_Abort(EXIT_HANG)``: the launcher's exit code is 76, or (MPICH's
    hydra, at times) the signal it killed the other ranks with, after printing the abort's code."""
    if result.timed_out or result.returncode == 0:
        return False
    return result.returncode == EXIT_HANG or re.search(rf"MPI_Abort\(comm=0x[0-9a-f]+, {EXIT_HANG}\)", result.output) is not None


def run_hung_app(n_ranks, action, out, extra=()):
    """apps.stencil on ``n_ranks`` CPU ranks with a test-only hang; returns (result, seconds, hang.json)."""
    started = time.monotonic()
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.stencil", "--model", "swe", "--nx", "48", "--ny", "24",
                               "--steps", "100000", "--output", str(out), "--watchdog-step", "2",
                               "--watchdog-startup", "60", "--no-plot", *extra],
                     timeout=120, cwd=str(ROOT), env={"HPCGPU_WATCHDOG_TEST": action, "NUMBA_NUM_THREADS": "1"})
    seconds = time.monotonic() - started
    hang = out / "hang.json"
    return result, seconds, json.loads(hang.read_text()) if hang.exists() else None


@pytest.mark.parametrize("n_ranks, stuck", [(2, 1), (4, 2)])
def test_a_rank_that_hangs_is_named_with_its_node(tmp_path, n_ranks, stuck):
    result, seconds, verdict = run_hung_app(n_ranks, f"hang:{stuck}:12", tmp_path)
    assert ended_with_exit_hang(result), result.output[-4000:]
    assert seconds < 60, seconds
    assert verdict["stuck_ranks"] == [stuck] and "outside communication" in verdict["reason"], verdict
    assert f"hang: rank {stuck}/{n_ranks} on node " in result.output
    assert verdict["ranks"][str(stuck)]["step"] == 12
    # Every rank that could still act reported where it is; the others wait in the halo exchange.
    assert sorted(verdict["reports"]) == [str(r) for r in range(n_ranks)]
    for rank, report in verdict["reports"].items():
        assert report["waiting"] == (int(rank) != stuck) and "File " in report["stack"]


def test_a_rank_holding_the_interpreter_lock_is_named_as_silent(tmp_path):
    result, seconds, verdict = run_hung_app(3, "hold-gil:2:12", tmp_path)
    assert ended_with_exit_hang(result) and seconds < 60, result.output[-4000:]
    assert verdict["stuck_ranks"] == [2] and "no heartbeat" in verdict["reason"]


@pytest.mark.parametrize("stuck", [0, 1])
def test_hang_json_is_written_by_a_live_rank_whichever_rank_is_frozen(tmp_path, stuck):
    """A frozen rank 0 cannot write the verdict: the other rank does, so the job scripts always find
    hang.json (the node to exclude, and the sign that the launcher's exit 9 was a hang)."""
    result, seconds, verdict = run_hung_app(2, f"hold-gil:{stuck}:12", tmp_path)
    assert ended_with_exit_hang(result) and seconds < 90, result.output[-4000:]
    assert verdict is not None, (sorted(p.name for p in tmp_path.iterdir()), result.output[-3000:])
    assert verdict["stuck_ranks"] == [stuck] and verdict["reported_by"] == 1 - stuck, verdict
    assert verdict["exclude_nodes"] == verdict["stuck_nodes"] and verdict["exit_code"] == EXIT_HANG
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("hang") and p.name != "hang.json"]


def test_a_slowed_rank_is_named_as_a_straggler(tmp_path):
    summary = tmp_path / "summary.json"
    result = run_mpi(3, [sys.executable, "-m", "apps.stencil", "--model", "swe", "--nx", "48", "--ny", "24",
                         "--steps", "120", "--output", str(tmp_path), "--summary", str(summary), "--no-plot",
                         "--straggler-every", "20"],
                     timeout=120, cwd=str(ROOT), env={"HPCGPU_WATCHDOG_TEST": "slow:1:0.01", "NUMBA_NUM_THREADS": "1"})
    assert result.returncode == 0, result.output[-4000:]
    named = json.loads(summary.read_text())["health"]["stragglers"]["stragglers"]
    assert [record["rank"] for record in named] == [1], named
    assert named[0]["slower_by"] > 0.2 and named[0]["step"] == 60   # comparisons at steps 20, 40 and 60
    assert "straggler: rank 1 on node " in result.output


def test_the_straggler_line_carries_the_gpu_readings():
    from hpcgpu.health.stragglers import straggler_line

    record = {"rank": 3, "host": "gpu07", "step": 400, "own_seconds_per_step": 0.0141, "median_seconds_per_step": 0.01,
              "slower_by": 0.41, "gpu": {"sm_clock_mhz": 1410.0, "temperature_c": 87.0,
                                         "throttle_reasons": ["sw_thermal_slowdown"]}}
    line = straggler_line(record, 3, 100)
    assert line.startswith("straggler: rank 3 on node gpu07: 41% slower")
    assert "SM 1410 MHz; 87 °C; clock reasons sw_thermal_slowdown" in line

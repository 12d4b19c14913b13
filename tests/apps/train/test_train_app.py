"""``python -m apps.train`` end to end: summary, restart equivalence, preemption, errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hpcgpu.checkpoint import EXIT_REQUEUE
from hpcgpu.jobs.launch import run_mpi

SMALL = ["--model", "large-mlp", "--depth", "2", "--width", "32", "--batch-size", "24", "--no-plot",
         "--eval-every", "5", "--warmup", "3"]


def run_app(tmp_path, n_ranks, *args, name="run", expect=0, timeout=120):
    summary = tmp_path / f"{name}.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.train", "--quiet", "--output", str(tmp_path / name),
                               "--summary", str(summary), *args], timeout=timeout)
    assert result.returncode == expect, result.output
    return json.loads(summary.read_text()) if expect == 0 else result


def test_summary_follows_the_app_contract(tmp_path, data_file):
    summary = run_app(tmp_path, 2, *SMALL, "--data", data_file, "--steps", "12", "--bucket-mb", "0.002")
    for key in ("app", "version", "git_commit", "backend", "n_ranks", "decomposition", "steps", "wall_seconds",
                "throughput", "unit", "timers", "diagnostics", "checksum"):
        assert key in summary, key
    assert summary["app"] == "apps.train" and summary["n_ranks"] == 2 and summary["steps"] == 12
    assert summary["unit"] == "samples/s" and summary["throughput"] > 0
    for phase in ("compute", "allreduce", "io"):
        assert set(summary["timers"][phase]) == {"min", "mean", "max", "imbalance"}
    decomposition = summary["decomposition"]
    assert decomposition["local_batch_sizes"] == [12, 12] and decomposition["buckets"] > 1
    diagnostics = summary["diagnostics"]
    assert len(diagnostics["loss_curve"]) == 12 and diagnostics["replicas_identical"] is True
    assert 0.0 <= diagnostics["test_accuracy"] <= 1.0
    assert diagnostics["evaluations"]["step"] == [5, 10, 12]
    assert diagnostics["overlap"]["hidden_fraction"] is not None
    assert summary["checksum"].startswith("sha256:")


def test_restart_continues_with_identical_losses(tmp_path, data_file):
    """fp16 + ZeRO-1 + dropout + accumulation: params, sharded optimiser state, loss scale and data
    position all come back, so a run restarted from step 10 (or interrupted after step 1 and
    requeued) reproduces the uninterrupted run bit for bit."""
    args = [*SMALL, "--dropout", "0.1", "--precision", "fp16", "--zero", "1", "--accum-steps", "2",
            "--loss-scale", "1024", "--data", data_file, "--steps", "20"]
    straight = run_app(tmp_path, 2, *args, "--checkpoint-every", "10", "--checkpoint-dir",
                       str(tmp_path / "ckpt"), name="straight")
    restarted = run_app(tmp_path, 2, *args, "--restart", str(tmp_path / "ckpt" / "ckpt_000000010"),
                        "--checkpoint-dir", str(tmp_path / "unused"), name="restarted")
    assert restarted["first_step"] == 10 and restarted["steps"] == 10
    assert restarted["diagnostics"]["loss_curve"] == straight["diagnostics"]["loss_curve"]
    assert restarted["checksum"] == straight["checksum"]
    assert restarted["diagnostics"]["loss_scale"] == straight["diagnostics"]["loss_scale"]

    # preemption: a wall-time limit already reached stops after the first step with a checkpoint and exit 75
    stopped = run_app(tmp_path, 2, *args, "--checkpoint-dir", str(tmp_path / "pre"), "--wall-time-limit", "0.001",
                      name="stopped", expect=EXIT_REQUEUE)
    assert "ckpt_000000001" in str(list((tmp_path / "pre").iterdir())), stopped.output
    resumed = run_app(tmp_path, 2, *args, "--checkpoint-dir", str(tmp_path / "pre"), "--restart", "latest",
                      name="resumed")
    assert resumed["first_step"] == 1
    assert resumed["diagnostics"]["loss_curve"] == straight["diagnostics"]["loss_curve"]
    assert resumed["checksum"] == straight["checksum"]


def test_restart_on_another_rank_count(tmp_path, data_file):
    """A 2-rank ZeRO-1 checkpoint restarts on 3 ranks without ZeRO (full state was saved)."""
    args = [*SMALL, "--data", data_file, "--steps", "16"]
    straight = run_app(tmp_path, 2, *args, "--zero", "1", "--checkpoint-every", "8", "--checkpoint-dir",
                       str(tmp_path / "ckpt"), name="two")
    elastic = run_app(tmp_path, 3, *args, "--restart", str(tmp_path / "ckpt" / "ckpt_000000008"),
                      "--checkpoint-dir", str(tmp_path / "unused"), name="three")
    a, b = np.array(straight["diagnostics"]["loss_curve"]), np.array(elastic["diagnostics"]["loss_curve"])
    assert np.array_equal(a[:8], b[:8])                        # history restored
    assert np.max(np.abs(a[8:] - b[8:]) / a[8:]) <= 1e-5     # continuation agrees up to rounding


def test_help_lists_the_training_flags():
    result = subprocess.run([sys.executable, "-m", "apps.train", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0
    for flag in ("--accum-steps", "--precision", "--zero", "--bucket-mb", "--recompute", "--data",
                 "--checkpoint-every", "--restart", "--batch-size"):
        assert flag in result.stdout


def test_a_small_model_on_an_automatically_chosen_gpu_gets_a_hint():
    from apps.train.app import launch_bound_note
    from apps.train.nn.models import large_mlp, mnist1d_mlp

    assert "--backend numpy" in launch_bound_note(True, mnist1d_mlp().n_params, "auto")
    assert launch_bound_note(True, mnist1d_mlp().n_params, "cupy") is None      # asked for explicitly
    assert launch_bound_note(False, mnist1d_mlp().n_params, "auto") is None     # already on the CPU
    assert launch_bound_note(True, large_mlp(1024, 1000, 2, 1024).n_params, "auto") is None


def test_restart_latest_without_any_checkpoint_starts_from_the_beginning(tmp_path):
    """The first job of a requeue chain runs with --restart latest before any checkpoint exists."""
    result = run_mpi(1, [sys.executable, "-m", "apps.train", "--output", str(tmp_path / "out"), "--steps", "2",
                         "--checkpoint-dir", str(tmp_path / "none"), "--restart", "latest"], timeout=120)
    assert result.returncode == 0, result.output
    assert "starting from the beginning" in result.output


@pytest.mark.parametrize("args, expected", [
    (["--no-such-flag"], "unrecognized arguments"),
    (["--batch-size", "4", "--accum-steps", "4", "--steps", "1"], "--accum-steps"),
    (["--data", "/nonexistent/train.h5", "--steps", "1"], "file not found"),
    (["--precision", "fp8"], "invalid choice"),
    (["--restart", "/nonexistent/ckpt_000000005", "--steps", "1"], "file is missing"),
])
def test_bad_input_exits_2_with_one_message(tmp_path, args, expected):
    result = run_mpi(2, [sys.executable, "-m", "apps.train", "--quiet", "--output", str(tmp_path / "out"),
                         "--checkpoint-dir", str(tmp_path / "none"), *args], timeout=60)
    assert result.returncode == 2, result.output
    assert expected in result.output
    assert result.output.count("error:") == 1, result.output

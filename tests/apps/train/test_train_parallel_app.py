"""``python -m apps.train --model residual-mlp`` with tensor and pipeline parallelism, end to end.

The app runs through ``hpcgpu.jobs.launch.run_mpi`` (under a timeout, like the other app tests): one
rank (grid 1 x 1 x 1), and two ranks split as 1 x 2 x 1 (``--tensor-parallel 2``), 1 x 1 x 2
(``--pipeline-parallel 2 --micro-batches 4``, 1F1B and GPipe) and 2 x 1 x 1, same seed, fp64, 30
steps. The loss curves, the evaluations and the norm of the full parameters agree with the one-rank
run to 1e-10 relative (the split products add their partial sums in another order: rounding only,
measured <= 3.1e-16; see docs/parallelism.md). Refused combinations exit with code 2 and one message.
At four ranks, ``--tensor-parallel 2 --zero 1`` (2 x 2 x 1, ZeRO-1 over the data axis) agrees with the
same grid without ZeRO, halves the optimiser state per rank and restarts from its checkpoints.
"""

import json
import sys

import numpy as np
import pytest

from hpcgpu.jobs.launch import run_mpi

STEPS = 30
SPLIT = ["--model", "residual-mlp", "--depth", "3", "--width", "16", "--hidden", "32", "--dropout", "0.1",
         "--batch-size", "24", "--precision", "fp64", "--clip-norm", "1.0", "--warmup", "3",
         "--eval-every", "10", "--backend", "numpy", "--no-plot", "--steps", str(STEPS)]
TOLERANCE = 1e-10


def run_app(path, n_ranks, *args, expect=0, timeout=90):
    summary = path / "summary.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.train", "--quiet", "--output", str(path / "out"),
                               "--summary", str(summary), *args], timeout=timeout)
    assert result.returncode == expect, result.output
    return json.loads(summary.read_text()) if expect == 0 else result


def relative(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b) / np.abs(b)))


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, data_file):
    """The 1 x 1 x 1 reference run."""
    return run_app(tmp_path_factory.mktemp("one"), 1, *SPLIT, "--data", data_file)


def test_one_rank_reference_reports_the_grid(one_rank):
    assert one_rank["decomposition"]["kind"] == "data x tensor x pipeline"
    assert {key: one_rank["decomposition"][key] for key in ("data", "tensor", "pipeline", "micro_batches")} \
        == {"data": 1, "tensor": 1, "pipeline": 1, "micro_batches": 1}
    diagnostics = one_rank["diagnostics"]
    assert len(diagnostics["loss_curve"]) == STEPS
    assert diagnostics["loss_curve"][-1] < diagnostics["loss_curve"][0]
    assert diagnostics["evaluations"]["step"] == [10, 20, 30]
    assert diagnostics["pipeline"]["bubble_formula"] == 0.0
    assert one_rank["checksum"].startswith("sha256:")


@pytest.mark.parametrize("flags, decomposition", [
    (["--tensor-parallel", "2"], {"data": 1, "tensor": 2, "pipeline": 1, "micro_batches": 1}),
    (["--pipeline-parallel", "2", "--micro-batches", "4"], {"data": 1, "tensor": 1, "pipeline": 2, "micro_batches": 4}),
    (["--pipeline-parallel", "2", "--micro-batches", "4", "--pipeline-schedule", "gpipe"],
     {"data": 1, "tensor": 1, "pipeline": 2, "micro_batches": 4}),
    ([], {"data": 2, "tensor": 1, "pipeline": 1, "micro_batches": 1}),
], ids=["tensor2", "pipeline2", "pipeline2-gpipe", "data2"])
def test_split_runs_agree_with_one_rank(tmp_path, data_file, one_rank, flags, decomposition):
    summary = run_app(tmp_path, 2, *SPLIT, "--data", data_file, *flags)
    assert {key: summary["decomposition"][key] for key in decomposition} == decomposition
    assert summary["decomposition"]["schedule"] == ("gpipe" if "gpipe" in flags else "1f1b")
    diagnostics, reference = summary["diagnostics"], one_rank["diagnostics"]
    assert relative(diagnostics["loss_curve"], reference["loss_curve"]) <= TOLERANCE
    assert relative(diagnostics["evaluations"]["test_loss"], reference["evaluations"]["test_loss"]) <= TOLERANCE
    assert diagnostics["evaluations"]["test_accuracy"] == reference["evaluations"]["test_accuracy"]
    assert relative(diagnostics["parameter_norm"], reference["parameter_norm"]) <= TOLERANCE
    assert diagnostics["n_params"] == reference["n_params"]
    assert (diagnostics["n_params_per_rank"] < reference["n_params"]) == (decomposition["data"] == 1)
    assert diagnostics["replicas_identical"] is True
    pipeline = diagnostics["pipeline"]
    if decomposition["pipeline"] == 2:
        assert pipeline["bubble_formula"] == pytest.approx(1 / 5)        # (P-1)/(M+P-1)
        assert len(pipeline["bubble_measured"]) == 2
        assert pipeline["peak_in_flight"] == ([4, 4] if "gpipe" in flags else [2, 1])
    elif decomposition["tensor"] == 2:
        # 2 allreduces per block and step (3 blocks), 1 per block and evaluation chunk (3 evaluations)
        assert diagnostics["tensor_allreduces"] == 2 * 3 * STEPS + 3 * 3


@pytest.mark.parametrize("args, expected", [
    (["--tensor-parallel", "2", "--pipeline-parallel", "2"], "does not divide the job's 2 ranks"),
    (["--pipeline-parallel", "2", "--accum-steps", "2"], "use --micro-batches 4"),
    (["--tensor-parallel", "2", "--model", "large-mlp"], "only --model residual-mlp is split"),
    (["--tensor-parallel", "2", "--hidden", "33"], "--hidden 33 cannot be split"),
], ids=["ranks", "accum", "model", "hidden"])
def test_refused_combinations_exit_2_with_one_message(tmp_path, data_file, args, expected):
    result = run_app(tmp_path, 2, *SPLIT, "--data", data_file, "--checkpoint-dir", str(tmp_path / "none"),
                     *args, expect=2, timeout=60)
    assert expected in result.output, result.output
    assert result.output.count("error:") == 1, result.output


def test_split_model_checkpoint_restarts_bitwise_and_reshards(tmp_path, data_file):
    """--tensor-parallel 2 with --checkpoint-every: the restart from step 10 on the same grid continues the
    uninterrupted run bitwise; the same checkpoint restarted as --pipeline-parallel 2 (resharded) agrees
    to rounding; another --hidden is refused with one message."""
    checkpoints = tmp_path / "ckpt"
    tensor = ["--tensor-parallel", "2"]
    full = run_app(tmp_path / "full", 2, *SPLIT, *tensor, "--data", data_file, "--checkpoint-dir", str(checkpoints),
                   "--checkpoint-every", "10")
    same = run_app(tmp_path / "same", 2, *SPLIT, *tensor, "--data", data_file, "--checkpoint-dir", str(checkpoints),
                   "--restart", str(checkpoints / "ckpt_000000010"))
    assert same["first_step"] == 10
    assert same["diagnostics"]["loss_curve"] == full["diagnostics"]["loss_curve"]   # history restored, then continued
    assert same["checksum"] == full["checksum"]
    resharded = run_app(tmp_path / "pipe", 2, *SPLIT, "--pipeline-parallel", "2", "--micro-batches", "2",
                        "--data", data_file, "--checkpoint-dir", str(checkpoints),
                        "--restart", str(checkpoints / "ckpt_000000010"))
    assert resharded["decomposition"]["pipeline"] == 2
    assert relative(resharded["diagnostics"]["loss_curve"], full["diagnostics"]["loss_curve"]) < TOLERANCE
    refused = run_app(tmp_path / "other", 2, *[a if a != "32" else "64" for a in SPLIT], *tensor,
                      "--data", data_file, "--checkpoint-dir", str(checkpoints),
                      "--restart", str(checkpoints / "ckpt_000000010"), expect=2)
    assert refused.output.count("error:") == 1, refused.output


def test_zero_over_the_data_axis_at_four_ranks(tmp_path, data_file, one_rank):
    """--tensor-parallel 2 --zero 1 on 4 ranks (2 x 2 x 1): the losses, evaluations and parameter norm
    agree with the same grid without ZeRO and with the one-rank run to 1e-10; the optimiser state per
    rank is half the plain run's; the checkpoint of step 10 restarts bitwise with --zero 1 and within
    1e-10 without it."""
    checkpoints = tmp_path / "ckpt"
    grid = ["--tensor-parallel", "2", "--data", data_file]
    zero = run_app(tmp_path / "zero", 4, *SPLIT, *grid, "--zero", "1", "--checkpoint-dir", str(checkpoints),
                   "--checkpoint-every", "10", timeout=240)
    plain = run_app(tmp_path / "plain", 4, *SPLIT, *grid, timeout=240)
    assert zero["decomposition"]["zero_stage"] == 1 and plain["decomposition"]["zero_stage"] == 0
    assert {key: zero["decomposition"][key] for key in ("data", "tensor", "pipeline")} \
        == {"data": 2, "tensor": 2, "pipeline": 1}
    for reference in (plain, one_rank):
        assert relative(zero["diagnostics"]["loss_curve"], reference["diagnostics"]["loss_curve"]) <= TOLERANCE
        assert relative(zero["diagnostics"]["evaluations"]["test_loss"],
                        reference["diagnostics"]["evaluations"]["test_loss"]) <= TOLERANCE
        assert relative(zero["diagnostics"]["parameter_norm"], reference["diagnostics"]["parameter_norm"]) <= TOLERANCE
    assert zero["diagnostics"]["replicas_identical"] is True
    zero_bytes = zero["diagnostics"]["optimizer_state_bytes"]
    plain_bytes = plain["diagnostics"]["optimizer_state_bytes"]
    assert zero_bytes == zero["decomposition"]["optimizer_state_bytes_per_rank"]
    assert plain_bytes["min"] == plain_bytes["max"]
    assert abs(zero_bytes["max"] / plain_bytes["max"] - 0.5) < 0.01    # 1/D, D = 2
    same = run_app(tmp_path / "same", 4, *SPLIT, *grid, "--zero", "1", "--checkpoint-dir", str(checkpoints),
                   "--restart", str(checkpoints / "ckpt_000000010"), timeout=240)
    assert same["first_step"] == 10
    assert same["diagnostics"]["loss_curve"] == zero["diagnostics"]["loss_curve"]
    assert same["checksum"] == zero["checksum"]
    without = run_app(tmp_path / "without", 4, *SPLIT, *grid, "--checkpoint-dir", str(checkpoints),
                      "--restart", str(checkpoints / "ckpt_000000010"), timeout=240)
    assert relative(without["diagnostics"]["loss_curve"], zero["diagnostics"]["loss_curve"]) <= TOLERANCE

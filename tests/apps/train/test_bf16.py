"""bf16 mixed precision on the CPU: conversion, training against fp32, data parallelism, restart.

bf16 keeps fp32 master weights and optimiser state, runs the model on a bfloat16 copy
(``ml_dtypes.bfloat16`` NumPy arrays, arithmetic in float32, rounded at the same storage
points as the GPU's 16-bit kernels) and has no loss scaling.
"""

import json
import sys

import ml_dtypes
import numpy as np
import pytest

from distributed_cases import relative_difference, train_curve

from apps.train.parallel.distributed import replicas_identical
from apps.train.kernels.gemm import gemm
from apps.train.training.precision import (BFloat16Precision, bfloat16_bits, bfloat16_bits_to_float32,
                                  make_precision)
from hpcgpu.jobs.launch import run_mpi

BF16 = np.dtype(ml_dtypes.bfloat16)
#: bf16 loss curve vs the fp32 one over 50 steps (measured 1.6e-3; bf16 keeps ~2-3 digits)
BF16_VS_FP32 = 1e-2
#: N ranks vs one process in 16-bit precision: the fp16 data-parallel tests' tolerance
DATA_PARALLEL_16_BIT = 2e-2


def float32_from_bits(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_conversion_rounds_to_nearest_even_like_ml_dtypes():
    """Ties (even and odd upper halves), subnormals, overflow to inf, inf, signed zeros and NaN."""
    edge_bits = [
        0x3F808000,   # tie, kept part even: rounds down to 0x3F80
        0x3F818000,   # tie, kept part odd: rounds up to 0x3F82
        0x3F808001,   # just above a tie: up
        0x3F807FFF,   # just below a tie: down
        0x00000001,   # smallest float32 subnormal: to +0
        0x00008000,   # subnormal tie, even: to 0
        0x00018000,   # subnormal tie, odd: up to 0x0002
        0x007FFFFF,   # largest subnormal: rounds up to the smallest normal 0x0080
        0x807FFFFF,   # its negative
        0x7F7FFFFF,   # float32 max: past the largest bfloat16, rounds to inf
        0x7F7F7FFF,   # just below the tie at bfloat16 max: stays finite
        0x7F800000, 0xFF800000,   # +-inf
        0x00000000, 0x80000000,   # +-0
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF,   # NaNs (quiet, signalling, payloads)
    ]
    values = float32_from_bits(edge_bits)
    with np.errstate(invalid="ignore"):     # ml_dtypes warns on casting NaN
        expected = values.astype(BF16).view(np.uint16)
    assert np.array_equal(bfloat16_bits(values), expected), [
        (hex(b), hex(got), hex(want)) for b, got, want in zip(edge_bits, bfloat16_bits(values), expected)
        if got != want]
    assert list(bfloat16_bits(values)[:4]) == [0x3F80, 0x3F82, 0x3F81, 0x3F80]
    assert bfloat16_bits(values)[9] == 0x7F80
    nan_bits = bfloat16_bits(values)[-4:]
    assert np.all(np.isnan(bfloat16_bits_to_float32(nan_bits)))   # NaN stays NaN, sign kept
    assert list(nan_bits >> 15) == [0, 1, 0, 0]


def test_conversion_matches_ml_dtypes_over_the_float32_range(rng):
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    with np.errstate(invalid="ignore"):     # ml_dtypes warns on casting NaN
        expected = values.astype(BF16).view(np.uint16)
    assert np.array_equal(bfloat16_bits(values), expected)
    # back to float32 is exact, and ml_dtypes agrees
    patterns = rng.integers(0, 2**16, 10_000, dtype=np.uint64).astype(np.uint16)
    finite = ~np.isnan(patterns.view(BF16).astype(np.float32))
    assert np.array_equal(bfloat16_bits_to_float32(patterns)[finite],
                          patterns.view(BF16).astype(np.float32)[finite])


def test_policy_keeps_float32_masters_and_no_loss_scale():
    master = np.array([1.0, 1.00390625, 1e-3, 3e38], dtype=np.float32)
    policy = make_precision("bf16", master)
    assert isinstance(policy, BFloat16Precision)
    assert policy.compute_params.dtype == BF16 and policy.compute_grads.dtype == BF16
    assert policy.loss_scale == 1.0 and policy.update_scale(found_nonfinite=True)
    assert policy.state_dict() == {}
    assert np.array_equal(policy.compute_params.view(np.uint16), bfloat16_bits(master))
    policy.compute_grads[...] = np.array([0.5, -2.0, 1e-30, 7.0], dtype=np.float32)
    policy.grads_to_master()
    assert policy.master_grads.dtype == np.float32
    assert np.array_equal(policy.master_grads, policy.compute_grads.astype(np.float32))
    view = policy.compute_params[1:]
    master[...] = 3.0
    policy.refresh_compute_params()
    assert np.all(view.astype(np.float32) == 3.0)     # refreshed in place: layer views stay valid
    with pytest.raises(TypeError, match="float32"):
        make_precision("bf16", np.zeros(3, np.float64))


def test_bf16_gemm_is_float32_rounded_once(rng):
    a = rng.standard_normal((33, 17)).astype(BF16)
    b = rng.standard_normal((21, 17)).astype(BF16)
    out = rng.standard_normal((33, 21)).astype(BF16)
    reference = out.astype(np.float32) + a.astype(np.float32) @ b.astype(np.float32).T
    gemm(a, b, out, transpose_b=True, accumulate=True)
    assert out.dtype == BF16
    assert np.array_equal(out.view(np.uint16), bfloat16_bits(reference))


def test_bf16_training_learns_and_tracks_fp32():
    """50 steps of a LayerNorm + GELU + dropout MLP: the bf16 loss curve decreases and stays
    within BF16_VS_FP32 (relative) of the fp32 curve; masters and moments stay float32."""
    fp32, fp32_params, _ = train_curve(None, 50, global_batch=24)
    bf16, bf16_params, _ = train_curve(None, 50, global_batch=24, precision="bf16")
    assert bf16_params.dtype == np.float32
    assert bf16[-1] < 0.7 * bf16[0]                                   # it learns
    assert np.mean(bf16[-10:]) < np.mean(bf16[:10])
    assert relative_difference(bf16, fp32) <= BF16_VS_FP32, (bf16[-3:], fp32[-3:])
    assert np.max(np.abs(bf16_params - fp32_params)) <= 1e-2 * np.max(np.abs(fp32_params))
    accumulated, _, _ = train_curve(None, 50, global_batch=24, precision="bf16", accum_steps=2)
    assert relative_difference(accumulated, bf16) <= DATA_PARALLEL_16_BIT


def test_bf16_cnn_trains():
    from apps.train.nn.models import mnist1d_cnn
    from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step

    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 40)).astype(np.float32)
    y = rng.integers(0, 10, 32)
    losses = {}
    for precision in ("fp32", "bf16"):
        trainer = Trainer(mnist1d_cnn(n_inputs=40, n_classes=10),
                          TrainConfig(lr=1e-2, global_batch_size=32, precision=precision, seed=2))
        state = init_train_state(trainer)
        losses[precision] = np.array([train_step(trainer, state, x, y, np.arange(32)).loss
                                      for _ in range(15)])
    assert losses["bf16"][-1] < 0.5 * losses["bf16"][0]
    # one batch learnt by heart: the losses go to ~0.06, so compare against the initial loss
    assert np.max(np.abs(losses["bf16"] - losses["fp32"])) <= BF16_VS_FP32 * losses["fp32"][0]


@pytest.mark.mpi(ranks=[2])
def test_bf16_data_parallel_equals_one_process(comm):
    """2 ranks x B/2 in bf16 (gradients summed in float32 over ranks, rounded to bf16 once)
    follow the 1-process bf16 run on B within the fp16 tests' tolerance."""
    reference, reference_params, _ = train_curve(None, 30, global_batch=24, precision="bf16")
    losses, params, _ = train_curve(comm, 30, global_batch=24, precision="bf16")
    assert params.dtype == np.float32
    assert relative_difference(losses, reference) <= DATA_PARALLEL_16_BIT, (losses[-3:], reference[-3:])
    assert replicas_identical(comm, params)
    sharded, sharded_params, _ = train_curve(comm, 30, global_batch=24, precision="bf16", zero=1)
    assert relative_difference(sharded, losses) <= DATA_PARALLEL_16_BIT
    assert replicas_identical(comm, sharded_params)


# ------------------------------------------------------------------ the app --

SMALL = ["--model", "large-mlp", "--depth", "2", "--width", "32", "--batch-size", "24", "--no-plot",
         "--eval-every", "5", "--warmup", "3"]


def run_app(tmp_path, n_ranks, *args, name="run", expect=0, timeout=120):
    summary = tmp_path / f"{name}.json"
    result = run_mpi(n_ranks, [sys.executable, "-m", "apps.train", "--quiet", "--output", str(tmp_path / name),
                               "--summary", str(summary), *args], timeout=timeout)
    assert result.returncode == expect, result.output
    return json.loads(summary.read_text()) if expect == 0 else result


def test_bf16_restart_is_bitwise(tmp_path, data_file):
    """bf16 + ZeRO-1 + dropout + accumulation on 2 ranks: restarted from the step-10 checkpoint
    (fp32 masters and moments; the bf16 copy is their rounding), the run reproduces the
    uninterrupted one bit for bit; the summary records the precision."""
    args = [*SMALL, "--dropout", "0.1", "--precision", "bf16", "--zero", "1", "--accum-steps", "2",
            "--data", data_file, "--steps", "20"]
    straight = run_app(tmp_path, 2, *args, "--checkpoint-every", "10", "--checkpoint-dir",
                       str(tmp_path / "ckpt"), name="straight")
    assert straight["precision"] == "bf16"
    assert straight["diagnostics"]["skipped_steps"] == 0
    restarted = run_app(tmp_path, 2, *args, "--restart", str(tmp_path / "ckpt" / "ckpt_000000010"),
                        "--checkpoint-dir", str(tmp_path / "unused"), name="restarted")
    assert restarted["first_step"] == 10 and restarted["steps"] == 10
    assert restarted["diagnostics"]["loss_curve"] == straight["diagnostics"]["loss_curve"]
    assert restarted["checksum"] == straight["checksum"]


@pytest.mark.parametrize("args, message", [
    (["--backend", "cupy", "--model", "large-mlp", "--width", "16", "--depth", "1", "--allreduce", "peer"],
     "on the GPU does not support --allreduce peer"),
    (["--backend", "cupy", "--model", "cnn"], "on the GPU does not support --model cnn"),
])
def test_bf16_refuses_what_it_cannot_do_on_every_rank(tmp_path, data_file, args, message):
    result = run_app(tmp_path, 2, "--precision", "bf16", "--data", data_file, "--steps", "2", "--no-plot",
                     "--batch-size", "24", *args, expect=2, timeout=60)
    assert result.output.count(message) == 1, result.output   # every rank raised it; printed once

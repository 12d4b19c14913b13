"""bf16 mixed precision on the GPU (``uint16`` CuPy arrays of bfloat16 bit patterns) against the CPU.

On the GPU machine (1 and 2 GPUs)::

    python -m pytest tests/apps/train/test_bf16_gpu.py -m gpu
"""

import ml_dtypes
import numpy as np
import pytest
from distributed_cases import gpu_arch_or_skip, relative_difference, train_curve

from apps.train.kernels.backend import to_float32
from apps.train.kernels.buffers import round_to_bfloat16, scaled_copy, sum_of_squares
from apps.train.kernels.gelu import gelu_backward, gelu_forward
from apps.train.kernels.gemm import gemm
from apps.train.kernels.layernorm import layer_norm_backward, layer_norm_forward
from apps.train.nn.loss import count_correct, softmax_cross_entropy
from apps.train.training.precision import bfloat16_bits

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
#: one bfloat16 rounding step (2**-8 relative) and a little more for the order of float32 sums
ONE_ULP = 2.0**-7


def to_device_bits(cupy, values):
    """float32 host values -> bfloat16 bit patterns on the device (rounded on the host)."""
    return cupy.asarray(np.asarray(values, np.float32).astype(BF16).view(np.uint16))


def host_bf16(cupy, bits):
    """Device bit patterns -> ml_dtypes.bfloat16 host array."""
    return cupy.asnumpy(bits).view(BF16)


def test_device_rounding_equals_ml_dtypes(cupy, rng):
    bits = rng.integers(0, 2**32, 500_000, dtype=np.uint64).astype(np.uint32)
    bits[:6] = [0x3F808000, 0x3F818000, 0x007FFFFF, 0x7F7FFFFF, 0x7FC00001, 0xFF800001]
    values = bits.view(np.float32)
    target = cupy.empty(values.shape, dtype=cupy.uint16)
    round_to_bfloat16(cupy.asarray(values), target)
    with np.errstate(invalid="ignore"):
        expected = values.astype(BF16).view(np.uint16)
    assert np.array_equal(cupy.asnumpy(target), expected)
    assert np.array_equal(cupy.asnumpy(target), bfloat16_bits(values))
    widened = cupy.asnumpy(to_float32(target))
    finite = np.isfinite(widened)
    assert np.array_equal(widened[finite], expected.view(BF16).astype(np.float32)[finite])
    copy = cupy.empty(values.shape, dtype=cupy.float32)
    scaled_copy(target, copy, 1.0)
    assert np.array_equal(cupy.asnumpy(copy)[finite], widened[finite])


@pytest.mark.parametrize("transpose_a, transpose_b, accumulate", [
    (False, False, False), (False, True, False), (True, False, True), (False, True, True)])
def test_bf16_gemm_against_float32(cupy, rng, transpose_a, transpose_b, accumulate):
    """cuBLAS CUDA_R_16BF / COMPUTE_32F: the float32 product of the bf16 inputs, rounded once."""
    rows, inner, columns = 257, 1000, 129
    a = rng.standard_normal((inner, rows) if transpose_a else (rows, inner)).astype(BF16)
    b = rng.standard_normal((columns, inner) if transpose_b else (inner, columns)).astype(BF16)
    out = rng.standard_normal((rows, columns)).astype(BF16)
    op_a = a.astype(np.float32).T if transpose_a else a.astype(np.float32)
    op_b = b.astype(np.float32).T if transpose_b else b.astype(np.float32)
    reference = op_a.astype(np.float64) @ op_b.astype(np.float64)
    if accumulate:
        reference += out.astype(np.float64)
    device_out = to_device_bits(cupy, out.astype(np.float32))
    gemm(to_device_bits(cupy, a.astype(np.float32)), to_device_bits(cupy, b.astype(np.float32)), device_out,
         transpose_a=transpose_a, transpose_b=transpose_b, accumulate=accumulate)
    result = host_bf16(cupy, device_out).astype(np.float64)
    # one rounding to bfloat16 (unit roundoff 2**-8) plus float32 accumulation (~1e-6 x sqrt(inner))
    slack = 1e-5 * np.sqrt(inner)
    assert np.all(np.abs(result - reference) <= 2.0**-8 * np.abs(reference) + slack)
    # and the CPU bf16 gemm (float32, rounded once) agrees to one bfloat16 step
    cpu_out = out.copy()
    gemm(a, b, cpu_out, transpose_a=transpose_a, transpose_b=transpose_b, accumulate=accumulate)
    assert np.all(np.abs(result - cpu_out.astype(np.float64)) <= ONE_ULP * np.abs(reference) + slack)


def test_bf16_kernels_match_the_cpu(cupy, rng):
    """GELU (with a folded bias), LayerNorm (+ GELU) forward and backward, softmax cross-entropy."""
    x = rng.standard_normal((64, 96)).astype(BF16)
    bias, weight, shift = (rng.standard_normal(96).astype(BF16) for _ in range(3))
    grad = rng.standard_normal((64, 96)).astype(BF16)
    d = {name: to_device_bits(cupy, value.astype(np.float32))
         for name, value in (("x", x), ("bias", bias), ("weight", weight), ("shift", shift), ("grad", grad))}

    def close(device_bits, host_value, tolerance=ONE_ULP):
        got = host_bf16(cupy, device_bits).astype(np.float32)
        want = np.asarray(host_value).astype(np.float32)
        assert np.max(np.abs(got - want)) <= tolerance * max(1.0, np.max(np.abs(want)))

    close(gelu_forward(d["x"], d["bias"]), gelu_forward(x, bias))
    close(gelu_backward(d["x"], d["grad"], d["bias"]), gelu_backward(x, grad, bias))
    for activation in (None, "gelu"):
        y, mean, inverse_std = layer_norm_forward(d["x"], d["weight"], d["shift"], 1e-5, d["bias"], activation)
        y_cpu, mean_cpu, inverse_std_cpu = layer_norm_forward(x, weight, shift, 1e-5, bias, activation)
        close(y, y_cpu)
        assert np.allclose(cupy.asnumpy(mean).reshape(-1), mean_cpu.reshape(-1), atol=1e-5)
        grad_weight, grad_shift = cupy.zeros(96, cupy.uint16), cupy.zeros(96, cupy.uint16)
        grad_weight_cpu, grad_shift_cpu = np.zeros(96, BF16), np.zeros(96, BF16)
        grad_input = layer_norm_backward(d["grad"], d["x"], mean, inverse_std, d["weight"], grad_weight,
                                         grad_shift, d["bias"], d["shift"], activation)
        grad_input_cpu = layer_norm_backward(grad, x, mean_cpu, inverse_std_cpu, weight, grad_weight_cpu,
                                             grad_shift_cpu, bias, shift, activation)
        close(grad_input, grad_input_cpu, 4 * ONE_ULP)
        close(grad_weight, grad_weight_cpu, 2 * ONE_ULP)
        close(grad_shift, grad_shift_cpu, 2 * ONE_ULP)
    labels = rng.integers(0, 96, 64)
    loss, grad_logits = softmax_cross_entropy(d["x"], cupy.asarray(labels), 128)
    loss_cpu, grad_logits_cpu = softmax_cross_entropy(x, labels, 128)
    assert abs(float(loss) - float(loss_cpu)) <= 1e-5 * abs(float(loss_cpu))
    close(grad_logits, grad_logits_cpu)
    assert count_correct(d["x"], cupy.asarray(labels)) == count_correct(x, labels)
    assert sum_of_squares(d["grad"].reshape(-1)) == pytest.approx(float(np.sum(grad.astype(np.float64) ** 2)), rel=1e-6)


@pytest.mark.mpi(ranks=[1, 2])
def test_gpu_bf16_training_matches_cpu_bf16(comm):
    """LayerNorm + GELU + dropout MLP, 30 steps: the GPU bf16 curve (NCCL allreduce in float32 on
    2 GPUs) follows the CPU bf16 one and the fp32 one within the 16-bit tolerance of the fp16 tests."""
    arch = gpu_arch_or_skip(comm)
    reference, reference_params, _ = train_curve(None, 30, global_batch=24, precision="bf16")
    losses, params, _ = train_curve(comm, 30, global_batch=24, precision="bf16", arch=arch)
    assert params.dtype == np.float32 and np.all(np.isfinite(params))
    assert relative_difference(losses, reference) <= 2e-2, (losses[-3:], reference[-3:])
    fp32, _, _ = train_curve(comm, 30, global_batch=24, arch=arch)
    assert relative_difference(losses, fp32) <= 2e-2
    accumulated, _, _ = train_curve(comm, 30, global_batch=24, precision="bf16", accum_steps=2, arch=arch)
    assert relative_difference(accumulated, reference) <= 2e-2


def test_gpu_bf16_relu_mlp_matches_cpu_bf16(cupy, rng):
    """The MNIST-1D MLP (ReLU, bias added after each product): 20 steps, GPU bf16 vs CPU bf16."""
    from apps.train.nn.models import mnist1d_mlp
    from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step

    x = rng.standard_normal((64, 40)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    curves = {}
    for xp in (np, cupy):
        trainer = Trainer(mnist1d_mlp(), TrainConfig(lr=1e-2, global_batch_size=64, precision="bf16", seed=4))
        state = init_train_state(trainer, xp)
        curves[xp.__name__] = np.array([
            train_step(trainer, state, xp.asarray(x), xp.asarray(y), xp.arange(64)).loss for _ in range(20)])
    assert curves["cupy"][-1] < 0.8 * curves["cupy"][0]
    assert np.max(np.abs(curves["cupy"] - curves["numpy"])) <= 2e-2 * curves["numpy"][0]


def test_gpu_bf16_app_restart_is_bitwise(tmp_path, cupy):
    """One GPU, bf16 + dropout + accumulation: a restart from the step-6 checkpoint reproduces the
    uninterrupted run bit for bit; --model cnn is refused with one message."""
    import json
    import subprocess
    import sys

    import h5py

    rng = np.random.default_rng(0)
    projections = rng.standard_normal((12, 4))
    data = tmp_path / "small.h5"
    with h5py.File(data, "w") as handle:
        for prefix, count in (("", 240), ("_test", 60)):
            x = rng.standard_normal((count, 12)).astype(np.float32)
            handle[f"x{prefix}"], handle[f"y{prefix}"] = x, np.argmax(x @ projections, axis=1)
    args = ["--model", "large-mlp", "--depth", "2", "--width", "32", "--batch-size", "24", "--no-plot",
            "--eval-every", "4", "--warmup", "3", "--dropout", "0.1", "--accum-steps", "2", "--precision",
            "bf16", "--backend", "cupy", "--data", str(data), "--steps", "12", "--quiet"]

    def run(name, *extra, expect=0):
        result = subprocess.run([sys.executable, "-m", "apps.train", *args, "--output", str(tmp_path / name),
                                 "--summary", str(tmp_path / f"{name}.json"), *extra],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == expect, result.stdout + result.stderr
        return json.loads((tmp_path / f"{name}.json").read_text()) if expect == 0 else result

    straight = run("straight", "--checkpoint-every", "6", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert straight["precision"] == "bf16" and straight["backend"] == "gpu"
    restarted = run("restarted", "--restart", str(tmp_path / "ckpt" / "ckpt_000000006"),
                    "--checkpoint-dir", str(tmp_path / "unused"))
    assert restarted["diagnostics"]["loss_curve"] == straight["diagnostics"]["loss_curve"]
    assert restarted["checksum"] == straight["checksum"]
    refused = run("cnn", "--model", "cnn", expect=2)
    assert (refused.stdout + refused.stderr).count("does not support --model cnn") == 1

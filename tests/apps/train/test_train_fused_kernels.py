"""Fused kernels of the second GPU round: mixed-precision AdamW, softmax cross-entropy,
bias folded into GELU / LayerNorm, vectorised GELU.

Each test runs on NumPy (the CPU path) and, marked ``gpu``, on CuPy::

    python -m pytest tests/apps/train/test_train_fused_kernels.py -m gpu

References: the unfused NumPy formulation (bias added by a separate pass, unscale
copy + AdamW + cast, softmax from log-probabilities) in float64 or in the CPU
path's own arithmetic. GPU AdamW computes float32 buffers in float32 (as PyTorch's
fused AdamW) while the CPU reference computes in float64: parity to ~1e-6.
"""

import numpy as np
import pytest

from apps.train.kernels.gelu import gelu_backward, gelu_forward
from apps.train.kernels.layernorm import layer_norm_backward, layer_norm_forward
from apps.train.nn.loss import softmax_cross_entropy
from apps.train.nn.models import large_mlp
from apps.train.kernels.optimizer_updates import adamw_update, adamw_update_mixed
from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step


def host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def max_relative_error(result, reference):
    result = host(result).astype(np.float64)
    scale = max(1e-30, float(np.max(np.abs(reference))))
    return float(np.max(np.abs(result - reference))) / scale


ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)


def test_adamw_mixed_equals_unscale_step_and_cast(xp):
    rng = np.random.default_rng(0)
    n = 10_001                       # odd: no size assumption in the kernels
    master = rng.standard_normal(n).astype(np.float32)
    scale = 2.0**12
    grads16 = [(rng.standard_normal(n) * scale * 1e-2).astype(np.float16) for _ in range(3)]
    # reference: the unfused CPU path (float32 unscale copy, float64 AdamW, float16 cast)
    ref_params = master.copy()
    ref_m, ref_v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    params, copy16 = xp.asarray(master), xp.zeros(n, dtype=xp.float16)
    m, v = xp.zeros(n, dtype=xp.float32), xp.zeros(n, dtype=xp.float32)
    for step, g in enumerate(grads16, start=1):
        unscaled = g.astype(np.float32) * np.float32(1.0 / scale)
        adamw_update(ref_params, unscaled, ref_m, ref_v, step=step, grad_scale=0.5, **ADAMW)
        adamw_update_mixed(params, xp.asarray(g), m, v, copy16, step=step,
                           inverse_loss_scale=1.0 / scale, grad_scale=0.5, **ADAMW)
    tolerance = 0.0 if xp is np else 2e-6    # GPU: float32 arithmetic
    assert max_relative_error(params, ref_params.astype(np.float64)) <= tolerance
    assert max_relative_error(m, ref_m.astype(np.float64)) <= max(tolerance, 0.0)
    assert max_relative_error(v, ref_v.astype(np.float64)) <= max(tolerance, 0.0) * 4
    # the float16 copy is exactly the rounded masters of this very step
    assert np.array_equal(host(copy16), host(params).astype(np.float16))


@pytest.mark.parametrize("mixed", [False, True])
def test_adamw_views_at_any_offset_give_the_same_bits(xp, mixed):
    """The GPU kernel moves 4 elements per access when every buffer is aligned for it and one at a
    time otherwise (views of a flat buffer, ZeRO shards); the arithmetic per element is the same,
    so both give the same bits, for a length that is not a multiple of 4."""
    rng = np.random.default_rng(2)
    n = 4099
    values = {name: rng.standard_normal(n).astype(np.float32) for name in ("params", "m", "v", "g")}
    values["v"] = np.abs(values["v"])
    results = []
    for offset in (0, 1):
        def placed(array, dtype=np.float32):
            buffer = xp.zeros(n + offset, dtype=dtype)
            buffer[offset:] = xp.asarray(array.astype(dtype))
            return buffer[offset:]
        params, m, v = placed(values["params"]), placed(values["m"]), placed(values["v"])
        if mixed:
            copy16 = placed(np.zeros(n), np.float16)
            adamw_update_mixed(params, placed(values["g"], np.float16), m, v, copy16, step=3,
                               inverse_loss_scale=0.5, grad_scale=0.7, **ADAMW)
            results.append([host(a) for a in (params, m, v, copy16)])
        else:
            adamw_update(params, placed(values["g"]), m, v, step=3, grad_scale=0.7, **ADAMW)
            results.append([host(a) for a in (params, m, v)])
    for aligned, shifted in zip(*results):
        assert np.array_equal(aligned, shifted)


def test_adamw_float32_gpu_math_close_to_float64_reference(xp):
    rng = np.random.default_rng(1)
    params = rng.standard_normal(4099).astype(np.float32)
    reference = params.copy()
    ref_state = [np.zeros_like(params), np.zeros_like(params)]
    device = xp.asarray(params)
    state = [xp.zeros_like(device), xp.zeros_like(device)]
    for step in range(1, 4):
        g = rng.standard_normal(params.size).astype(np.float32)
        adamw_update(reference, g, *ref_state, step=step, grad_scale=0.7, **ADAMW)
        adamw_update(device, xp.asarray(g), *state, step=step, grad_scale=0.7, **ADAMW)
    assert max_relative_error(device, reference.astype(np.float64)) <= (0.0 if xp is np else 1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_softmax_cross_entropy_matches_float64_reference(xp, dtype):
    rng = np.random.default_rng(2)
    batch, n_classes, global_batch = 37, 1000, 100
    logits = (3 * rng.standard_normal((batch, n_classes))).astype(dtype)
    labels = rng.integers(0, n_classes, size=batch)
    loss, grad = softmax_cross_entropy(xp.asarray(logits), xp.asarray(labels), global_batch,
                                       grad_scale=8.0)
    x = logits.astype(np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected_loss = -log_probs[np.arange(batch), labels].sum() / global_batch
    expected_grad = np.exp(log_probs)
    expected_grad[np.arange(batch), labels] -= 1.0
    expected_grad *= 8.0 / global_batch
    tolerance = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
    assert grad.dtype == dtype and grad.shape == logits.shape
    assert abs(float(loss) - expected_loss) <= tolerance * abs(expected_loss)
    assert max_relative_error(grad, expected_grad) <= tolerance


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("offset", [0, 1])   # 1: misaligned views take the scalar path
def test_gelu_with_folded_bias_equals_separate_bias_pass(xp, dtype, offset):
    rng = np.random.default_rng(3)
    n_cols = 64
    flat = rng.standard_normal(9 * n_cols + offset).astype(dtype)
    bias = rng.standard_normal(n_cols).astype(dtype)
    grad = rng.standard_normal((9, n_cols)).astype(dtype)
    x_host = flat[offset:].reshape(9, n_cols)
    x = xp.asarray(flat)[offset:].reshape(9, n_cols)
    biased = (x_host + bias).astype(np.float64)          # the separate pass, rounded to dtype
    t = np.tanh(np.sqrt(2 / np.pi) * (biased + 0.044715 * biased**3))
    expected = 0.5 * biased * (1 + t)
    derivative = (0.5 * (1 + t) + 0.5 * biased * (1 - t * t) * np.sqrt(2 / np.pi)
                  * (1 + 3 * 0.044715 * biased**2))
    tolerance = {np.float16: 3e-3 if xp is not np else 1.5e-2, np.float32: 2e-6,
                 np.float64: 1e-13}[dtype]
    y = gelu_forward(x, xp.asarray(bias))
    grad_in = gelu_backward(x, xp.asarray(grad), xp.asarray(bias))
    assert y.dtype == dtype and grad_in.dtype == dtype
    assert max_relative_error(y, expected) <= tolerance
    assert max_relative_error(grad_in, grad.astype(np.float64) * derivative) <= tolerance
    # and without a bias, odd sizes (vector body + scalar tail)
    odd = rng.standard_normal(1003).astype(dtype)
    plain = odd.astype(np.float64)
    t = np.tanh(np.sqrt(2 / np.pi) * (plain + 0.044715 * plain**3))
    assert max_relative_error(gelu_forward(xp.asarray(odd)), 0.5 * plain * (1 + t)) <= tolerance


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_layer_norm_with_input_bias_equals_layer_norm_of_the_sum(xp, dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((70, 96)).astype(dtype)
    input_bias = rng.standard_normal(96).astype(dtype)
    weight = (1 + 0.1 * rng.standard_normal(96)).astype(dtype)
    bias = (0.1 * rng.standard_normal(96)).astype(dtype)
    grad = rng.standard_normal((70, 96)).astype(dtype)
    summed = x + input_bias                                  # rounded to dtype, as a bias pass
    d = {name: xp.asarray(value) for name, value in
         dict(x=x, input_bias=input_bias, weight=weight, bias=bias, grad=grad,
              summed=summed).items()}
    y, mean, inverse_std = layer_norm_forward(d["x"], d["weight"], d["bias"], 1e-5, d["input_bias"])
    y_ref, mean_ref, inverse_std_ref = layer_norm_forward(d["summed"], d["weight"], d["bias"], 1e-5)
    grad_w, grad_b = xp.zeros(96, dtype=dtype), xp.zeros(96, dtype=dtype)
    grad_w_ref, grad_b_ref = xp.zeros(96, dtype=dtype), xp.zeros(96, dtype=dtype)
    grad_x = layer_norm_backward(d["grad"], d["x"], mean, inverse_std, d["weight"], grad_w, grad_b,
                                 d["input_bias"])
    grad_x_ref = layer_norm_backward(d["grad"], d["summed"], mean_ref, inverse_std_ref, d["weight"],
                                     grad_w_ref, grad_b_ref)
    # the same kernels on the same rounded sums: bitwise equal
    for result, reference in ((y, y_ref), (mean, mean_ref), (inverse_std, inverse_std_ref),
                              (grad_x, grad_x_ref), (grad_w, grad_w_ref), (grad_b, grad_b_ref)):
        assert np.array_equal(host(result), host(reference))


def test_fused_mixed_step_skips_exactly_on_overflow(xp):
    """fp16 train step through the fused path: an inf skips the step with nothing
    written; a clean step changes the masters and refreshes the float16 copy."""
    rng = np.random.default_rng(5)
    config = TrainConfig(optimizer="adamw", lr=1e-3, precision="fp16", global_batch_size=16,
                         init_loss_scale=2.0**10, seed=3)
    trainer = Trainer(large_mlp(40, 10, depth=2, width=32), config)
    state = init_train_state(trainer, xp)
    x = rng.standard_normal((16, 40)).astype(np.float32)
    y = rng.integers(0, 10, size=16)
    index = xp.arange(16, dtype=xp.int64)
    before = host(state.precision.master_params).copy()
    poisoned = x.copy()
    poisoned[2, 7] = np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        metrics = train_step(trainer, state, xp.asarray(poisoned), xp.asarray(y), index)
    assert not metrics.applied and state.precision.loss_scale == 2.0**9
    assert np.array_equal(host(state.precision.master_params), before)
    assert int(state.optimizer_state["step"]) == 0
    assert float(host(state.optimizer_state["exp_avg"]).max()) == 0.0
    metrics = train_step(trainer, state, xp.asarray(x), xp.asarray(y), index)
    assert metrics.applied and np.isfinite(metrics.loss) and np.isfinite(metrics.grad_norm)
    params = host(state.precision.master_params)
    assert np.max(np.abs(params - before)) > 1e-4
    assert np.array_equal(host(state.precision.compute_params), params.astype(np.float16))


# ------------------------------------------------------------- LayerNorm + GELU --

def _layer_norm_gelu_inputs(xp, dtype, shape, offset, seed=6):
    """x, grad (views starting ``offset`` elements into their buffers: 1 takes the
    one-value-at-a-time path), weight, bias, input bias."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))

    def placed(values):
        buffer = xp.zeros(n + offset, dtype=dtype)
        buffer[offset:] = xp.asarray(values.reshape(-1).astype(dtype))
        return buffer[offset:].reshape(shape)

    x = placed(1.0 + 2.0 * rng.standard_normal(shape))
    grad = placed(rng.standard_normal(shape))
    n_cols = shape[-1]
    weight = xp.asarray((1.0 + 0.5 * rng.standard_normal(n_cols)).astype(dtype))
    bias = xp.asarray((0.3 * rng.standard_normal(n_cols)).astype(dtype))
    input_bias = xp.asarray((0.2 * rng.standard_normal(n_cols)).astype(dtype))
    return x, grad, weight, bias, input_bias


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape,offset", [((70, 96), 0), ((70, 96), 1), ((33, 4096), 0),
                                          ((5, 250), 0), ((3, 20000), 0)])
def test_layer_norm_gelu_equals_the_separate_kernels(xp, dtype, shape, offset):
    """activation="gelu" gives bitwise what the separate GELU kernels compute from the
    stored LayerNorm output, in both directions, for every kernel path: rows in registers
    (16-byte packs, or one value at a time for a misaligned view or a row length that is
    not a multiple of the pack) and the any-length kernels (20,000 features)."""
    x, grad, weight, bias, input_bias = _layer_norm_gelu_inputs(xp, dtype, shape, offset)
    n_cols = shape[-1]
    fused, mean, inverse_std = layer_norm_forward(x, weight, bias, 1e-5, input_bias, "gelu")
    y, mean_ref, inverse_std_ref = layer_norm_forward(x, weight, bias, 1e-5, input_bias)
    assert fused.dtype == dtype and fused.shape == shape
    assert np.array_equal(host(fused), host(gelu_forward(y)))
    assert np.array_equal(host(mean), host(mean_ref))
    assert np.array_equal(host(inverse_std), host(inverse_std_ref))

    grad_w, grad_b = xp.ones(n_cols, dtype=dtype), xp.ones(n_cols, dtype=dtype)
    grad_w_ref, grad_b_ref = xp.ones(n_cols, dtype=dtype), xp.ones(n_cols, dtype=dtype)
    grad_x = layer_norm_backward(grad, x, mean, inverse_std, weight, grad_w, grad_b, input_bias,
                                 bias, "gelu")
    grad_x_ref = layer_norm_backward(gelu_backward(y, grad), x, mean, inverse_std, weight,
                                     grad_w_ref, grad_b_ref, input_bias)
    for result, reference in ((grad_x, grad_x_ref), (grad_w, grad_w_ref), (grad_b, grad_b_ref)):
        assert np.array_equal(host(result), host(reference))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,offset", [((70, 96), 0), ((70, 96), 1), ((300, 4096), 0),
                                          ((3, 20000), 0)])
def test_layer_norm_gelu_matches_float64_reference(xp, dtype, shape, offset):
    """Fused LayerNorm + GELU against a float64 NumPy formulation: output, input
    gradient and accumulated parameter gradients."""
    x, grad, weight, bias, input_bias = _layer_norm_gelu_inputs(xp, dtype, shape, offset)
    g64, w64, b64 = (host(a).astype(np.float64) for a in (grad, weight, bias))
    summed = (host(x) + host(input_bias)).astype(np.float64)      # the sum rounded to dtype
    mean = summed.mean(-1, keepdims=True)
    inverse_std = 1 / np.sqrt(((summed - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    x_hat = (summed - mean) * inverse_std
    y = x_hat * w64 + b64
    t = np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3))
    out_ref = 0.5 * y * (1 + t)
    grad_y = g64 * (0.5 * (1 + t) + 0.5 * y * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * y * y))
    gh = grad_y * w64
    grad_x_ref = inverse_std * (gh - gh.mean(-1, keepdims=True) - x_hat * (gh * x_hat).mean(-1, keepdims=True))
    rows = int(np.prod(shape[:-1]))
    tolerance = 1e-11 if dtype == np.float64 else 3e-5

    out, m, s = layer_norm_forward(x, weight, bias, 1e-5, input_bias, "gelu")
    n_cols = shape[-1]
    grad_w, grad_b = xp.zeros(n_cols, dtype=dtype), xp.zeros(n_cols, dtype=dtype)
    grad_x = layer_norm_backward(grad, x, m, s, weight, grad_w, grad_b, input_bias, bias, "gelu")
    assert max_relative_error(out, out_ref) <= tolerance
    assert max_relative_error(grad_x, grad_x_ref) <= tolerance
    assert max_relative_error(grad_w, (grad_y * x_hat).sum(0)) <= tolerance * np.sqrt(rows)
    assert max_relative_error(grad_b, grad_y.sum(0)) <= tolerance * np.sqrt(rows)


def test_layer_norm_rejects_unknown_activation(xp):
    x = xp.zeros((2, 8), dtype=xp.float32)
    ones = xp.ones(8, dtype=xp.float32)
    with pytest.raises(ValueError, match="activation must be one of"):
        layer_norm_forward(x, ones, ones, 1e-5, activation="relu")

"""GELU, LayerNorm, GEMM and whole-buffer kernels against float64 NumPy references.

Every test runs on NumPy (the CPU path) and, marked ``gpu``, on CuPy (the fused
ElementwiseKernels / RawKernels / cuBLAS calls)::

    python -m pytest tests/apps/train/test_train_layer_kernels.py -m gpu

The references are computed in float64 from the (rounded) inputs; tolerances are
relative to the size of the result: float64 1e-12, float32 ~1e-5, float16 a few
float16 ulps (the GPU kernels compute float16 in float32 and round once; the NumPy
CPU path rounds every intermediate to float16, hence its looser bound).
"""

import numpy as np
import pytest

from apps.train.kernels.buffers import scaled_copy, sum_of_squares
from apps.train.kernels.gelu import gelu_backward, gelu_forward
from apps.train.kernels.gemm import gemm
from apps.train.kernels.layernorm import layer_norm_backward, layer_norm_forward
from apps.train.nn.layers import ForwardContext, Linear
from apps.train.nn.models import large_mlp


def host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def tolerance(dtype, xp):
    if dtype == np.float64:
        return 1e-12
    if dtype == np.float32:
        return 2e-5
    return 3e-3 if xp is not np else 1.5e-2


def assert_close(result, reference, tol, what=""):
    result = host(result).astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(reference))))
    error = float(np.max(np.abs(result - reference))) if reference.size else 0.0
    assert error <= tol * scale, f"{what}: max error {error:.3e} > {tol:.1e} x {scale:.3g}"


# ---------------------------------------------------------------- references --

def gelu_reference(x):
    inner = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
    return 0.5 * x * (1.0 + np.tanh(inner))


def gelu_derivative_reference(x):
    t = np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * np.sqrt(2.0 / np.pi) * (1 + 3 * 0.044715 * x * x)


def layer_norm_reference(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    inverse_std = 1.0 / np.sqrt(variance + eps)
    x_hat = (x - mean) * inverse_std
    return x_hat * weight + bias, mean, inverse_std


def layer_norm_backward_reference(grad_out, x, weight, eps):
    _, mean, inverse_std = layer_norm_reference(x, weight, 0.0, eps)
    x_hat = (x - mean) * inverse_std
    g = grad_out * weight
    n = x.shape[-1]
    grad_input = inverse_std / n * (n * g - g.sum(-1, keepdims=True)
                                    - x_hat * (g * x_hat).sum(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return grad_input, (grad_out * x_hat).sum(axis=axes), grad_out.sum(axis=axes)


DTYPES = [np.float16, np.float32, np.float64]


# --------------------------------------------------------------------- GELU --

@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_forward_and_backward(xp, rng, dtype):
    x = (3.0 * rng.standard_normal((37, 129))).astype(dtype)
    grad_out = rng.standard_normal(x.shape).astype(dtype)
    x64, grad64 = x.astype(np.float64), grad_out.astype(np.float64)
    y = gelu_forward(xp.asarray(x))
    grad_in = gelu_backward(xp.asarray(x), xp.asarray(grad_out))
    assert y.dtype == dtype and grad_in.dtype == dtype and y.shape == x.shape
    assert_close(y, gelu_reference(x64), tolerance(dtype, xp), "gelu forward")
    assert_close(grad_in, grad64 * gelu_derivative_reference(x64), tolerance(dtype, xp),
                 "gelu backward")


def test_gelu_rejects_mismatched_shapes(xp):
    with pytest.raises(ValueError, match="shape"):
        gelu_backward(xp.zeros((3, 4), dtype=xp.float32), xp.zeros((4, 3), dtype=xp.float32))


# ---------------------------------------------------------------- LayerNorm --

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(70, 100), (3, 5, 1000), (9, 4096)])
def test_layer_norm_forward(xp, rng, dtype, shape):
    x = (2.0 + 3.0 * rng.standard_normal(shape)).astype(dtype)   # offset: tests the centring
    weight = (1.0 + 0.5 * rng.standard_normal(shape[-1])).astype(dtype)
    bias = rng.standard_normal(shape[-1]).astype(dtype)
    y, mean, inverse_std = layer_norm_forward(xp.asarray(x), xp.asarray(weight),
                                              xp.asarray(bias), 1e-5)
    reference, reference_mean, reference_inverse_std = layer_norm_reference(
        x.astype(np.float64), weight.astype(np.float64), bias.astype(np.float64), 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    assert mean.shape == inverse_std.shape == shape[:-1] + (1,)
    assert mean.dtype == (np.float64 if dtype == np.float64 else np.float32)
    statistics_tolerance = 1e-12 if dtype == np.float64 else 1e-5
    assert_close(y, reference, tolerance(dtype, xp), "y")
    assert_close(mean, reference_mean, statistics_tolerance, "mean")
    assert_close(host(inverse_std) / reference_inverse_std, np.ones_like(reference_inverse_std),
                 statistics_tolerance, "inverse_std")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(70, 100), (3, 5, 1000), (130, 4096)])
def test_layer_norm_backward_accumulates(xp, rng, dtype, shape):
    x = (1.0 + 2.0 * rng.standard_normal(shape)).astype(dtype)
    weight = (1.0 + 0.5 * rng.standard_normal(shape[-1])).astype(dtype)
    bias = rng.standard_normal(shape[-1]).astype(dtype)
    grad_out = rng.standard_normal(shape).astype(dtype)
    initial_weight_grad = rng.standard_normal(shape[-1]).astype(dtype)
    initial_bias_grad = rng.standard_normal(shape[-1]).astype(dtype)
    grad_weight, grad_bias = xp.array(initial_weight_grad), xp.array(initial_bias_grad)
    _, mean, inverse_std = layer_norm_forward(xp.asarray(x), xp.asarray(weight), xp.asarray(bias),
                                              1e-5)
    grad_input = layer_norm_backward(xp.asarray(grad_out), xp.asarray(x), mean, inverse_std,
                                     xp.asarray(weight), grad_weight, grad_bias)
    reference_input, reference_weight, reference_bias = layer_norm_backward_reference(
        grad_out.astype(np.float64), x.astype(np.float64), weight.astype(np.float64), 1e-5)
    tol = tolerance(dtype, xp)
    assert grad_input.dtype == dtype and grad_input.shape == shape
    assert_close(grad_input, reference_input, tol, "grad_input")
    # the parameter gradients are sums over rows: compare relative to their size
    rows = int(np.prod(shape[:-1]))
    assert_close(grad_weight, initial_weight_grad + reference_weight, tol * np.sqrt(rows),
                 "grad_weight")
    assert_close(grad_bias, initial_bias_grad + reference_bias, tol * np.sqrt(rows), "grad_bias")


def test_layer_norm_backward_is_deterministic(xp, rng):
    x = xp.asarray(rng.standard_normal((300, 257)).astype(np.float32))
    grad_out = xp.asarray(rng.standard_normal((300, 257)).astype(np.float32))
    weight = xp.asarray(rng.standard_normal(257).astype(np.float32))
    _, mean, inverse_std = layer_norm_forward(x, weight, weight, 1e-5)
    results = []
    for _ in range(2):
        grad_weight, grad_bias = xp.zeros(257, xp.float32), xp.zeros(257, xp.float32)
        grad_input = layer_norm_backward(grad_out, x, mean, inverse_std, weight, grad_weight,
                                         grad_bias)
        results.append([host(a) for a in (grad_input, grad_weight, grad_bias)])
    for first, second in zip(*results):
        assert np.array_equal(first, second)


def test_layer_norm_rejects_bad_parameters(xp):
    x = xp.zeros((4, 8), dtype=xp.float32)
    with pytest.raises(ValueError, match=r"expected \(8,\)"):
        layer_norm_forward(x, xp.ones(7, dtype=xp.float32), xp.zeros(8, dtype=xp.float32), 1e-5)


# --------------------------------------------------------------------- GEMM --

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (False, True),
                                                     (True, False), (True, True)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm(xp, rng, dtype, transpose_a, transpose_b, accumulate):
    rows, inner, columns = 33, 70, 45
    a = rng.standard_normal((inner, rows) if transpose_a else (rows, inner)).astype(dtype)
    b = rng.standard_normal((columns, inner) if transpose_b else (inner, columns)).astype(dtype)
    initial = rng.standard_normal((rows, columns)).astype(dtype)
    out = xp.array(initial)   # a copy: NumPy asarray would alias it
    gemm(xp.asarray(a), xp.asarray(b), out, transpose_a=transpose_a, transpose_b=transpose_b,
         accumulate=accumulate)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    reference = (a64.T if transpose_a else a64) @ (b64.T if transpose_b else b64)
    if accumulate:
        reference += initial
    assert out.dtype == dtype
    # sums of `inner` products: relative to sqrt(inner) x the element scale
    assert_close(out, reference, tolerance(dtype, xp) * np.sqrt(inner), "gemm")


def test_gemm_writes_into_a_view_of_a_flat_buffer(xp, rng):
    flat = xp.zeros(10 + 6 * 4, dtype=xp.float32)
    view = flat[10:].reshape(6, 4)
    a, b = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    gemm(xp.asarray(a), xp.asarray(b), view, transpose_a=True, accumulate=True)
    gemm(xp.asarray(a), xp.asarray(b), view, transpose_a=True, accumulate=True)
    assert_close(flat[10:].reshape(6, 4), 2 * a.T.astype(np.float64) @ b, 1e-5, "view")
    assert float(abs(flat[:10]).sum()) == 0.0


def test_gemm_rejects_mismatches(xp):
    a = xp.zeros((3, 4), dtype=xp.float32)
    with pytest.raises(ValueError, match="inner sizes"):
        gemm(a, xp.zeros((5, 2), dtype=xp.float32), xp.zeros((3, 2), dtype=xp.float32))
    with pytest.raises(TypeError, match="dtypes"):
        gemm(a, xp.zeros((4, 2), dtype=xp.float64), xp.zeros((3, 2), dtype=xp.float32))


# ------------------------------------------------------------ Linear on top --

@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_layer_gradients(xp, rng, dtype):
    from apps.train.nn.params import init_flat_parameters
    from apps.train.nn.sequential import Sequential

    model = Sequential([Linear(24, 40)])
    params = xp.asarray(init_flat_parameters(model.layout, 3, "float64").astype(dtype))
    grads = xp.asarray(rng.standard_normal(model.n_params).astype(dtype))
    initial_grads = host(grads).astype(np.float64)
    model.bind(params, grads)
    x = rng.standard_normal((2, 9, 24)).astype(dtype)
    grad_out = rng.standard_normal((2, 9, 40)).astype(dtype)
    layer = model.layers[0]
    y = layer.forward(xp.asarray(x), ForwardContext())
    grad_input = layer.backward(xp.asarray(grad_out))
    weight = host(layer.params["weight"]).astype(np.float64)
    bias = host(layer.params["bias"]).astype(np.float64)
    x64, g64 = x.astype(np.float64).reshape(-1, 24), grad_out.astype(np.float64).reshape(-1, 40)
    tol = tolerance(dtype, xp) * np.sqrt(24)
    assert y.shape == (2, 9, 40) and y.dtype == dtype
    assert_close(y, (x64 @ weight.T + bias).reshape(2, 9, 40), tol, "forward")
    assert_close(grad_input, (g64 @ weight).reshape(x.shape), tol, "grad_input")
    views = model.layout.views(initial_grads)
    expected_weight = views[layer.name]["weight"] + g64.T @ x64
    expected_bias = views[layer.name]["bias"] + g64.sum(axis=0)
    assert_close(layer.grads["weight"], expected_weight, tol * 4, "grad_weight")
    assert_close(layer.grads["bias"], expected_bias, tol * 4, "grad_bias")
    # the first layer of a model may skip the data gradient; the parameter gradients still add up
    before = host(grads).astype(np.float64)
    assert layer.backward(xp.asarray(grad_out), need_input_grad=False) is None
    increment = model.layout.views(host(grads).astype(np.float64) - before)[layer.name]
    assert_close(increment["weight"], g64.T @ x64, tol * 4, "grad_weight increment")
    assert_close(increment["bias"], g64.sum(axis=0), tol * 4, "grad_bias increment")


def test_model_backward_without_input_gradient(rng):
    model = large_mlp(12, 5, depth=2, width=16)
    from apps.train.nn.params import init_flat_parameters

    params = init_flat_parameters(model.layout, 0, "float64")
    grads = np.zeros_like(params)
    model.bind(params, grads)
    x = rng.standard_normal((6, 12))
    logits = model.forward(x, ForwardContext())
    grad_logits = rng.standard_normal(logits.shape)
    assert model.backward(grad_logits).shape == x.shape
    with_input = grads.copy()
    grads.fill(0)
    model.forward(x, ForwardContext())
    assert model.backward(grad_logits, need_input_grad=False) is None
    assert np.array_equal(grads, with_input)


# ------------------------------------------------------- whole-buffer kernels --

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [0, 1, 1000, 300_001])
def test_sum_of_squares(xp, rng, dtype, size):
    values = rng.standard_normal(size).astype(dtype)
    reference = float(np.sum(values.astype(np.float64) ** 2))
    device_values = xp.asarray(values)
    result = sum_of_squares(device_values)
    assert isinstance(result, float)
    assert abs(result - reference) <= (1e-12 if dtype == np.float64 else 1e-5) * max(1.0, reference)
    assert sum_of_squares(device_values) == result     # deterministic


def test_sum_of_squares_propagates_overflow(xp):
    values = xp.asarray(np.array([1.0, np.inf, 2.0], dtype=np.float32))
    assert not np.isfinite(sum_of_squares(values))
    values = xp.asarray(np.array([1.0, np.nan, 2.0], dtype=np.float32))
    assert np.isnan(sum_of_squares(values))


@pytest.mark.parametrize("source_dtype", [np.float16, np.float32])
def test_scaled_copy_is_bitwise_cast_then_multiply(xp, rng, source_dtype):
    source = (1000 * rng.standard_normal(5000)).astype(source_dtype)
    source[3] = np.inf
    expected = source.astype(np.float32) * np.float32(1.0 / 1024.0 / 3.0)
    target = xp.zeros(5000, dtype=xp.float32)
    scaled_copy(xp.asarray(source), target, 1.0 / 1024.0 / 3.0)
    assert np.array_equal(host(target), expected)

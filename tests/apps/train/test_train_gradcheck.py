"""Finite-difference gradient checks (fp64) for every layer and for the loss.

For a layer f with output y = f(x; theta) we differentiate the scalar
L = sum(R * y) for a fixed random R: backward(R) must give dL/dx and dL/dtheta,
compared with central differences (step 1e-6, relative error < 1e-6).
"""

import numpy as np
import pytest

from apps.train.nn.conv import AvgPool1d, Conv1d, MaxPool1d
from apps.train.nn.dropout import Dropout
from apps.train.nn.layers import GELU, Flatten, ForwardContext, LayerNorm, Linear, ReLU, Reshape
from apps.train.nn.loss import softmax_cross_entropy
from apps.train.nn.params import init_flat_parameters
from apps.train.nn.sequential import Residual, Sequential

STEP = 1e-6
TOLERANCE = 1e-6


def relative_error(numeric, analytic):
    scale = max(np.linalg.norm(numeric), np.linalg.norm(analytic), 1e-30)
    return np.linalg.norm(numeric - analytic) / scale


def central_difference(function, values):
    """d function / d values by central differences; ``values`` is perturbed in place."""
    gradient = np.zeros_like(values)
    flat = values.reshape(-1)
    out = gradient.reshape(-1)
    for i in range(flat.size):
        saved = flat[i]
        flat[i] = saved + STEP
        plus = function()
        flat[i] = saved - STEP
        minus = function()
        flat[i] = saved
        out[i] = (plus - minus) / (2 * STEP)
    return gradient


def check_layers(layers, input_shape, rng, training=False, away_from_zero=False):
    model = Sequential(layers)
    params = init_flat_parameters(model.layout, seed=1, dtype="float64")
    params += 0.1 * rng.standard_normal(params.shape)      # break LayerNorm's 1/0 init symmetry
    grads = np.zeros_like(params)
    model.bind(params, grads)
    x = rng.standard_normal(input_shape)
    if away_from_zero:
        x += np.sign(x) * 0.05
    ctx = ForwardContext(training=training, seed=5, step=3,
                         sample_index=np.arange(input_shape[0], dtype=np.int64) + 10)
    projection = rng.standard_normal(model.forward(x, ctx).shape)

    def scalar_loss():
        return float(np.sum(projection * model.forward(x, ctx)))

    scalar_loss()
    grad_input = model.backward(projection)
    numeric_input = central_difference(scalar_loss, x)
    assert relative_error(numeric_input, grad_input) < TOLERANCE
    if model.n_params:
        analytic = grads.copy()
        numeric_params = central_difference(scalar_loss, params)
        assert relative_error(numeric_params, analytic) < TOLERANCE


def test_linear(rng):
    check_layers([Linear(5, 4)], (3, 5), rng)


def test_linear_without_bias_on_3d_input(rng):
    check_layers([Linear(5, 4, bias=False)], (2, 3, 5), rng)


def test_relu(rng):
    check_layers([ReLU()], (4, 6), rng, away_from_zero=True)


def test_gelu(rng):
    check_layers([GELU()], (4, 6), rng)


def test_gelu_matches_tanh_formula(rng):
    x = rng.standard_normal((3, 4))
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert np.allclose(GELU().forward(x, ForwardContext()), expected, rtol=1e-15, atol=1e-15)


def test_layernorm(rng):
    check_layers([LayerNorm(6)], (4, 6), rng)


def test_layernorm_gelu_fused_after_linear(rng):
    """Linear -> LayerNorm -> GELU: the Linear's bias is added by the LayerNorm kernel and
    the GELU is computed by it too (the GELU layer passes through)."""
    layers = [Linear(5, 6), LayerNorm(6), GELU(), Linear(6, 3)]
    check_layers(layers, (4, 5), rng)
    assert layers[1].activation == "gelu" and layers[2].fused_into is layers[1]
    assert layers[0].defer_bias


def test_dropout_in_training(rng):
    check_layers([Dropout(0.4)], (5, 7), rng, training=True)


def test_flatten_and_reshape(rng):
    check_layers([Reshape((2, 6)), Flatten()], (3, 12), rng)


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1), (3, 2)])
def test_conv1d(rng, stride, padding):
    check_layers([Conv1d(2, 3, 3, stride=stride, padding=padding)], (2, 2, 11), rng)


def test_maxpool1d(rng):
    check_layers([MaxPool1d(3, stride=2)], (2, 3, 11), rng)


def test_avgpool1d(rng):
    check_layers([AvgPool1d(2)], (2, 3, 10), rng)


def test_residual_block(rng):
    check_layers([Linear(4, 5), Residual([Linear(5, 5), GELU(), LayerNorm(5)]), Linear(5, 3)],
                 (3, 4), rng)


def test_softmax_cross_entropy(rng):
    logits = rng.standard_normal((6, 5)) * 3
    labels = rng.integers(0, 5, size=6)
    global_batch_size = 10
    loss, grad = softmax_cross_entropy(logits, labels, global_batch_size)
    numeric = central_difference(
        lambda: float(softmax_cross_entropy(logits, labels, global_batch_size)[0]), logits)
    assert relative_error(numeric, grad) < TOLERANCE
    # value: -sum log softmax / global batch
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert np.isclose(loss, -log_softmax[np.arange(6), labels].sum() / 10, rtol=1e-14)


def test_loss_rejects_bad_labels():
    with pytest.raises(ValueError, match="values in"):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 3]), 2)
    with pytest.raises(ValueError, match="smaller than this batch"):
        softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 1]), 1)


def conv1d_reference(x, weight, bias, stride, padding):
    batch, channels, length = x.shape
    out_channels, _, kernel_size = weight.shape
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    out_length = (length + 2 * padding - kernel_size) // stride + 1
    y = np.zeros((batch, out_channels, out_length))
    for t in range(out_length):
        window = padded[:, :, t * stride:t * stride + kernel_size]
        y[:, :, t] = np.einsum("bcj,ocj->bo", window, weight) + bias
    return y


def test_conv_and_pool_forward_match_references(rng):
    conv = Conv1d(2, 3, 5, stride=2, padding=1)
    model = Sequential([conv])
    params = init_flat_parameters(model.layout, seed=0, dtype="float64")
    model.bind(params, np.zeros_like(params))
    x = rng.standard_normal((4, 2, 40))
    expected = conv1d_reference(x, conv.params["weight"], conv.params["bias"], 2, 1)
    assert np.allclose(model.forward(x, ForwardContext()), expected, rtol=1e-13, atol=1e-13)
    windows = np.stack([x[:, :, t * 2:t * 2 + 3] for t in range(19)], axis=2)
    assert np.array_equal(MaxPool1d(3, 2).forward(x, ForwardContext()), windows.max(-1))
    assert np.allclose(AvgPool1d(3, 2).forward(x, ForwardContext()), windows.mean(-1))

"""What activation recomputation holds between forward and backward, counted array by array.

``Sequential.saved_activation_bytes`` after the forward pass must equal the activations each layer
keeps for backward (worked out by hand below), and with recomputation only the block inputs; both
drop to zero after backward, and recomputation frees each block input as backward passes it
(``tracemalloc`` peak). The gradients stay bitwise those of the run without recomputation.
"""

import tracemalloc

import numpy as np
import pytest

from apps.train.nn.layers import ForwardContext
from apps.train.nn.models import large_mlp
from apps.train.nn.params import init_flat_parameters
from apps.train.nn.sequential import Sequential
from apps.train.parallel.tensor_parallel import MLPSpec, mlp_layers

B, I, C, W, H, D = 12, 10, 5, 16, 40, 3   # batch, inputs, classes, width, residual inner width, depth


def _bound(model, dtype):
    params = np.asarray(init_flat_parameters(model.layout, seed=3), dtype=dtype)
    model.bind(params, np.zeros_like(params))
    return model


def _forward(model, dtype):
    x = np.random.default_rng(5).standard_normal((B, I)).astype(dtype)
    return model.forward(x, ForwardContext(training=True, sample_index=np.arange(B)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_large_mlp_holds_two_arrays_per_hidden_layer_and_one_with_recomputation(dtype):
    s = np.dtype(dtype).itemsize
    # Linear input; per hidden layer the LayerNorm input, its mean and 1/std (B x 1 each; the fused
    # GELU keeps nothing) and the next Linear's input; the last GELU's input and the output Linear's.
    stored = s * (B * I + D * (2 * B * W + 2 * B) + 2 * B * W)
    # One block per hidden layer: the inputs of [Linear], D x [LayerNorm, GELU, Linear], [GELU, Linear].
    recomputed = s * (B * I + D * B * W + B * W)
    for recompute, expected in ((False, stored), (True, recomputed)):
        model = _bound(large_mlp(I, C, D, W, recompute=recompute), dtype)
        logits = _forward(model, dtype)
        assert model.saved_activation_bytes() == expected
        model.backward(np.ones_like(logits))
        assert model.saved_activation_bytes() == 0


def test_residual_mlp_holds_one_array_per_block_with_recomputation():
    s = 8
    spec = MLPSpec(n_inputs=I, n_classes=C, width=W, hidden=H, depth=D)
    # Per residual block: LayerNorm input, mean, 1/std, the up-projection's input, the GELU's input
    # and the down-projection's input; then the final LayerNorm's three and the output Linear's input.
    stored = s * (B * I + D * (2 * B * W + 2 * B + 2 * B * H) + (B * W + 2 * B) + B * W)
    recomputed = s * (B * I + D * B * W + B * W + B * W)   # the inputs of the D + 3 top-level layers
    for recompute, expected in ((False, stored), (True, recomputed)):
        model = _bound(Sequential(mlp_layers(spec), recompute=recompute), "float64")
        _forward(model, "float64")
        assert model.saved_activation_bytes() == expected


def _peak_and_gradients(model, dtype):
    x = np.random.default_rng(5).standard_normal((256, I)).astype(dtype)
    context = ForwardContext(training=True, sample_index=np.arange(256))
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    logits = model.forward(x, context)
    model.backward(np.ones_like(logits) / logits.size)
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return peak, model.grads.copy()


def test_recomputation_lowers_the_peak_and_keeps_the_gradients():
    spec = MLPSpec(n_inputs=I, n_classes=C, width=64, hidden=256, depth=6)
    results = [_peak_and_gradients(_bound(Sequential(mlp_layers(spec), recompute=r), "float64"), "float64")
               for r in (False, True)]
    (peak_stored, grads_stored), (peak_recomputed, grads_recomputed) = results
    assert np.array_equal(grads_stored, grads_recomputed)
    assert peak_recomputed < 0.8 * peak_stored
    results = [_peak_and_gradients(_bound(large_mlp(I, C, 6, 64, recompute=r), "float64"), "float64")
               for r in (False, True)]
    (peak_stored, grads_stored), (peak_recomputed, grads_recomputed) = results
    assert np.array_equal(grads_stored, grads_recomputed)
    assert peak_recomputed < peak_stored


def test_backward_frees_each_block_input_as_it_passes():
    """With recomputation a block's input is dropped once backward has re-run that block, as the
    stored activations are: the block inputs still held fall to zero, block by block."""
    model = _bound(large_mlp(I, C, D, W, recompute=True), "float64")
    logits = _forward(model, "float64")
    n_blocks = len(model.blocks)
    assert sum(value is not None for value in model._block_inputs) == n_blocks
    held = []
    model.backward(np.ones_like(logits),
                   on_grads_ready=lambda lo, hi: held.append(sum(v is not None for v in model._block_inputs)))
    assert held[0] == n_blocks - 1 and held[-1] == 0
    assert all(a >= b for a, b in zip(held, held[1:]))

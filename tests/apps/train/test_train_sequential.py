"""Model-level properties that data parallelism relies on (fp64, CPU)."""

import numpy as np
import pytest

from apps.train.nn.conv import Conv1d, MaxPool1d
from apps.train.nn.dropout import Dropout
from apps.train.nn.layers import GELU, Flatten, ForwardContext, LayerNorm, Linear, ReLU, Reshape
from apps.train.nn.loss import softmax_cross_entropy
from apps.train.nn.models import large_mlp, mnist1d_cnn, mnist1d_mlp
from apps.train.nn.params import init_flat_parameters
from apps.train.nn.sequential import Residual, Sequential


def mixed_model(recompute=False):
    """A model that uses every layer kind, dropout included."""
    return Sequential([
        Reshape((2, 12)),
        Conv1d(2, 4, 3, stride=1, padding=1), GELU(), Dropout(0.3),
        MaxPool1d(2), Flatten(),
        Linear(24, 16), LayerNorm(16), ReLU(),
        Residual([Linear(16, 16), GELU(), Dropout(0.2)]),
        Linear(16, 5),
    ], recompute=recompute)


def gradients(model, x, labels, sample_index, global_batch_size, step=0, seed=7, hook=None):
    """Flat gradient of the global-mean loss contribution of this batch."""
    ctx = ForwardContext(training=True, seed=seed, step=step, sample_index=sample_index)
    logits = model.forward(x, ctx)
    _, grad_logits = softmax_cross_entropy(logits, labels, global_batch_size)
    model.grads.fill(0)
    model.backward(grad_logits, on_grads_ready=hook)
    return model.grads.copy()


def bound(model, seed=1):
    params = init_flat_parameters(model.layout, seed=seed, dtype="float64")
    model.bind(params, np.zeros_like(params))
    return model


@pytest.fixture
def batch(rng):
    x = rng.standard_normal((12, 24))
    labels = rng.integers(0, 5, size=12)
    return x, labels, np.arange(12, dtype=np.int64)


def test_hook_reports_contiguous_increasing_ranges(batch):
    model = bound(mixed_model())
    reported = []
    gradients(model, *batch, 12, hook=lambda lo, hi: reported.append((lo, hi)))
    assert reported[0][0] == 0 and reported[-1][1] == model.n_params
    for (lo, hi), (next_lo, _) in zip(reported, reported[1:]):
        assert lo < hi == next_lo
    # five layers with parameters at top level: Conv1d, Linear, LayerNorm, Residual, Linear
    assert len(reported) == 5


def test_hook_sees_final_gradients(batch):
    """When a range is reported, its gradients never change again during backward."""
    model = bound(mixed_model())
    snapshots = {}
    final = gradients(model, *batch, 12,
                      hook=lambda lo, hi: snapshots.__setitem__((lo, hi), model.grads[lo:hi].copy()))
    for (lo, hi), snapshot in snapshots.items():
        assert np.array_equal(snapshot, final[lo:hi])


@pytest.mark.parametrize("make_model", [mixed_model, mnist1d_cnn, mnist1d_mlp,
                                        lambda recompute: large_mlp(24, 5, 3, 8, dropout=0.1,
                                                                    recompute=recompute)])
def test_recompute_gives_bitwise_identical_gradients(rng, make_model):
    n_inputs = 40 if make_model in (mnist1d_cnn, mnist1d_mlp) else 24
    x = rng.standard_normal((9, n_inputs))
    labels = rng.integers(0, 5, size=9)
    index = np.arange(9, dtype=np.int64)
    stored = gradients(bound(make_model(recompute=False)), x, labels, index, 9)
    model = bound(make_model(recompute=True))
    recomputed = gradients(model, x, labels, index, 9)
    assert np.array_equal(stored, recomputed)
    # recomputation really dropped the activations after forward
    ctx = ForwardContext(training=True, seed=7, sample_index=index)
    model.forward(x, ctx)
    assert all(getattr(leaf, key) is None for leaf in model.leaves()
               for key in vars(leaf) if key.startswith("_saved"))


def test_half_batch_gradients_sum_to_full_batch_gradient(batch):
    """2 ranks x B/2 == 1 rank x B when the loss divides by the global batch size."""
    x, labels, index = batch
    model = bound(mixed_model())
    full = gradients(model, x, labels, index, 12)
    first = gradients(model, x[:5], labels[:5], index[:5], 12)
    second = gradients(model, x[5:], labels[5:], index[5:], 12)
    assert np.max(np.abs(first + second - full)) <= 1e-12 * max(1.0, np.max(np.abs(full)))
    assert np.max(np.abs(full)) > 1e-3


def test_dropout_mask_does_not_depend_on_batch_split(rng):
    layer = Dropout(0.5)
    Sequential([layer])
    x = rng.standard_normal((10, 30))
    index = np.arange(100, 110, dtype=np.int64)
    ctx = ForwardContext(training=True, seed=3, step=4, sample_index=index)
    full = layer.forward(x, ctx)
    parts = [layer.forward(x[a:b], ForwardContext(training=True, seed=3, step=4,
                                                  sample_index=index[a:b]))
             for a, b in [(0, 3), (3, 4), (4, 10)]]
    assert np.array_equal(np.concatenate(parts), full)
    # a different step draws a different mask
    other = layer.forward(x, ForwardContext(training=True, seed=3, step=5, sample_index=index))
    assert not np.array_equal(other, full)
    # evaluation mode is the identity
    assert layer.forward(x, ForwardContext(training=False)) is x


def test_dropout_layers_get_distinct_streams():
    model = large_mlp(8, 2, 3, 8, dropout=0.5)
    streams = [leaf.stream for leaf in model.leaves() if isinstance(leaf, Dropout)]
    assert len(streams) == 3 and len(set(streams)) == 3


def test_sequential_rejects_non_layers():
    with pytest.raises(TypeError, match="Layer"):
        Sequential([Linear(2, 2), "relu"])
    with pytest.raises(ValueError, match="sum to the number"):
        Sequential([Linear(2, 2), ReLU()], block_sizes=[1])


def _unfuse(model):
    """Undo the LayerNorm + GELU fusion: the GELU layers compute themselves again."""
    for leaf in model.leaves():
        if isinstance(leaf, LayerNorm):
            leaf.activation = None
        if isinstance(leaf, GELU):
            leaf.fused_into = None
    return model


def test_layer_norm_gelu_fusion_changes_no_bit(rng):
    """large_mlp's LayerNorm -> GELU pairs are fused; logits and gradients are bitwise those of
    the separate layers, also when the pair is split across recomputation blocks."""
    model = large_mlp(24, 5, 3, 8, dropout=0.1)
    norms = [leaf for leaf in model.leaves() if isinstance(leaf, LayerNorm)]
    assert len(norms) == 3 and all(norm.activation == "gelu" for norm in norms)
    x = rng.standard_normal((9, 24))
    labels = rng.integers(0, 5, size=9)
    index = np.arange(9, dtype=np.int64)
    fused = gradients(bound(model), x, labels, index, 9)
    separate = gradients(bound(_unfuse(large_mlp(24, 5, 3, 8, dropout=0.1))), x, labels, index, 9)
    assert np.array_equal(fused, separate)
    # blocks [Linear, LayerNorm] [GELU, Dropout, Linear, LayerNorm] x 2 [GELU, Dropout, Linear, GELU, Linear]
    split = Sequential(large_mlp(24, 5, 3, 8, dropout=0.1).layers, block_sizes=[2, 4, 4, 5], recompute=True)
    assert np.array_equal(gradients(bound(split), x, labels, index, 9), separate)

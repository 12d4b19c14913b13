"""Flat parameter layout: backward order, views, seeded initialisation."""

import numpy as np
import pytest

from apps.train.nn.layers import Linear, ReLU
from apps.train.nn.models import mnist1d_cnn, mnist1d_mlp
from apps.train.nn.params import ParamLayout, ParamSpec, init_flat_parameters
from apps.train.nn.sequential import Sequential


def test_layout_is_in_backward_order_and_tiles_the_buffer():
    model = mnist1d_mlp()
    entries = model.layout.entries
    # last layer first, first layer last
    assert entries[0].layer == "3.Linear"
    assert entries[-1].layer == "0.Linear"
    offset = 0
    for entry in entries:
        assert entry.offset == offset
        offset = entry.stop
    assert offset == model.n_params == 15210


def test_parameter_counts_match_the_reference_models():
    # torch: MLP 40*100+100 + 100*100+100 + 100*10+10; CNN 25*1*5+25 + 2*(25*25*3+25) + 125*10+10
    assert mnist1d_mlp().n_params == 15210
    assert mnist1d_cnn().n_params == 5210


def test_views_write_through_to_the_flat_buffers():
    model = Sequential([Linear(3, 4), ReLU(), Linear(4, 2)])
    params = np.zeros(model.n_params)
    grads = np.zeros(model.n_params)
    model.bind(params, grads)
    first = model.layers[0]
    first.params["weight"][...] = 7.0
    lo, hi = first.param_range
    start = model.layout.layer_range("0.Linear")[0]
    assert (lo, hi) == (start, model.n_params)
    assert np.all(params[lo:lo + 12] == 7.0)
    assert np.shares_memory(first.grads["bias"], grads)


def test_initialisation_is_deterministic_and_seed_dependent():
    layout = mnist1d_cnn().layout
    a = init_flat_parameters(layout, seed=3)
    b = init_flat_parameters(layout, seed=3)
    c = init_flat_parameters(layout, seed=4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # fp64 and fp32 initialisations agree up to rounding
    d = init_flat_parameters(layout, seed=3, dtype="float64")
    assert np.allclose(a, d, rtol=1e-7, atol=0)


def test_uniform_fan_in_bounds():
    layout = ParamLayout()
    layout.add_layer("a", [ParamSpec("weight", (50, 400), "uniform_fan_in", 400),
                           ParamSpec("gain", (5,), "ones")])
    flat = init_flat_parameters(layout, seed=0, dtype="float64")
    weight = flat[:20000]
    assert np.abs(weight).max() <= 1 / 20
    assert np.abs(weight).max() > 0.9 / 20
    assert np.all(flat[20000:] == 1.0)


def test_layout_rejects_duplicates_and_wrong_buffers():
    layout = ParamLayout()
    layout.add_layer("a", [ParamSpec("w", (2,), "zeros")])
    with pytest.raises(ValueError, match="twice"):
        layout.add_layer("a", [])
    with pytest.raises(ValueError, match="expected shape"):
        layout.views(np.zeros(3))

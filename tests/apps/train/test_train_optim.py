"""Optimisers against straightforward NumPy references of the published rules."""

import math

import numpy as np
import pytest

from apps.train.training.optim import AdamW, SGD, WarmupCosineSchedule, clip_factor, grad_sum_of_squares


def adamw_reference(params, grad_sequence, lr, beta1, beta2, eps, weight_decay):
    """Loshchilov & Hutter (2019), Algorithm 2, as implemented by torch.optim.AdamW."""
    p = params.copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grad_sequence, start=1):
        p = p - lr * weight_decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat = m / (1 - beta1**t)
        v_hat = v / (1 - beta2**t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def sgd_reference(params, grad_sequence, lr, momentum, weight_decay, nesterov):
    """Sutskever et al. (2013) momentum in the torch.optim.SGD form."""
    p = params.copy()
    buffer = None
    for g in grad_sequence:
        d = g + weight_decay * p
        buffer = d.copy() if buffer is None else momentum * buffer + d
        d = d + momentum * buffer if nesterov else buffer
        p = p - lr * d
    return p, buffer


@pytest.fixture
def problem(rng):
    params = rng.standard_normal(1000)
    grads = [rng.standard_normal(1000) * 10.0**k for k in (-3, 0, 2, -1, 0)]
    return params, grads


def test_adamw_matches_reference(problem):
    params, grad_sequence = problem
    optimizer = AdamW(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    p = params.copy()
    state = optimizer.init_state(p.size, np, "float64")
    for g in grad_sequence:
        optimizer.step(p, g.copy(), state, lr=3e-3)
    expected, m, v = adamw_reference(params, grad_sequence, 3e-3, 0.9, 0.95, 1e-8, 0.1)
    # bias corrections are rearranged in the kernel, hence a few ulps
    assert np.allclose(p, expected, rtol=1e-13, atol=1e-15)
    assert np.allclose(state["exp_avg"], m, rtol=1e-13, atol=1e-18)
    assert np.allclose(state["exp_avg_sq"], v, rtol=1e-13, atol=1e-18)
    assert int(state["step"]) == len(grad_sequence)


def test_adamw_float32_close_to_reference(problem):
    params, grad_sequence = problem
    optimizer = AdamW(weight_decay=0.01)
    p = params.astype(np.float32)
    state = optimizer.init_state(p.size, np, "float32")
    for g in grad_sequence:
        optimizer.step(p, g.astype(np.float32), state, lr=1e-3)
    expected, _, _ = adamw_reference(params, grad_sequence, 1e-3, 0.9, 0.999, 1e-8, 0.01)
    assert np.allclose(p, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_reference(problem, nesterov):
    params, grad_sequence = problem
    optimizer = SGD(momentum=0.9, weight_decay=5e-4, nesterov=nesterov)
    p = params.copy()
    state = optimizer.init_state(p.size, np, "float64")
    for g in grad_sequence:
        optimizer.step(p, g, state, lr=0.05)
    expected, buffer = sgd_reference(params, grad_sequence, 0.05, 0.9, 5e-4, nesterov)
    assert np.allclose(p, expected, rtol=1e-14, atol=1e-14)
    assert np.allclose(state["momentum_buffer"], buffer, rtol=1e-14, atol=1e-14)


def test_plain_sgd_without_momentum(problem):
    params, grad_sequence = problem
    p = params.copy()
    optimizer = SGD(momentum=0.0)
    state = optimizer.init_state(p.size, np, "float64")
    optimizer.step(p, grad_sequence[1], state, lr=0.1)
    assert np.allclose(p, params - 0.1 * grad_sequence[1], rtol=0, atol=1e-15)


@pytest.mark.parametrize("optimizer", [AdamW(weight_decay=0.05), SGD(momentum=0.8, weight_decay=1e-3)])
def test_sharded_steps_equal_the_unsharded_step(problem, optimizer):
    """ZeRO-1: three ranks each updating a contiguous shard reproduce the full update."""
    params, grad_sequence = problem
    full = params.copy()
    full_state = optimizer.init_state(full.size, np, "float64")
    sharded = params.copy()
    bounds = [(0, 334), (334, 667), (667, 1000)]
    shard_states = [optimizer.init_state(hi - lo, np, "float64") for lo, hi in bounds]
    for g in grad_sequence:
        optimizer.step(full, g, full_state, lr=1e-2, grad_scale=0.5)
        for (lo, hi), state in zip(bounds, shard_states):
            optimizer.step(sharded[lo:hi], g[lo:hi], state, lr=1e-2, grad_scale=0.5)
    assert np.array_equal(full, sharded)


def test_grad_scale_is_fused_scaling(problem):
    params, grad_sequence = problem
    a, b = params.copy(), params.copy()
    optimizer = AdamW()
    state_a = optimizer.init_state(a.size, np, "float64")
    state_b = optimizer.init_state(b.size, np, "float64")
    optimizer.step(a, grad_sequence[1] * 0.25, state_a, lr=1e-3)
    optimizer.step(b, grad_sequence[1], state_b, lr=1e-3, grad_scale=0.25)
    assert np.allclose(a, b, rtol=1e-15, atol=0)


def test_optimizer_validates_buffers():
    optimizer = AdamW()
    state = optimizer.init_state(4, np, "float32")
    with pytest.raises(ValueError, match="shape and dtype"):
        optimizer.step(np.zeros(4, np.float32), np.zeros(4, np.float64), state, lr=1.0)
    with pytest.raises(TypeError, match="float32 or float64"):
        SGD().step(np.zeros(4, np.float16), np.zeros(4, np.float16),
                   {"momentum_buffer": np.zeros(4, np.float16)}, lr=1.0)


def test_warmup_cosine_schedule():
    schedule = WarmupCosineSchedule(1.0, warmup_steps=4, total_steps=14, min_lr=0.1)
    assert [schedule(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule(4) == 1.0
    assert math.isclose(schedule(9), 0.1 + 0.9 * 0.5, rel_tol=1e-15)
    assert math.isclose(schedule(14), 0.1) and math.isclose(schedule(100), 0.1)
    values = [schedule(s) for s in range(4, 15)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert WarmupCosineSchedule(0.5)(1000) == 0.5


def test_clipping_from_a_reduced_sum_of_squares(rng):
    grads = rng.standard_normal(100)
    halves = grad_sum_of_squares(grads[:50]) + grad_sum_of_squares(grads[50:])   # "allreduce"
    factor, norm = clip_factor(halves, max_norm=1.0)
    assert math.isclose(norm, np.linalg.norm(grads), rel_tol=1e-14)
    assert math.isclose(np.linalg.norm(grads * factor), 1.0, rel_tol=1e-5)
    assert clip_factor(halves, max_norm=1e6)[0] == 1.0
    assert clip_factor(halves, max_norm=None)[0] == 1.0
    assert not math.isfinite(clip_factor(float("inf"), 1.0)[1])
    assert clip_factor(float("nan"), 1.0)[0] == 1.0

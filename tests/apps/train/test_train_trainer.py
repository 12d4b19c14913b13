"""The training step: accumulation, simulated ranks, checkpoint round trip (fp64)."""

import numpy as np
import pytest

from apps.train.data.dataset import shard_bounds
from apps.train.nn.models import large_mlp
from apps.train.training.trainer import (LocalSync, TrainConfig, Trainer, compute_gradients,
                                init_train_state, load_state_arrays, state_arrays, train_step)

GLOBAL_BATCH = 12


def make(accum_steps=1, optimizer="adamw", clip_norm=None):
    model = large_mlp(10, 4, depth=2, width=16, dropout=0.25)
    config = TrainConfig(optimizer=optimizer, lr=1e-2, weight_decay=0.01, precision="fp64",
                         global_batch_size=GLOBAL_BATCH, accum_steps=accum_steps,
                         clip_norm=clip_norm, warmup_steps=2, total_steps=10, seed=3)
    trainer = Trainer(model, config)
    return trainer, init_train_state(trainer)


@pytest.fixture
def data(rng):
    x = rng.standard_normal((3 * GLOBAL_BATCH, 10))
    y = rng.integers(0, 4, size=3 * GLOBAL_BATCH)
    return x, y


def run_steps(trainer, state, data, n_steps=3, first_batch=0):
    x, y = data
    index = np.arange(GLOBAL_BATCH, dtype=np.int64)
    losses = []
    for step in range(first_batch, first_batch + n_steps):
        batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        losses.append(train_step(trainer, state, x[batch], y[batch], index).loss)
    return losses


def test_accumulation_equals_one_big_batch(data):
    """accum_steps = 2 (and 5, uneven) x micro-batches == one batch of B."""
    reference_trainer, reference_state = make(accum_steps=1, clip_norm=0.5)
    reference_losses = run_steps(reference_trainer, reference_state, data)
    for accum_steps in (2, 5):
        trainer, state = make(accum_steps=accum_steps, clip_norm=0.5)
        losses = run_steps(trainer, state, data)
        assert np.allclose(losses, reference_losses, rtol=1e-13)
        assert np.allclose(state.precision.master_params, reference_state.precision.master_params,
                           rtol=0, atol=1e-12)


def test_two_simulated_ranks_equal_one_rank(data):
    """Summing the local gradients of two 'ranks' (B/2 each) gives the 1-rank gradient."""
    x, y = data[0][:GLOBAL_BATCH], data[1][:GLOBAL_BATCH]
    index = np.arange(GLOBAL_BATCH, dtype=np.int64)
    trainer, state = make()
    compute_gradients(trainer, state, x, y, index, LocalSync())
    single = state.precision.compute_grads.copy()
    summed = np.zeros_like(single)
    for rank in range(2):
        rank_trainer, rank_state = make()
        lo, hi = shard_bounds(GLOBAL_BATCH, rank, 2)
        compute_gradients(rank_trainer, rank_state, x[lo:hi], y[lo:hi], index[lo:hi], LocalSync())
        summed += rank_state.precision.compute_grads
    assert np.max(np.abs(summed - single)) <= 1e-12 * max(1.0, np.max(np.abs(single)))


def test_hook_fires_only_on_the_last_micro_batch(data):
    class RecordingSync(LocalSync):
        def __init__(self):
            self.ranges = []
            self.finished = 0
            self.on_grads_ready = lambda lo, hi: self.ranges.append((lo, hi))

        def finish_gradients(self, grads):
            self.finished += 1

    trainer, state = make(accum_steps=3)
    sync = RecordingSync()
    index = np.arange(GLOBAL_BATCH, dtype=np.int64)
    train_step(trainer, state, data[0][:GLOBAL_BATCH], data[1][:GLOBAL_BATCH], index, sync)
    n_parameterised = sum(1 for layer in trainer.model.layers if layer.n_params)
    assert len(sync.ranges) == n_parameterised and sync.finished == 1
    assert sync.ranges[-1][1] == trainer.model.n_params


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_checkpoint_round_trip_continues_identically(data, optimizer):
    trainer, state = make(optimizer=optimizer)
    run_steps(trainer, state, data, n_steps=1)
    saved = state_arrays(state)
    straight = run_steps(trainer, state, data, n_steps=2, first_batch=1)
    resumed_trainer, resumed_state = make(optimizer=optimizer)
    load_state_arrays(resumed_state, saved)
    assert resumed_state.step == 1
    resumed = run_steps(resumed_trainer, resumed_state, data, n_steps=2, first_batch=1)
    assert resumed == straight
    assert np.array_equal(resumed_state.precision.master_params, state.precision.master_params)


def test_too_few_samples_for_accumulation(data):
    trainer, state = make(accum_steps=4)
    with pytest.raises(ValueError, match="accum_steps"):
        compute_gradients(trainer, state, data[0][:3], data[1][:3], np.arange(3), LocalSync())

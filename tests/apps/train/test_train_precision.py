"""Dynamic loss scaling and fp16 mixed precision."""

import numpy as np

from apps.train.data.dataset import Dataset
from apps.train.nn.models import mnist1d_mlp
from apps.train.training.precision import DynamicLossScaler, MixedPrecision
from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step


def test_scaler_halves_and_skips_on_overflow_then_grows():
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    assert scaler.update(found_nonfinite=True) is False
    assert scaler.scale == 512.0 and scaler.skipped_steps == 1
    assert scaler.update(False) and scaler.update(False)
    assert scaler.scale == 512.0
    assert scaler.update(False)
    assert scaler.scale == 1024.0 and scaler.good_steps == 0
    # an overflow resets the run of good steps
    scaler.update(False)
    scaler.update(True)
    assert scaler.scale == 512.0 and scaler.good_steps == 0


def test_scaler_state_round_trip_and_bounds():
    scaler = DynamicLossScaler(init_scale=4.0, min_scale=1.0, growth_interval=2)
    for _ in range(5):
        scaler.update(True)
    assert scaler.scale == 1.0
    scaler.update(False)
    restored = DynamicLossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.good_steps, restored.skipped_steps) == (1.0, 1, 5)


def test_mixed_precision_copies_and_unscales():
    master = np.array([1.0, 2.5, 1e-3], dtype=np.float32)
    policy = MixedPrecision(master, scaler=DynamicLossScaler(init_scale=256.0))
    assert policy.compute_params.dtype == np.float16
    policy.compute_grads[...] = np.array([256.0, 512.0, 1.0], dtype=np.float16)
    policy.grads_to_master()
    assert np.array_equal(policy.master_grads, np.array([1.0, 2.0, 1 / 256], dtype=np.float32))
    view = policy.compute_params[1:]
    master[...] = 3.0
    policy.refresh_compute_params()
    assert np.all(view == 3.0)            # refreshed in place: layer views stay valid


def make_run(precision, dataset_size=64):
    rng = np.random.default_rng(0)
    dataset = Dataset(x=rng.standard_normal((dataset_size, 40)).astype(np.float32),
                      y=rng.integers(0, 10, dataset_size),
                      x_test=np.zeros((1, 40), np.float32), y_test=np.zeros(1, np.int64))
    trainer = Trainer(mnist1d_mlp(), TrainConfig(precision=precision, global_batch_size=16,
                                                 lr=1e-3, init_loss_scale=2.0**10))
    return trainer, init_train_state(trainer), dataset


def test_fp16_step_skips_and_halves_on_inf():
    trainer, state, dataset = make_run("fp16")
    x, y = dataset.x[:16].copy(), dataset.y[:16]
    index = np.arange(16)
    before = state.precision.master_params.copy()
    x[3, 5] = np.inf                       # poisons the gradients with inf/nan
    with np.errstate(invalid="ignore", over="ignore"):
        metrics = train_step(trainer, state, x, y, index)
    assert not metrics.applied
    assert state.precision.loss_scale == 2.0**9
    assert np.array_equal(state.precision.master_params, before)
    assert int(state.optimizer_state["step"]) == 0 and state.step == 1
    # a clean batch is applied and stays close to the fp32 run
    metrics = train_step(trainer, state, dataset.x[16:32], dataset.y[16:32], index)
    assert metrics.applied and np.isfinite(metrics.loss)
    reference_trainer, reference_state, _ = make_run("fp32")
    reference_state.step = 1
    train_step(reference_trainer, reference_state, dataset.x[16:32], dataset.y[16:32], index)
    # unscaled fp16 gradients agree with fp32 ones to fp16 accuracy (the fused AdamW step
    # unscales on the fly: no float32 gradient buffer to read)
    fp16_grads = state.precision.compute_grads.astype(np.float32) / np.float32(metrics.loss_scale)
    fp32_grads = reference_state.precision.master_grads
    assert np.linalg.norm(fp16_grads - fp32_grads) < 5e-3 * np.linalg.norm(fp32_grads)
    assert np.max(np.abs(state.precision.master_params - before)) > 5e-4

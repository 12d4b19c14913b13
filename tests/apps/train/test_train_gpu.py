"""CuPy parity: kernels and one full training step on GPU equal the NumPy path.

Run on the GPU machine with ``python -m pytest tests/apps/train -m gpu``.
"""

import numpy as np
import pytest

from apps.train.kernels.im2col import col2im, im2col
from apps.train.nn.models import large_mlp, mnist1d_cnn
from apps.train.training.optim import AdamW, SGD
from apps.train.kernels.random_mask import keep_mask
from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_im2col_parity(cupy, rng, dtype):
    x = rng.standard_normal((3, 4, 29)).astype(dtype)
    expected = im2col(x, 5, 2, 1)
    assert np.array_equal(cupy.asnumpy(im2col(cupy.asarray(x), 5, 2, 1)), expected)


@pytest.mark.parametrize("dtype,tolerance", [(np.float32, 1e-6), (np.float64, 1e-14)])
def test_col2im_parity(cupy, rng, dtype, tolerance):
    cols = rng.standard_normal((3, 14, 4 * 5)).astype(dtype)
    expected = col2im(cols, 29, 5, 2, 1)
    result = cupy.asnumpy(col2im(cupy.asarray(cols), 29, 5, 2, 1))
    assert np.allclose(result, expected, rtol=tolerance, atol=tolerance)


def test_keep_mask_parity(cupy):
    index = np.array([0, 3, 1 << 40, 12345], dtype=np.int64)
    expected = keep_mask(index, 77, 11, 5, 3, 0.6)
    assert np.array_equal(cupy.asnumpy(keep_mask(cupy.asarray(index), 77, 11, 5, 3, 0.6)), expected)


@pytest.mark.parametrize("optimizer", [AdamW(weight_decay=0.1), SGD(momentum=0.9, weight_decay=1e-3,
                                                                    nesterov=True)])
@pytest.mark.parametrize("dtype,tolerance", [(np.float32, 1e-6), (np.float64, 1e-14)])
def test_optimizer_parity(cupy, rng, optimizer, dtype, tolerance):
    params = rng.standard_normal(5000).astype(dtype)
    grads = [rng.standard_normal(5000).astype(dtype) for _ in range(3)]
    cpu_params, gpu_params = params.copy(), cupy.asarray(params)
    cpu_state = optimizer.init_state(5000, np, dtype)
    gpu_state = optimizer.init_state(5000, cupy, dtype)
    for g in grads:
        optimizer.step(cpu_params, g, cpu_state, lr=1e-2, grad_scale=0.7)
        optimizer.step(gpu_params, cupy.asarray(g), gpu_state, lr=1e-2, grad_scale=0.7)
    assert np.allclose(cupy.asnumpy(gpu_params), cpu_params, rtol=tolerance, atol=tolerance)


def one_step(make_model, config, xp, x, y):
    trainer = Trainer(make_model(), config)
    state = init_train_state(trainer, xp)
    index = xp.arange(x.shape[0], dtype=xp.int64)
    metrics = train_step(trainer, state, xp.asarray(x), xp.asarray(y), index)
    to_host = (lambda a: a.get()) if xp is not np else (lambda a: a)
    precision = state.precision
    if precision.name == "mixed":   # the fused AdamW step unscales on the fly: no float32 buffer
        grads = to_host(precision.compute_grads).astype(np.float32) / np.float32(metrics.loss_scale)
    else:
        grads = to_host(precision.master_grads)
    return metrics, to_host(precision.master_params), grads


MODELS = {
    "cnn": (mnist1d_cnn, 40),
    "mlp": (lambda: large_mlp(40, 10, depth=3, width=64, dropout=0.2), 40),
}


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("precision,optimizer,tolerance", [("fp64", "adamw", 1e-10),
                                                           ("fp32", "sgd", 1e-5)])
def test_train_step_parity(cupy, rng, model_name, precision, optimizer, tolerance):
    make_model, n_inputs = MODELS[model_name]
    x = rng.standard_normal((32, n_inputs))
    y = rng.integers(0, 10, size=32)
    config = TrainConfig(optimizer=optimizer, lr=1e-2, precision=precision, global_batch_size=32,
                         accum_steps=2, clip_norm=1.0, seed=4)
    cpu_metrics, cpu_params, cpu_grads = one_step(make_model, config, np, x, y)
    gpu_metrics, gpu_params, gpu_grads = one_step(make_model, config, cupy, x, y)
    assert np.isclose(gpu_metrics.loss, cpu_metrics.loss, rtol=tolerance)
    assert np.linalg.norm(gpu_grads - cpu_grads) <= tolerance * np.linalg.norm(cpu_grads)
    assert np.allclose(gpu_params, cpu_params, rtol=tolerance, atol=tolerance)


def test_mixed_precision_step_on_gpu(cupy, rng):
    x = rng.standard_normal((32, 40))
    y = rng.integers(0, 10, size=32)
    config = TrainConfig(optimizer="adamw", lr=1e-3, global_batch_size=32, seed=4)
    _, _, reference_grads = one_step(mnist1d_cnn, config, np, x, y)
    config.precision = "fp16"
    config.init_loss_scale = 2.0**10       # small model, large gradients: avoid a skipped step
    metrics, params, grads = one_step(mnist1d_cnn, config, cupy, x, y)
    assert metrics.applied and np.isfinite(metrics.loss) and np.all(np.isfinite(params))
    assert np.linalg.norm(grads - reference_grads) < 1e-2 * np.linalg.norm(reference_grads)

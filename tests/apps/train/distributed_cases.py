"""Shared set-up of the training tests: a small learnable problem and training runs (data-parallel, and
the steps of a D x T x P :class:`~apps.train.parallel.trainer.ParallelTrainer`)."""

import numpy as np

from apps.train.kernels.backend import to_numpy
from apps.train.parallel.distributed import make_sync
from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.nn.models import large_mlp
from apps.train.training.trainer import LocalSync, TrainConfig, Trainer, init_train_state, train_step

N_FEATURES, N_CLASSES, N_SAMPLES = 12, 4, 240


def synthetic_data(seed=5):
    """A learnable 4-class problem: the label is the arg-max of 4 fixed projections."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N_SAMPLES, N_FEATURES)).astype(np.float32)
    projections = rng.standard_normal((N_FEATURES, N_CLASSES))
    return x, np.argmax(x @ projections, axis=1).astype(np.int64)


def make_model(width=32):
    # LayerNorm, GELU and dropout: dropout masks must follow the samples across ranks
    return large_mlp(N_FEATURES, N_CLASSES, depth=2, width=width, dropout=0.1)


def train_curve(comm, n_steps, global_batch, accum_steps=1, zero=0, precision="fp32",
                clip_norm=None, optimizer="adamw", bucket_mb=0.002, arch=None):
    """Loss curve, final master parameters (host) and the sync object of a run.

    ``comm=None``: one process on the whole batch, no communication (the reference).
    ``arch``: where to train (default: the CPU).
    """
    import hpcgpu

    config = TrainConfig(optimizer=optimizer, lr=3e-3, weight_decay=0.01, warmup_steps=5,
                         total_steps=n_steps, global_batch_size=global_batch,
                         accum_steps=accum_steps, clip_norm=clip_norm, precision=precision, seed=7)
    trainer = Trainer(make_model(), config)
    arch = arch if arch is not None else hpcgpu.arch.CPU()
    if comm is None:
        sync, rank, n_ranks = LocalSync(), 0, 1
    else:
        sync, rank, n_ranks = make_sync(comm, arch, zero, bucket_mb), comm.rank, comm.size
    state = init_train_state(trainer, arch.xp, sync)
    x, y = synthetic_data()
    losses = []
    with ShardedLoader(ArraySource(x, y), global_batch, seed=11, rank=rank, n_ranks=n_ranks,
                       arch=arch) as loader:
        for _ in range(n_steps):
            batch = loader.next()
            losses.append(train_step(trainer, state, batch.x, batch.y, batch.sample_index, sync).loss)
    return np.array(losses), to_numpy(state.precision.master_params).copy(), sync


def train_steps(runner, loader, n_steps):
    """Run ``n_steps`` of ``runner`` (a :class:`~apps.train.parallel.trainer.ParallelTrainer`) on
    ``loader``'s batches; the app runs the same steps through the simulation driver
    (:class:`apps.train.run.parallel_model.ParallelTrainingModel`).

    Returns
    -------
    list of float
        The global mean loss of every step (the same on every rank).
    """
    losses = []
    for _ in range(n_steps):
        batch = loader.next()
        losses.append(runner.step(batch.x, batch.y, batch.sample_index).loss)
    return losses


def gpu_arch_or_skip(comm):
    """The GPU architecture, or a skip (the same decision on every rank) without enough GPUs."""
    import pytest

    cupy = pytest.importorskip("cupy")
    try:
        n_devices = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        n_devices = 0
    if n_devices < comm.local_size:
        pytest.skip(f"needs {comm.local_size} GPU(s) on this node, found {n_devices}")
    import hpcgpu

    return hpcgpu.arch.auto(comm, backend="cupy")


def relative_difference(a, b):
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))

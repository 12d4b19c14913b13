"""Data parallelism on the CPU: N ranks reproduce the one-process run.

Each multi-rank test body runs on every rank (``mpi`` marker) and also trains the
one-process reference in the same process, on the whole global batch with no
communication, then compares loss curves and parameters.
"""

import numpy as np
import pytest

from distributed_cases import (N_CLASSES, N_FEATURES, relative_difference, synthetic_data,
                               train_curve)

from apps.train.data.dataset import shard_bounds
from apps.train.parallel.distributed import DataParallel, make_sync, plan_buckets, replicas_identical
from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.nn.models import mnist1d_mlp
from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step


@pytest.mark.mpi(ranks=[1, 2, 3, 4])
def test_n_ranks_and_accumulation_reproduce_one_process(comm):
    """N ranks x B/N == 1 process x B over 50 steps (fp32, <= 1e-5 relative), for N = 1..4
    -- so any two rank counts agree; and accumulation 2 x (B/2) == 1 x B likewise."""
    reference_losses, reference_params, _ = train_curve(None, 50, global_batch=24)
    losses, params, sync = train_curve(comm, 50, global_batch=24)
    assert relative_difference(losses, reference_losses) <= 1e-5, (losses[-3:], reference_losses[-3:])
    assert np.max(np.abs(params - reference_params)) <= 1e-4 * np.max(np.abs(reference_params))
    assert replicas_identical(comm, params)
    if comm.size > 1:
        assert len(sync.buckets) > 3           # several buckets were in flight during backward
        assert sync.overlap_stats()["exposed_wait_ms"] >= 0
    accumulated, _, _ = train_curve(comm, 50, global_batch=24, accum_steps=2)
    assert relative_difference(accumulated, reference_losses) <= 1e-5
    assert reference_losses[-1] < 0.7 * reference_losses[0]   # it learns


@pytest.mark.mpi(ranks=[2, 3])
def test_zero1_equals_plain_data_parallelism(comm):
    """Sharded optimiser state (reduce-scatter, shard step, all-gather) == ZeRO-0."""
    for precision, clip_norm, tolerance in (("fp64", 0.5, 1e-12), ("fp32", None, 1e-6)):
        plain, plain_params, _ = train_curve(comm, 12, global_batch=24, precision=precision,
                                             clip_norm=clip_norm)
        sharded, sharded_params, sync = train_curve(comm, 12, global_batch=24, zero=1,
                                                    precision=precision, clip_norm=clip_norm)
        lo, hi = sync.owned_range(sharded_params.shape[0])
        assert 0 < hi - lo < sharded_params.shape[0]
        assert relative_difference(sharded, plain) <= tolerance, precision
        assert np.allclose(sharded_params, plain_params, rtol=tolerance, atol=tolerance)
        assert replicas_identical(comm, sharded_params)


@pytest.mark.mpi(ranks=[2])
def test_fp16_overflow_on_one_rank_skips_the_step_everywhere(comm):
    """An inf gradient on rank 1 only: every rank skips the step and halves the loss scale."""
    import hpcgpu

    config = TrainConfig(optimizer="adamw", lr=1e-3, global_batch_size=8, precision="fp16",
                         init_loss_scale=2.0**10, seed=1)
    trainer = Trainer(mnist1d_mlp(hidden_size=16, n_inputs=N_FEATURES, n_classes=N_CLASSES), config)
    sync = make_sync(comm, hpcgpu.arch.CPU(), 0, bucket_mb=0.001)
    state = init_train_state(trainer, np, sync)
    x, y = synthetic_data()
    lo, hi = shard_bounds(8, comm.rank, comm.size)
    index = np.arange(lo, hi, dtype=np.int64)
    before = state.precision.master_params.copy()
    poisoned = x[lo:hi].copy()
    if comm.rank == 1:
        poisoned[0] *= 1e5            # fp16 activations overflow (max 65504)
    metrics = train_step(trainer, state, poisoned, y[lo:hi], index, sync)
    assert not metrics.applied and not np.isfinite(metrics.grad_norm)
    assert state.precision.loss_scale == 2.0**9 and state.precision.scaler.skipped_steps == 1
    assert np.array_equal(state.precision.master_params, before)
    metrics = train_step(trainer, state, x[lo:hi], y[lo:hi], index, sync)
    assert metrics.applied and np.isfinite(metrics.loss)
    assert not np.array_equal(state.precision.master_params, before)
    assert replicas_identical(comm, state.precision.master_params)


@pytest.mark.mpi(ranks=[2])
def test_fp16_data_parallel_follows_fp32(comm):
    """Mixed precision (fp16 gradients allreduced) tracks the fp32 curve to fp16 accuracy."""
    fp32, _, _ = train_curve(comm, 15, global_batch=24)
    fp16, params, _ = train_curve(comm, 15, global_batch=24, precision="fp16")
    assert params.dtype == np.float32
    assert relative_difference(fp16, fp32) <= 2e-2


def test_buckets_tile_the_buffer_in_order():
    buckets = plan_buckets(1000, 4, bucket_mb=0.001)        # 250 floats per bucket
    assert buckets == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    assert plan_buckets(10, 2, bucket_mb=25.0) == [(0, 10)]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(10, 4, bucket_mb=0)


def test_loader_shards_concatenate_to_the_global_batch():
    """Rank shards of every step, concatenated in rank order, are the 1-rank batch."""
    x, y = synthetic_data()
    source = ArraySource(x, y)
    steps = 13      # crosses an epoch boundary (240 // 24 = 10 batches per epoch)
    with ShardedLoader(source, 24, seed=3, rank=0, n_ranks=1) as whole:
        expected = [(b.x.copy(), b.y.copy(), b.epoch) for b in (whole.next() for _ in range(steps))]
    shards = []
    for rank in range(3):
        with ShardedLoader(source, 24, seed=3, rank=rank, n_ranks=3) as loader:
            shards.append([(b.x.copy(), b.y.copy(), b.sample_index.copy()) for b in
                           (loader.next() for _ in range(steps))])
    for step in range(steps):
        assert np.array_equal(np.concatenate([s[step][0] for s in shards]), expected[step][0])
        assert np.array_equal(np.concatenate([s[step][1] for s in shards]), expected[step][1])
        assert np.array_equal(np.concatenate([s[step][2] for s in shards]), np.arange(24))
    assert expected[12][2] == 1
    with ShardedLoader(source, 24, seed=3, rank=0, n_ranks=1, start_step=12) as resumed:
        batch = resumed.next()
        assert batch.step == 12 and np.array_equal(batch.x, expected[12][0])


def test_loader_reads_hdf5_rows_on_demand(tmp_path):
    import h5py

    from apps.train.data.loader import HDF5Source, open_training_data

    x, y = synthetic_data()
    with h5py.File(tmp_path / "d.h5", "w") as handle:
        handle["x"], handle["y"] = x, y
    data = open_training_data(str(tmp_path / "d.h5"))
    assert isinstance(data.source, HDF5Source) and data.test is None and data.n_classes == N_CLASSES
    with ShardedLoader(data.source, 24, seed=3, rank=1, n_ranks=2) as from_file, \
            ShardedLoader(ArraySource(x, y), 24, seed=3, rank=1, n_ranks=2) as from_memory:
        for _ in range(3):
            a, b = from_file.next(), from_memory.next()
            assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)


def test_single_rank_data_parallel_has_no_hook():
    class OneRank:
        rank, size = 0, 1

    sync = DataParallel(OneRank(), arch=None)
    assert sync.on_grads_ready is None

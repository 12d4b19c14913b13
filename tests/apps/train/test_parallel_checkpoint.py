"""Checkpoints of split models (apps.train.parallel.sharded_checkpoint): bitwise restarts and resharding.

A run of ``STEPS`` steps saves at step ``SAVE_AT`` and goes on; a fresh runner restores that
checkpoint and trains the remaining steps. On the grid that wrote it the continuation is BITWISE the
uninterrupted run (losses and final parameters). On another grid the unsplit parameters and optimiser
state right after the restore equal the saved ones exactly, and the losses agree with the
uninterrupted run to ``LOSS_TOLERANCE`` (1e-10, the grid-agreement tolerance of
test_tensor_parallel.py: another grid sums its partial products in another order).

The multi-rank bodies run on every rank (``mpi`` marker, under a timeout, the failing rank's
traceback in the report); a restart on fewer ranks than the job runs on a sub-communicator.
"""

import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from distributed_cases import gpu_arch_or_skip, synthetic_data, train_steps
from test_tensor_parallel import LOSS_TOLERANCE, SPEC, NoCollectives, fake_grid, relative, train_config

import hpcgpu
from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import make_grid
from apps.train.parallel.trainer import ParallelTrainer, build_parallel_model
from apps.train.parallel.shard_map import shard_pieces, tensor_map
from apps.train.parallel.sharded_checkpoint import ShardedCheckpoint, logical_state
from apps.train.parallel.tensor_parallel import MLPSpec
from hpcgpu.checkpoint import CheckpointManager
from hpcgpu.errors import ConfigurationError

STEPS, SAVE_AT = 10, 4
BATCH, LOADER_SEED = 24, 11


def make_runner(grid, micro_batches=1, spec=SPEC, optimizer="adamw", precision="fp64", arch=None):
    config = train_config(STEPS, precision)
    config.optimizer = optimizer
    return ParallelTrainer(grid, spec, config, arch=arch, micro_batches=micro_batches, bucket_mb=0.002)


def train(runner, start, n_steps):
    """Losses of ``n_steps`` steps from step ``start`` (the loader continues there)."""
    x, y = synthetic_data()
    grid = runner.grid
    with ShardedLoader(ArraySource(x, y), BATCH, seed=LOADER_SEED, rank=grid.data_rank,
                       n_ranks=grid.data_size, start_step=start, arch=runner.arch) as loader:
        return np.array(train_steps(runner, loader, n_steps))


def shared_directory(comm):
    """A fresh directory every rank of ``comm`` sees (rank 0 makes it)."""
    return Path(comm.broadcast(tempfile.mkdtemp(prefix="parallel_ckpt_") if comm.rank == 0 else None))


def remove_directory(comm, directory):
    comm.barrier()
    if comm.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def assert_states_equal(found, expected, what):
    assert sorted(found) == sorted(expected), what
    for key, value in expected.items():
        assert np.asarray(found[key]).dtype == np.asarray(value).dtype, (what, key)
        assert np.array_equal(np.asarray(found[key]), np.asarray(value)), (what, key)


def interrupted_run(comm, sizes, directory, micro_batches=1, optimizer="adamw", precision="fp64"):
    """Uninterrupted losses, the state saved at ``SAVE_AT``, the final state and the checkpoint path."""
    runner = make_runner(make_grid(comm, *sizes), micro_batches, optimizer=optimizer, precision=precision)
    first = train(runner, 0, SAVE_AT)
    manager = CheckpointManager(comm, directory, app="apps.train")
    info = ShardedCheckpoint(runner).save(manager, history={"loss": list(first)})
    manager.close()
    saved = logical_state(runner)
    assert np.array_equal(saved["params"], runner.full_parameters())   # the one-process layout
    if comm.rank == 0:   # one global dataset per array, readable without this code
        with h5py.File(Path(info.path) / "checkpoint.h5", "r") as handle:
            assert np.array_equal(handle["fields/params"][...], saved["params"])
            for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
                if f"optimizer/{key}" in saved:
                    assert np.array_equal(handle[f"fields/optimizer.{key}"][...], saved[f"optimizer/{key}"])
    losses = np.concatenate([first, train(runner, SAVE_AT, STEPS - SAVE_AT)])
    return losses, saved, logical_state(runner), info.path


def restarted_run(comm, sizes, path, micro_batches=1, optimizer="adamw", precision="fp64"):
    """Restore ``path`` onto a fresh ``sizes`` grid of ``comm``: the state just after the restore, the
    losses of the remaining steps and the final state."""
    runner = make_runner(make_grid(comm, *sizes), micro_batches, optimizer=optimizer, precision=precision)
    manager = CheckpointManager(comm, Path(path).parent, app="apps.train")
    history = ShardedCheckpoint(runner).restore(manager, path, steps=STEPS)
    manager.close()
    assert runner.state.step == SAVE_AT and len(history["loss"]) == SAVE_AT
    loaded = logical_state(runner)
    losses = train(runner, SAVE_AT, STEPS - SAVE_AT)
    return loaded, losses, logical_state(runner)


def check_restarts(comm, sizes, micro_batches, reshard_to, optimizer="adamw", precision="fp64",
                   tolerance=LOSS_TOLERANCE):
    """Save on ``sizes``; restart bitwise there and, within ``tolerance``, on each grid of ``reshard_to``
    (``(sizes, micro_batches)``; grids of fewer ranks than the job run on its first ranks)."""
    directory = shared_directory(comm)
    try:
        losses, saved, final, path = interrupted_run(comm, sizes, directory, micro_batches, optimizer, precision)
        loaded, continued, restarted_final = restarted_run(comm, sizes, path, micro_batches, optimizer, precision)
        assert_states_equal(loaded, saved, f"{sizes}: state after the restore")
        assert np.array_equal(continued, losses[SAVE_AT:]), (sizes, continued, losses[SAVE_AT:])
        assert_states_equal(restarted_final, final, f"{sizes}: final state")
        for other, other_micro in reshard_to:
            n_ranks = int(np.prod(other))
            sub = hpcgpu.Communicator(comm.mpi.Split(0 if comm.rank < n_ranks else 1, comm.rank))
            if comm.rank < n_ranks:
                loaded, continued, other_final = restarted_run(sub, other, path, other_micro, optimizer, precision)
                assert_states_equal(loaded, saved, f"{sizes} -> {other}: state after the restore")
                assert relative(continued, losses[SAVE_AT:]) <= tolerance, (sizes, other)
                assert relative(other_final["params"], final["params"]) <= tolerance, (sizes, other)
                if comm.rank == 0:
                    print(f"{sizes} -> {other}: losses {relative(continued, losses[SAVE_AT:]):.2e}, parameters "
                          f"{relative(other_final['params'], final['params']):.2e}")
            sub.mpi.Free()
            comm.barrier()
    finally:
        remove_directory(comm, directory)


# ------------------------------------------------------------------ one process

@pytest.mark.parametrize("tensor_size,pipeline_size", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_shards_cover_the_unsplit_model_once(tensor_size, pipeline_size):
    """Over the ranks of one replica the written pieces tile the unsplit buffer exactly once; every
    rank's pieces (written or not) fill its whole buffer."""
    n_logical = None
    covered = None
    for pipeline_rank in range(pipeline_size):
        for tensor_rank in range(tensor_size):
            parallel = build_parallel_model(fake_grid(tensor_size, tensor_rank, pipeline_size, pipeline_rank), SPEC,
                                            tensor_collectives=NoCollectives())
            if covered is None:
                n_logical = parallel.reference().layout.n_params
                covered = np.zeros(n_logical, dtype=int)
            pieces = shard_pieces(parallel, 0, tensor_rank)
            filled = np.zeros(parallel.model.n_params, dtype=int)
            for piece in pieces:
                filled[piece.local_offset:piece.local_stop] += 1
                if piece.writes:
                    covered[piece.logical_indices] += 1
            assert np.all(filled == 1)
            assert not any(piece.writes for piece in shard_pieces(parallel, 1, tensor_rank))   # replica 1
    assert np.all(covered == 1)


def test_tensor_map_names_how_each_tensor_is_split():
    parallel = build_parallel_model(fake_grid(1, 0, 2, 0), SPEC)
    tensors = tensor_map(parallel)
    splits = dict(zip(tensors["name"], tensors["split"]))
    assert list(splits.values()).count("column") == 2 * SPEC.depth   # W1 and b1 of each block
    assert list(splits.values()).count("row") == SPEC.depth          # W2 of each block
    assert all(split == "replicated" for name, split in splits.items() if "LayerNorm" in name)
    assert sorted(set(tensors["stage"])) == [0, 1]
    assert sum(int(np.prod(shape)) for shape in tensors["shape"]) == parallel.reference().layout.n_params


# ------------------------------------------------------------------ 2 ranks

@pytest.mark.mpi(ranks=[2], timeout=240)
def test_tensor_parallel_checkpoint_restarts_bitwise_and_reshards(comm):
    """Saved at 1 x 2 x 1: bitwise on 1 x 2 x 1; resharded onto 1 x 1 x 2 (M = 2), 2 x 1 x 1 and
    1 x 1 x 1 with the same unsplit state and losses to 1e-10."""
    check_restarts(comm, (1, 2, 1), 1, [((1, 1, 2), 2), ((2, 1, 1), 1), ((1, 1, 1), 1)])


@pytest.mark.mpi(ranks=[2], timeout=240)
def test_pipeline_checkpoint_restarts_bitwise_and_reshards(comm):
    """Saved at 1 x 1 x 2 (M = 2, SGD with momentum): bitwise on 1 x 1 x 2; resharded onto 1 x 2 x 1."""
    check_restarts(comm, (1, 1, 2), 2, [((1, 2, 1), 1)], optimizer="sgd")


@pytest.mark.mpi(ranks=[2], timeout=240)
def test_mixed_precision_checkpoint_restarts_bitwise_and_reshards(comm):
    """fp16 compute with fp32 masters and the dynamic loss scaler, saved at 1 x 2 x 1: bitwise on
    1 x 2 x 1; resharded onto 2 x 1 x 1 with the same fp32 state and losses to 2e-3 (the fp16
    grid-agreement tolerance of test_tensor_parallel.py)."""
    check_restarts(comm, (1, 2, 1), 1, [((2, 1, 1), 1)], precision="fp16", tolerance=2e-3)


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_another_model_is_refused_on_every_rank(comm):
    """A checkpoint of hidden 32 does not restart a model of hidden 64 (nor depth 2): the same
    ConfigurationError on every rank, and the ranks go on communicating afterwards."""
    directory = shared_directory(comm)
    try:
        runner = make_runner(make_grid(comm, 1, 2, 1))
        manager = CheckpointManager(comm, directory, app="apps.train")
        path = ShardedCheckpoint(runner).save(manager).path
        for spec, expected in ((MLPSpec(SPEC.n_inputs, SPEC.n_classes, width=16, hidden=64, depth=3, dropout=0.1),
                                "has hidden 32, this run's hidden 64"),
                               (MLPSpec(SPEC.n_inputs, SPEC.n_classes, width=16, hidden=32, depth=2, dropout=0.1),
                                "has depth 3, this run's depth 2")):
            other = make_runner(make_grid(comm, 1, 1, 2), 2, spec=spec)
            with pytest.raises(ConfigurationError, match=expected) as caught:
                ShardedCheckpoint(other).restore(manager, path, steps=STEPS)
            messages = comm.mpi.allgather(str(caught.value))
            assert len(set(messages)) == 1 and "reshards onto another grid" in messages[0]
        manager.close()
    finally:
        remove_directory(comm, directory)


# ------------------------------------------------------------------ 4 ranks

@pytest.mark.mpi(ranks=[4], timeout=480)
def test_hybrid_checkpoint_restarts_bitwise_and_reshards(comm):
    """Saved at 1 x 2 x 2 (M = 2): bitwise on 1 x 2 x 2; resharded onto 2 x 1 x 1 and 2 x 2 x 1.
    Saved at 2 x 2 x 1: bitwise there."""
    check_restarts(comm, (1, 2, 2), 2, [((2, 1, 1), 1), ((2, 2, 1), 1)])
    check_restarts(comm, (2, 2, 1), 1, [])


# ------------------------------------------------------------------ GPU (1 and 2 GPUs)

@pytest.mark.gpu
@pytest.mark.mpi(ranks=[1, 2], timeout=300)
def test_gpu_checkpoint_restarts_bitwise_and_on_the_cpu(comm):
    """On GPUs (1 x N x 1, fp64): a restart is bitwise the uninterrupted GPU run, and the GPU
    checkpoint restores onto a CPU runner of the same grid with the same unsplit state."""
    arch = gpu_arch_or_skip(comm)
    sizes = (1, comm.size, 1)
    directory = shared_directory(comm)
    try:
        runner = make_runner(make_grid(comm, *sizes), arch=arch)
        first = train(runner, 0, SAVE_AT)
        manager = CheckpointManager(comm, directory, app="apps.train")
        path = ShardedCheckpoint(runner).save(manager).path
        saved = logical_state(runner)
        losses = np.concatenate([first, train(runner, SAVE_AT, STEPS - SAVE_AT)])
        final = logical_state(runner)
        restarted = make_runner(make_grid(comm, *sizes), arch=arch)
        ShardedCheckpoint(restarted).restore(manager, path, steps=STEPS)
        assert_states_equal(logical_state(restarted), saved, "GPU restart")
        assert np.array_equal(train(restarted, SAVE_AT, STEPS - SAVE_AT), losses[SAVE_AT:])
        assert_states_equal(logical_state(restarted), final, "GPU final state")
        on_cpu = make_runner(make_grid(comm, *sizes))
        ShardedCheckpoint(on_cpu).restore(manager, path, steps=STEPS)
        assert_states_equal(logical_state(on_cpu), saved, "GPU checkpoint on the CPU")
        manager.close()
    finally:
        remove_directory(comm, directory)

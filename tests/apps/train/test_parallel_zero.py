"""ZeRO-1 over the data axis of a D x T x P grid (ParallelTrainer(zero_stage=1)), on the CPU.

Each (tensor, pipeline) position's D data replicas split that rank's optimiser state: gradient
reduce-scatter over the data group, a step of the owned part, an all-gather of the master
parameters (:class:`apps.train.parallel.zero.ZeroRedundancy` on ``grid.data``). Against the same grid
without ZeRO: with D = 2 the reduce-scatter adds the same two numbers as the allreduce, and the
update is elementwise, so the only difference is the summation order of the gradient norm (partial
sums per owned part, then over the data group), which moves the clipping factor by an ulp: the
losses must agree to ``LOSS_TOLERANCE`` (1e-10, the grid-agreement tolerance; measured ~3e-16 after
20 fp64 steps at 2 x 2 x 1 and 2 x 1 x 2), and without clipping they are bitwise equal. The optimiser
state per rank is 1/D of the unsharded one (to the rounding of ``n // D``).

Checkpoints hold the unsplit state whether or not ZeRO wrote them: a ZeRO-1 run restarts bitwise on
its own grid and reshards onto grids with and without ZeRO.
"""

import numpy as np
import pytest

import hpcgpu
from distributed_cases import gpu_arch_or_skip, synthetic_data, train_steps
from test_parallel_checkpoint import (BATCH, LOADER_SEED, SAVE_AT, STEPS, assert_states_equal,
                                      remove_directory, shared_directory)
from test_tensor_parallel import LOSS_TOLERANCE, SPEC, NoCollectives, fake_grid, relative, train_config

from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import make_grid
from apps.train.parallel.trainer import ParallelTrainer, build_parallel_model
from apps.train.parallel.shard_map import owned_pieces
from apps.train.parallel.sharded_checkpoint import ShardedCheckpoint, logical_state
from apps.train.parallel.zero import shard_ranges
from hpcgpu.checkpoint import CheckpointManager
from hpcgpu.errors import ConfigurationError

CURVE_STEPS = 20


def make_runner(grid, zero_stage, micro_batches=1, precision="fp64", arch=None, steps=STEPS,
                clip_norm=1.0):
    config = train_config(steps, precision)
    config.clip_norm = clip_norm
    return ParallelTrainer(grid, SPEC, config, arch=arch, micro_batches=micro_batches, bucket_mb=0.002,
                           zero_stage=zero_stage)


def train(runner, start, n_steps):
    x, y = synthetic_data()
    grid = runner.grid
    with ShardedLoader(ArraySource(x, y), BATCH, seed=LOADER_SEED, rank=grid.data_rank,
                       n_ranks=grid.data_size, start_step=start, arch=runner.arch) as loader:
        return np.array(train_steps(runner, loader, n_steps))


def zero_against_plain(comm, sizes, micro_batches=1, precision="fp64", arch=None, clip_norm=1.0):
    """Losses, unsplit parameters and optimiser-state bytes of ``sizes`` with and without ZeRO-1."""
    runs = {}
    for zero_stage in (0, 1):
        runner = make_runner(make_grid(comm, *sizes), zero_stage, micro_batches, precision, arch,
                             steps=CURVE_STEPS, clip_norm=clip_norm)
        losses = train(runner, 0, CURVE_STEPS)
        runs[zero_stage] = (losses, runner.full_parameters(), runner.optimizer_state_bytes(), runner)
    return runs


def check_memory(runs, data_size):
    """ZeRO-1's optimiser state is 1/D of the plain one (to the rounding of the parts)."""
    plain, zero = runs[0][2], runs[1][2]
    runner = runs[1][3]
    n_params = runner.parallel_model.model.n_params
    lo, hi = runner.sync.owned_range(n_params)
    assert zero == plain * (hi - lo) // n_params
    assert abs(zero / plain - 1 / data_size) <= data_size / n_params


# ------------------------------------------------------------------ one process

@pytest.mark.parametrize("data_size,tensor_size,pipeline_size", [(2, 1, 1), (3, 2, 1), (2, 1, 2), (4, 2, 2)])
def test_owned_pieces_cover_the_unsplit_model_once(data_size, tensor_size, pipeline_size):
    """Over the D x T x P ranks the owned parts' written pieces tile the unsplit buffer exactly once,
    and each rank's pieces fill its whole owned part."""
    covered = None
    for pipeline_rank in range(pipeline_size):
        for tensor_rank in range(tensor_size):
            parallel = build_parallel_model(fake_grid(tensor_size, tensor_rank, pipeline_size, pipeline_rank),
                                            SPEC, tensor_collectives=NoCollectives())
            if covered is None:
                covered = np.zeros(parallel.reference().layout.n_params, dtype=int)
            for lo, hi in shard_ranges(parallel.model.n_params, data_size):
                filled = np.zeros(hi - lo, dtype=int)
                for piece in owned_pieces(parallel, tensor_rank, lo, hi):
                    filled[piece.local_offset:piece.local_stop] += 1
                    if piece.writes:
                        covered[piece.logical_indices] += 1
                assert np.all(filled == 1)
    assert np.all(covered == 1)


# ------------------------------------------------------------------ 4 ranks

@pytest.mark.mpi(ranks=[4], timeout=300)
@pytest.mark.parametrize("sizes,micro_batches", [((2, 2, 1), 1), ((2, 1, 2), 2)])
def test_zero_matches_the_same_grid_without_zero(comm, sizes, micro_batches):
    """2 x 2 x 1 and 2 x 1 x 2 (M = 2), fp64 AdamW with clipping: ZeRO-1 and plain losses and final
    parameters agree to 1e-10; every replica holds the same parameters; the optimiser state is 1/2."""
    runs = zero_against_plain(comm, sizes, micro_batches)
    (plain_losses, plain_params, _, _), (zero_losses, zero_params, _, zero_runner) = runs[0], runs[1]
    loss_difference = relative(zero_losses, plain_losses)
    param_difference = relative(zero_params, plain_params)
    assert loss_difference <= LOSS_TOLERANCE, (sizes, loss_difference)
    assert param_difference <= LOSS_TOLERANCE, (sizes, param_difference)
    check_memory(runs, sizes[0])
    digests = comm.mpi.allgather(zero_runner.state.precision.master_params.tobytes())
    data_peers = zero_runner.grid.data.mpi.allgather(comm.rank)
    assert len({digests[rank] for rank in data_peers}) == 1   # the all-gather left every replica equal
    if comm.rank == 0:
        print(f"{sizes}: ZeRO-1 vs plain: losses {loss_difference:.2e}, parameters {param_difference:.2e}, "
              f"bitwise losses {np.array_equal(zero_losses, plain_losses)}; optimiser state "
              f"{runs[1][2]} vs {runs[0][2]} bytes per rank")


@pytest.mark.mpi(ranks=[4], timeout=300)
def test_zero_without_clipping_is_bitwise_at_two_replicas(comm):
    """Without gradient clipping the norm changes nothing (factor 1), and with D = 2 the
    reduce-scatter adds the same two numbers as the allreduce: 2 x 2 x 1 with ZeRO-1 is BITWISE
    the plain run (losses and final parameters)."""
    runs = zero_against_plain(comm, (2, 2, 1), clip_norm=None)
    assert np.array_equal(runs[1][0], runs[0][0])
    assert np.array_equal(runs[1][1], runs[0][1])


@pytest.mark.mpi(ranks=[4], timeout=300)
def test_zero_mixed_precision_matches_the_same_grid_without_zero(comm):
    """fp16 compute with fp32 masters at 2 x 2 x 1: ZeRO-1 (fp16 gradients reduce-scattered, the fused
    step on the owned part) agrees with the plain run to the fp16 grid tolerance 2e-3."""
    runs = zero_against_plain(comm, (2, 2, 1), precision="fp16")
    assert relative(runs[1][0], runs[0][0]) <= 2e-3
    check_memory(runs, 2)


@pytest.mark.mpi(ranks=[4], timeout=400)
def test_zero_checkpoint_restarts_bitwise_and_reshards(comm):
    """Saved by ZeRO-1 at 2 x 2 x 1: the file holds the same unsplit state as a plain run's; bitwise
    restart on 2 x 2 x 1 with ZeRO; resharded onto 2 x 2 x 1 without ZeRO, 2 x 1 x 2 with ZeRO
    (M = 2) and 1 x 2 x 1 with the same state and losses to 1e-10; a plain checkpoint restarts
    with ZeRO-1."""
    directory = shared_directory(comm)
    try:
        runner = make_runner(make_grid(comm, 2, 2, 1), 1)
        first = train(runner, 0, SAVE_AT)
        manager = CheckpointManager(comm, directory, app="apps.train")
        path = ShardedCheckpoint(runner).save(manager, history={"loss": list(first)}).path
        manager.close()
        saved = logical_state(runner)
        losses = np.concatenate([first, train(runner, SAVE_AT, STEPS - SAVE_AT)])
        final = logical_state(runner)

        plain = make_runner(make_grid(comm, 2, 2, 1), 0)
        train(plain, 0, SAVE_AT)
        plain_saved = logical_state(plain)
        for key, value in saved.items():   # the unsplit state does not depend on ZeRO (to rounding)
            assert relative(np.asarray(value, dtype=float), np.asarray(plain_saved[key], dtype=float)) \
                <= LOSS_TOLERANCE, key

        for sizes, zero_stage, micro_batches in [((2, 2, 1), 1, 1), ((2, 2, 1), 0, 1), ((2, 1, 2), 1, 2),
                                                 ((1, 2, 1), 0, 1)]:
            n_ranks = int(np.prod(sizes))
            sub = hpcgpu.Communicator(comm.mpi.Split(0 if comm.rank < n_ranks else 1, comm.rank))
            if comm.rank < n_ranks:
                other = make_runner(make_grid(sub, *sizes), zero_stage, micro_batches)
                manager = CheckpointManager(sub, directory, app="apps.train")
                ShardedCheckpoint(other).restore(manager, path, steps=STEPS)
                manager.close()
                assert_states_equal(logical_state(other), saved, f"-> {sizes} zero {zero_stage}")
                continued = train(other, SAVE_AT, STEPS - SAVE_AT)
                if (sizes, zero_stage) == ((2, 2, 1), 1):
                    assert np.array_equal(continued, losses[SAVE_AT:])
                    assert_states_equal(logical_state(other), final, "bitwise restart")
                else:
                    assert relative(continued, losses[SAVE_AT:]) <= LOSS_TOLERANCE, (sizes, zero_stage)
            sub.mpi.Free()
            comm.barrier()

        # a checkpoint without ZeRO restarts with it
        manager = CheckpointManager(comm, directory / "plain", app="apps.train")
        plain_path = ShardedCheckpoint(plain).save(manager).path
        manager.close()
        zero_runner = make_runner(make_grid(comm, 2, 1, 2), 1, micro_batches=2)
        manager = CheckpointManager(comm, directory / "plain", app="apps.train")
        ShardedCheckpoint(zero_runner).restore(manager, plain_path, steps=STEPS)
        manager.close()
        assert_states_equal(logical_state(zero_runner), plain_saved, "plain -> ZeRO-1 2 x 1 x 2")
    finally:
        remove_directory(comm, directory)


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_an_unknown_zero_stage_is_refused_on_every_rank(comm):
    with pytest.raises(ConfigurationError, match="zero stage"):
        make_runner(make_grid(comm, 2, 1, 1), 2)


# ------------------------------------------------------------------ GPUs

@pytest.mark.gpu
@pytest.mark.mpi(ranks=[4], timeout=400)
def test_gpu_zero_matches_the_same_grid_without_zero(comm):
    """On 4 GPUs (NCCL reduce-scatter and all-gather over the data group): 2 x 2 x 1 and 2 x 1 x 2
    with ZeRO-1 agree with the plain GPU runs and with the CPU ZeRO-1 runs to 1e-10 (fp64)."""
    arch = gpu_arch_or_skip(comm)
    for sizes, micro_batches in [((2, 2, 1), 1), ((2, 1, 2), 2)]:
        gpu = zero_against_plain(comm, sizes, micro_batches, arch=arch)
        cpu = zero_against_plain(comm, sizes, micro_batches, arch=hpcgpu.arch.CPU())
        assert relative(gpu[1][0], gpu[0][0]) <= LOSS_TOLERANCE, sizes
        assert relative(gpu[1][1], cpu[1][1]) <= LOSS_TOLERANCE, sizes
        check_memory(gpu, sizes[0])

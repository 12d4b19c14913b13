"""Tensor parallelism (apps.train.parallel.tensor_parallel) and the D x T x P grid, on the CPU.

The multi-rank bodies run on every rank (``mpi`` marker, under a timeout, the failing rank's
traceback in the report) and compute their one-process reference in the same process.

Tolerances (float64): a tensor-parallel product sums its T partial products in another order than
the unsplit GEMM, so single results differ by a few units in the last place (~1e-16 relative); the
gradient tests allow 1e-12. Over 50 AdamW steps those differences are carried along but not
amplified much on this small, well-conditioned problem (measured: <= 1e-15 relative), so the loss
curves must agree to 1e-10: a real error (a missing allreduce, a wrong shard, a replicated gradient
counted twice in the norm) changes the loss in the 3rd-4th digit at the latest after a few steps.
"""

import numpy as np
import pytest

from distributed_cases import N_CLASSES, N_FEATURES, synthetic_data, train_steps

from apps.train.nn.layers import ForwardContext
from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import ParallelGrid, check_grid, grid_coordinates, make_grid
from apps.train.parallel.trainer import ParallelTrainer, build_parallel_model, init_parallel_parameters
from apps.train.nn.params import init_flat_parameters
from apps.train.nn.sequential import Sequential
from apps.train.parallel.tensor_parallel import (ColumnParallelLinear, MLPSpec, RowParallelLinear,
                                        TensorGroup, mlp_block, mlp_layers)
from apps.train.training.trainer import TrainConfig, train_step
from hpcgpu.errors import ConfigurationError

SPEC = MLPSpec(N_FEATURES, N_CLASSES, width=16, hidden=32, depth=3, dropout=0.1)
GRADIENT_TOLERANCE = 1e-12
LOSS_TOLERANCE = 1e-10


def fake_grid(tensor_size=1, tensor_rank=0, pipeline_size=1, pipeline_rank=0):
    """A grid without communicators: enough to build a rank's model and its initialisation."""
    return ParallelGrid(None, None, None, None, None, 1, tensor_size, pipeline_size, 0,
                        tensor_rank, pipeline_rank, True)


class NoCollectives:
    def allreduce(self, array, op):
        raise AssertionError("no collective expected while building and initialising")


def relative(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def train_config(steps=50, precision="fp64"):
    return TrainConfig(optimizer="adamw", lr=3e-3, weight_decay=0.01, warmup_steps=5,
                       total_steps=steps, global_batch_size=24, precision=precision, clip_norm=1.0,
                       seed=7)


def grid_curve(grid, steps=50, micro_batches=1, schedule="1f1b", precision="fp64"):
    """Losses, unsplit final parameters and the runner of ``steps`` steps on ``grid`` (every rank)."""
    x, y = synthetic_data()
    runner = ParallelTrainer(grid, SPEC, train_config(steps, precision),
                             micro_batches=micro_batches, schedule=schedule, bucket_mb=0.002)
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=grid.data_rank,
                       n_ranks=grid.data_size) as loader:
        losses = np.array(train_steps(runner, loader, steps))
    return losses, runner.full_parameters(), runner


def one_process_curve(comm, steps=50, precision="fp64"):
    """The 1 x 1 x 1 reference, computed by this rank alone."""
    import hpcgpu

    alone = hpcgpu.Communicator(comm.mpi.Split(comm.rank, 0))
    return grid_curve(make_grid(alone, 1, 1, 1), steps, precision=precision)


def evaluation_agrees(runner, reference_runner):
    """Test loss and accuracy of a split model equal the one-process model's (1e-12)."""
    x, y = synthetic_data(seed=9)
    loss, accuracy = runner.evaluate(x, y, batch_size=100)
    reference_loss, reference_accuracy = reference_runner.evaluate(x, y, batch_size=100)
    return abs(loss - reference_loss) <= 1e-12 * reference_loss and accuracy == reference_accuracy


# ------------------------------------------------------------------ single process

def test_grid_validation_is_replicated_and_explains_the_fix():
    check_grid(8, 2, 2, 2)
    with pytest.raises(ConfigurationError, match="D x T x P = 1 x 2 x 2 = 4 ranks, but the job has 2"):
        check_grid(2, 1, 2, 2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="positive integer"):
            check_grid(2, 2, bad, 1)
    with pytest.raises(ConfigurationError, match="not divisible by the tensor-parallel size 3"):
        SPEC.validate(3)


def test_tensor_axis_is_fastest():
    # world rank = t + T * (d + D * p): a tensor group is consecutive ranks
    coordinates = [grid_coordinates(rank, 2, 2, 2) for rank in range(8)]
    assert coordinates[:4] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert coordinates[4:] == [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]


@pytest.mark.parametrize("tensor_size,pipeline_size", [(2, 1), (1, 2), (2, 2)])
def test_shards_are_slices_of_the_unsplit_initialisation(tensor_size, pipeline_size):
    """Every rank's parameters are cut from the one-process model's initial values."""
    reference = Sequential(mlp_layers(SPEC))
    full = init_flat_parameters(reference.layout, seed=3, dtype="float64")
    full_views = reference.layout.views(full)
    reference_leaves = reference.leaves()
    covered = np.zeros(full.shape[0], dtype=int)
    for pipeline_rank in range(pipeline_size):
        for tensor_rank in range(tensor_size):
            grid = fake_grid(tensor_size, tensor_rank, pipeline_size, pipeline_rank)
            parallel = build_parallel_model(grid, SPEC, tensor_collectives=NoCollectives())
            flat = init_parallel_parameters(parallel, seed=3)
            views = parallel.model.layout.views(flat)
            start = parallel.stage_ranges[pipeline_rank][0]
            offset = sum(len(layer.leaves()) for layer in reference.layers[:start])
            for index, leaf in enumerate(parallel.model.leaves()):
                reference_leaf = reference_leaves[offset + index]
                for name, value in views.get(leaf.name, {}).items():
                    expected = full_views[reference_leaf.name][name]
                    if hasattr(leaf, "shard"):
                        expected = leaf.shard(name, expected)
                    assert np.array_equal(value, expected), (leaf.name, name)
                lo, hi = reference_leaf.param_range
                covered[lo:hi] += 1
    # every tensor of the unsplit model is on some stage (tensor ranks visit it T times)
    assert np.all(covered == tensor_size)


def test_bad_tensor_group_is_refused():
    with pytest.raises(ConfigurationError, match="allreduce"):
        TensorGroup(0, 2, collectives=None)
    with pytest.raises(ConfigurationError, match="cannot be split evenly over 2"):
        ColumnParallelLinear(8, 7, TensorGroup(0, 2, NoCollectives()))


# ------------------------------------------------------------------ 2 ranks

def _block_gradients(model, params, x, grad_out, sample_index):
    """Output, input gradient and parameter gradients of one forward/backward in float64."""
    grads = np.zeros_like(params)
    model.bind(params, grads)
    ctx = ForwardContext(training=True, seed=5, step=2, sample_index=sample_index)
    out = model.forward(x, ctx)
    grad_input = model.backward(grad_out)
    return out, grad_input, model.layout.views(grads)


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_tensor_parallel_block_gradients_equal_the_unsplit_block(comm):
    """T = 2: outputs, input gradient and every parameter gradient (shards against the slices of
    the unsplit gradient) agree to 1e-12 relative; one allreduce per block forward and backward.
    Two forms: the residual block of MLPSpec, and the same layers at top level (where Sequential
    leaves the column-parallel bias to the GELU kernel)."""
    grid = make_grid(comm, 1, 2, 1)
    assert grid.describe() == "grid D x T x P = 1 x 2 x 1 on 1 node(s): tensor axis inside a node"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, SPEC.width))
    grad_out = rng.standard_normal((6, SPEC.width))
    sample_index = np.arange(6, dtype=np.int64)
    builders = {
        "residual": lambda group: [mlp_block(SPEC, 0, group)],
        "top-level": lambda group: mlp_block(SPEC, 0, group).layers[:4],
    }
    for form, build in builders.items():
        reference = Sequential(build(None))
        group = grid.tensor_group()
        split = Sequential(build(group))
        reference_params = rng.standard_normal(reference.n_params)
        reference_params = comm.broadcast(reference_params)   # the same values on both ranks
        split_params = np.zeros(split.n_params)
        reference_views = reference.layout.views(reference_params)
        split_views = split.layout.views(split_params)
        for leaf, reference_leaf in zip(split.leaves(), reference.leaves()):
            for name, view in split_views.get(leaf.name, {}).items():
                full = reference_views[reference_leaf.name][name]
                view[...] = leaf.shard(name, full) if hasattr(leaf, "shard") else full
        out, grad_input, grads = _block_gradients(reference, reference_params, x, grad_out,
                                                  sample_index)
        split_out, split_grad_input, split_grads = _block_gradients(split, split_params, x,
                                                                    grad_out, sample_index)
        assert group.n_allreduces == 2, form   # row-parallel forward + column-parallel backward
        assert relative(split_out, out) <= GRADIENT_TOLERANCE, form
        assert relative(split_grad_input, grad_input) <= GRADIENT_TOLERANCE, form
        worst = 0.0
        for leaf, reference_leaf in zip(split.leaves(), reference.leaves()):
            for name, value in split_grads.get(leaf.name, {}).items():
                expected = grads[reference_leaf.name][name]
                if isinstance(leaf, (ColumnParallelLinear, RowParallelLinear)):
                    expected = leaf.shard(name, expected)
                worst = max(worst, relative(value, expected))
        assert worst <= GRADIENT_TOLERANCE, (form, worst)
        if comm.rank == 0:
            print(f"{form}: max relative gradient difference {worst:.2e}")


def assert_grids_match_one_process(comm, cases):
    """Each ``(sizes, micro_batches)`` grid trains the one-process model to the same 50-step losses and
    final parameters (``LOSS_TOLERANCE``) and evaluates alike; returns the one-process loss curve."""
    reference, reference_params, reference_runner = one_process_curve(comm)
    for sizes, micro_batches in cases:
        grid = make_grid(comm, *sizes)
        losses, params, runner = grid_curve(grid, micro_batches=micro_batches)
        assert relative(losses, reference) <= LOSS_TOLERANCE, (sizes, losses[-3:], reference[-3:])
        assert relative(params, reference_params) <= LOSS_TOLERANCE, sizes
        assert evaluation_agrees(runner, reference_runner), sizes
        if comm.rank == 0:
            print(f"{grid.describe()}: loss {relative(losses, reference):.2e}, "
                  f"parameters {relative(params, reference_params):.2e}")
    return reference


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_tensor_and_data_parallel_losses_match_one_process(comm):
    """50 steps (fp64, AdamW, clipping, dropout) at 1 x 2 x 1 and 2 x 1 x 1 equal 1 x 1 x 1 to
    1e-10 relative (losses and final parameters; evaluation to 1e-12); the tensor-parallel model
    also trains through the existing ``trainer.train_step`` with the grid's sync, to the same
    curve; and in fp32 (1e-5, as the data-parallel tests) and fp16 (loss scaling; 2e-3)."""
    reference = assert_grids_match_one_process(comm, (((1, 2, 1), 1), ((2, 1, 1), 1)))
    assert reference[-1] < 0.7 * reference[0]     # it learns
    grid = make_grid(comm, 1, 2, 1)
    x, y = synthetic_data()
    runner = ParallelTrainer(grid, SPEC, train_config(), bucket_mb=0.002)
    losses = []
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=0, n_ranks=1) as loader:
        for _ in range(50):
            batch = loader.next()
            losses.append(train_step(runner.trainer, runner.state, batch.x, batch.y,
                                     batch.sample_index, runner.sync).loss)
    assert relative(np.array(losses), reference) <= LOSS_TOLERANCE
    grid = make_grid(comm, 1, 2, 1)
    for precision, tolerance in (("fp32", 1e-5), ("fp16", 2e-3)):
        low_reference, _, _ = one_process_curve(comm, precision=precision)
        losses, _, _ = grid_curve(grid, precision=precision)
        assert relative(losses, low_reference) <= tolerance, precision
        if comm.rank == 0:
            print(f"{grid.describe()} {precision}: loss {relative(losses, low_reference):.2e}")

"""Activation recomputation (``--recompute``) in the split model (``--model residual-mlp``).

Each stage keeps only its blocks' inputs per micro-batch in flight (the pipeline engine stashes them
with the rest of a micro-batch's state) and re-runs a block's forward just before its backward. The
recomputation repeats the same operations on the same inputs (dropout masks are hashes; a
tensor-parallel block's repeated allreduce sums the same partial products), so the run is BITWISE the
one that stores every activation -- in fp64 and in bf16, on every grid.
"""

import numpy as np
import pytest

from distributed_cases import synthetic_data, train_steps
from test_comm_volume import assert_measured_equals_computed
from test_tensor_parallel import SPEC, train_config
from test_train_parallel_app import SPLIT, run_app

from apps.train.parallel.comm_volume import blocks_in_stage
from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import make_grid
from apps.train.parallel.trainer import ParallelTrainer

STEPS = 20


def curve(grid, precision, micro_batches, recompute, schedule="1f1b"):
    x, y = synthetic_data()
    runner = ParallelTrainer(grid, SPEC, train_config(STEPS, precision), micro_batches=micro_batches,
                             schedule=schedule, bucket_mb=0.002, recompute=recompute)
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=grid.data_rank,
                       n_ranks=grid.data_size) as loader:
        losses = np.array(train_steps(runner, loader, STEPS))
    return losses, runner.full_parameters(), runner


@pytest.mark.mpi(ranks=[2], timeout=300)
def test_recompute_is_bitwise_the_stored_run_on_split_grids(comm):
    """1 x 2 x 1, 1 x 1 x 2 (M = 3, 1F1B and GPipe) and 2 x 1 x 1 in fp64 and bf16: the losses and the
    final parameters with recomputation equal those without, bit for bit; the tensor group allreduces
    3 times per block and step instead of 2, as the formula says."""
    cases = (((1, 2, 1), 1, "1f1b"), ((1, 1, 2), 3, "1f1b"), ((1, 1, 2), 3, "gpipe"), ((2, 1, 1), 1, "1f1b"))
    for precision in ("fp64", "bf16"):
        for sizes, micro_batches, schedule in cases:
            grid = make_grid(comm, *sizes)
            stored, stored_params, _ = curve(grid, precision, micro_batches, False, schedule)
            losses, params, runner = curve(grid, precision, micro_batches, True, schedule)
            assert runner.parallel_model.model.recompute
            what = (precision, sizes, schedule)
            assert np.array_equal(losses, stored), what
            assert np.array_equal(params, stored_params), what
            report = assert_measured_equals_computed(runner)
            if sizes[1] == 2:
                blocks = blocks_in_stage(SPEC, runner.parallel_model.stage_ranges[0])
                per_block = report["tensor_payload"]["measured"] / (blocks * 24 * SPEC.width * runner.itemsize)
                assert per_block == 3, report
            if comm.rank == 0:
                print(f"{grid.describe()} {precision} M={micro_batches} {schedule}: recompute bitwise")


def test_app_trains_the_split_model_with_recompute(tmp_path, data_file):
    """``--recompute --tensor-parallel 2`` (no longer refused): the run equals the one without
    recomputation (checksum and loss curve); the tensor allreduces are 3 per block and step."""
    args = [*SPLIT, "--tensor-parallel", "2", "--data", data_file, "--steps", "10", "--eval-every", "5"]
    stored = run_app(tmp_path / "stored", 2, *args)
    recomputed = run_app(tmp_path / "recomputed", 2, *args, "--recompute")
    assert recomputed["diagnostics"]["loss_curve"] == stored["diagnostics"]["loss_curve"]
    assert recomputed["checksum"] == stored["checksum"]
    # 3 blocks: 3 allreduces each per step with recomputation (2 without), 1 per evaluation chunk
    assert recomputed["diagnostics"]["tensor_allreduces"] == 3 * 3 * 10 + 3 * 2
    assert stored["diagnostics"]["tensor_allreduces"] == 2 * 3 * 10 + 3 * 2

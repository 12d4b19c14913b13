"""Pipeline parallelism (apps.train.parallel.pipeline) and hybrid grids, on the CPU.

Schedules are checked as operation lists and by replaying them with fixed operation times
(:func:`simulate_schedule`: no deadlock, bubble (P-1)/(M+P-1)). Multi-rank bodies (``mpi`` marker,
under a timeout, the failing rank's traceback in the report) train 50 steps at several
D x T x P grids and compare with the one-process run computed in the same process; the float64
tolerance 1e-10 is explained in test_tensor_parallel.py (micro-batches add their gradients in
another order than one full-batch GEMM: rounding only).
"""

import numpy as np
import pytest

from test_tensor_parallel import (LOSS_TOLERANCE, SPEC, assert_grids_match_one_process, evaluation_agrees,
                                  grid_curve, one_process_curve, relative, train_config)

from apps.train.nn.layers import ForwardContext
from apps.train.nn.loss import softmax_cross_entropy
from apps.train.parallel.grid import make_grid
from apps.train.parallel.pipeline import (PipelineEngine, bubble_fraction, gpipe_schedule,
                                 one_f_one_b_schedule, partition_stages, schedule_for,
                                 simulate_schedule)
from apps.train.nn.sequential import Sequential
from apps.train.parallel.tensor_parallel import mlp_layers
from hpcgpu.errors import ConfigurationError


def names(operations):
    return " ".join(f"{kind}{micro}" for kind, micro in operations)


# ------------------------------------------------------------------ schedules (one process)

def test_gpipe_runs_all_forwards_then_all_backwards():
    for stage in range(3):
        assert names(gpipe_schedule(3, 4, stage)) == "F0 F1 F2 F3 B0 B1 B2 B3"


def test_one_f_one_b_order_per_stage():
    """P = 4, M = 6: stage s runs P - s - 1 warm-up forwards, then F/B pairs, then drains."""
    expected = {
        0: "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
        1: "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
        2: "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
        3: "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
    }
    for stage, order in expected.items():
        assert names(one_f_one_b_schedule(4, 6, stage)) == order
    # fewer micro-batches than stages: warm-up is capped at M
    assert names(one_f_one_b_schedule(4, 2, 0)) == "F0 F1 B0 B1"


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_every_micro_batch_once_forward_before_backward(schedule):
    for n_stages in range(1, 6):
        for n_micro in range(1, 9):
            for stage in range(n_stages):
                operations = schedule_for(schedule, n_stages, n_micro, stage)
                assert sorted(operations) == sorted([("F", m) for m in range(n_micro)]
                                                    + [("B", m) for m in range(n_micro)])
                backwards = [m for kind, m in operations if kind == "B"]
                assert backwards == list(range(n_micro))   # same accumulation order in both
                for micro in range(n_micro):
                    assert operations.index(("F", micro)) < operations.index(("B", micro))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("n_stages,n_micro", [(1, 1), (2, 4), (3, 7), (4, 2), (4, 8), (8, 32)])
def test_replayed_schedule_has_the_formula_bubble(schedule, n_stages, n_micro):
    """With forward 1 s and backward 2 s per micro-batch and stage, the step takes
    (M + P - 1) x 3 s and each stage is idle (P - 1)/(M + P - 1) of it; 1F1B holds at most
    P - s micro-batches on stage s, GPipe all M."""
    result = simulate_schedule(schedule, n_stages, n_micro, 1.0, 2.0)
    assert result["makespan"] == pytest.approx((n_micro + n_stages - 1) * 3.0)
    formula = bubble_fraction(n_stages, n_micro)
    assert result["idle_fraction"] == pytest.approx([formula] * n_stages)
    expected_peak = ([min(n_stages - stage, n_micro) for stage in range(n_stages)]
                     if schedule == "1f1b" else [n_micro] * n_stages)
    assert result["peak_in_flight"] == expected_peak


def test_bubble_formula_values():
    assert bubble_fraction(1, 8) == 0.0
    assert bubble_fraction(2, 4) == pytest.approx(0.2)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)


def test_partition_balances_parameters_and_accepts_boundaries():
    assert partition_stages([10, 100, 100, 100, 10], 3) == [(0, 2), (2, 3), (3, 5)]
    assert partition_stages([5, 5, 5, 5], 1) == [(0, 4)]
    assert partition_stages([5, 5, 5, 5], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert partition_stages([5, 5, 5, 5], 2, boundaries=[3]) == [(0, 3), (3, 4)]
    with pytest.raises(ConfigurationError, match="5 stages need between 1 and 4"):
        partition_stages([5, 5, 5, 5], 5)
    with pytest.raises(ConfigurationError, match="boundaries"):
        partition_stages([5, 5, 5, 5], 3, boundaries=[2, 2])
    with pytest.raises(ConfigurationError, match="schedule"):
        schedule_for("interleaved", 2, 4, 0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_micro_batch_gradients_equal_full_batch(schedule):
    """One stage, M = 4 uneven micro-batches (GPipe holds all four activations at once and puts
    each back before its backward): the accumulated gradients equal one full-batch backward."""
    from apps.train.nn.params import init_flat_parameters

    rng = np.random.default_rng(1)
    x = rng.standard_normal((10, SPEC.n_inputs))
    y = rng.integers(0, SPEC.n_classes, 10)
    sample_index = np.arange(10, dtype=np.int64)
    model = Sequential(mlp_layers(SPEC))
    params = init_flat_parameters(model.layout, 4, "float64")
    full_grads, grads = np.zeros_like(params), np.zeros_like(params)
    model.bind(params, full_grads)
    ctx = ForwardContext(training=True, seed=2, step=3, sample_index=sample_index)
    loss, grad_logits = softmax_cross_entropy(model.forward(x, ctx), y, 10)
    model.backward(grad_logits)
    model.bind(params, grads)
    engine = PipelineEngine(model, 0, 1, 4, schedule, point_to_point=None, control=None)
    micro_loss, stats = engine.compute_gradients(x, y, sample_index, seed=2, step=3,
                                                 global_batch_size=10, compute_dtype=np.float64)
    assert relative(grads, full_grads) <= 1e-12
    assert micro_loss == pytest.approx(float(loss), rel=1e-12)
    assert stats.peak_in_flight == (4 if schedule == "gpipe" else 1)


# ------------------------------------------------------------------ multi-rank

@pytest.mark.mpi(ranks=[2], timeout=150)
def test_two_stage_pipeline_matches_one_process(comm):
    """1 x 1 x 2, M = 4: 50 steps equal 1 x 1 x 1 to 1e-10 (losses and parameters), GPipe and
    1F1B give bitwise the same run, and the report gives the formula bubble 1/5 and the
    activations held (1F1B: 2 on stage 0, 1 on stage 1; GPipe: 4 on both)."""
    reference, reference_params, reference_runner = one_process_curve(comm)
    grid = make_grid(comm, 1, 1, 2)
    runs = {}
    for schedule in ("1f1b", "gpipe"):
        losses, params, runner = grid_curve(grid, micro_batches=4, schedule=schedule)
        assert relative(losses, reference) <= LOSS_TOLERANCE, (schedule, losses[-3:], reference[-3:])
        assert relative(params, reference_params) <= LOSS_TOLERANCE, schedule
        assert evaluation_agrees(runner, reference_runner), schedule
        report = runner.pipeline_report()
        assert report["bubble_formula"] == pytest.approx(0.2)
        assert report["peak_in_flight"] == ([2, 1] if schedule == "1f1b" else [4, 4])
        assert all(0.0 <= value < 1.0 for value in report["bubble_measured"])
        runs[schedule] = (losses, params)
        if comm.rank == 0:
            print(f"{grid.describe()} {schedule}: loss {relative(losses, reference):.2e}, "
                  f"parameters {relative(params, reference_params):.2e}, {report}")
    assert np.array_equal(runs["1f1b"][0], runs["gpipe"][0])
    assert np.array_equal(runs["1f1b"][1], runs["gpipe"][1])


@pytest.mark.mpi(ranks=[4], timeout=240)
def test_hybrid_grids_on_four_ranks_match_one_process(comm):
    """2 x 2 x 1 (data x tensor), 1 x 2 x 2 (tensor x pipeline, M = 3, 1F1B) and 2 x 1 x 2 (data x
    pipeline, M = 2: the data-parallel buckets start in each stage's last backward) on 4 ranks:
    50 steps equal 1 x 1 x 1 to 1e-10 relative; evaluation to 1e-12."""
    assert_grids_match_one_process(comm, (((2, 2, 1), 1), ((1, 2, 2), 3), ((2, 1, 2), 2)))


@pytest.mark.mpi(ranks=[2], timeout=60)
def test_bad_grid_fails_on_every_rank_before_any_collective(comm):
    with pytest.raises(ConfigurationError, match="but the job has 2"):
        make_grid(comm, 2, 2, 1)
    with pytest.raises(ConfigurationError, match="micro-batches"):
        from apps.train.parallel.trainer import ParallelTrainer

        config = train_config()
        config.global_batch_size = 3
        ParallelTrainer(make_grid(comm, 1, 1, 2), SPEC, config, micro_batches=4)

"""Communication volume of D x T x P training (apps.train.parallel.comm_volume) and the pipeline senders.

The bytes the code passes to its tensor allreduces and pipeline sends during a step (counted in
:class:`TensorGroup` and the senders of :mod:`apps.train.parallel.pipeline_transport`) equal the Megatron
formulas on every rank, for T = 2, P = 2 (M = 2 and 4) and D x T = 2 x 2.

NCCL's semantics on the CPU: :class:`SynchronousPointToPoint` completes a send only when the peer
receives it (``Issend``), completes an exchange only when both of its messages have (one NCCL
group) and sends every message with one tag (NCCL matches in posting order, not by tag). A
pipeline that trains with it cannot deadlock on NCCL for that reason, and its losses are bitwise
those of the MPI sender.
"""

import numpy as np
import pytest

from distributed_cases import synthetic_data, train_steps
from test_tensor_parallel import SPEC, fake_grid, train_config

from apps.train.parallel.comm_volume import (blocks_in_stage, communication_report, computed_max_volume,
                                    computed_volume, format_bytes, ring_allreduce_factor)
from apps.train.data.loader import ArraySource, ShardedLoader
from apps.train.parallel.grid import make_grid
from apps.train.parallel.trainer import ParallelTrainer
from apps.train.nn.params import init_flat_parameters
from apps.train.parallel.pipeline import PipelineEngine
from apps.train.parallel.pipeline_transport import PointToPoint
from apps.train.nn.sequential import Sequential
from apps.train.parallel.tensor_parallel import mlp_layers


class SynchronousPointToPoint(PointToPoint):
    """A pipeline sender with NCCL's completion and matching rules, on MPI (see the module docstring)."""

    def exchange(self, send=None, receive=None):
        from mpi4py import MPI

        requests, received = [], None
        if send is not None:
            array, dest, _ = send
            buffer = np.ascontiguousarray(array)
            self._count(buffer)
            requests.append(self.comm.mpi.Issend(buffer, dest=dest, tag=0))
        if receive is not None:
            shape, dtype, source, _ = receive
            received = np.empty(shape, dtype=dtype)
            requests.append(self.comm.mpi.Irecv(received, source=source, tag=0))
        MPI.Request.Waitall(requests)
        return received


# ------------------------------------------------------------------ formulas (one process)

def test_ring_factor_and_block_count():
    assert ring_allreduce_factor(1) == 0.0
    assert ring_allreduce_factor(2) == 1.0
    assert ring_allreduce_factor(4) == 1.5
    # SPEC: depth 3 -> layers [Linear, block, block, block, LayerNorm, Linear]
    assert blocks_in_stage(SPEC, (0, 6)) == 3
    assert blocks_in_stage(SPEC, (0, 2)) == 1
    assert blocks_in_stage(SPEC, (2, 6)) == 2
    assert blocks_in_stage(SPEC, (4, 6)) == 0


def test_computed_volume_follows_the_formulas():
    ranges = [(0, 2), (2, 6)]
    rows, itemsize, width = 24, 8, SPEC.width
    first = computed_volume(SPEC, ranges, 0, 2, rows, itemsize)
    last = computed_volume(SPEC, ranges, 1, 2, rows, itemsize)
    assert first["tensor_payload"] == 2 * 1 * rows * width * itemsize
    assert last["tensor_payload"] == 2 * 2 * rows * width * itemsize
    assert last["tensor"] == 1.0 * last["tensor_payload"]
    assert first["pipeline"] == last["pipeline"] == rows * width * itemsize
    middle = computed_volume(SPEC, [(0, 2), (2, 3), (3, 6)], 1, 4, rows, itemsize)
    assert middle["pipeline"] == 2 * rows * width * itemsize
    assert middle["tensor"] == 1.5 * 2 * rows * width * itemsize
    alone = computed_volume(SPEC, [(0, 6)], 0, 1, rows, itemsize)
    assert alone == {"tensor_payload": 0, "tensor": 0.0, "pipeline": 0}
    # uneven replicas: 25 rows over 2 replicas -> 13 and 12; the largest is reported
    assert computed_max_volume(SPEC, ranges, 2, 2, 25, 8)["pipeline"] == 13 * width * 8
    assert format_bytes(12.6e6) == "12.6 MB" and format_bytes(3072) == "3.07 kB"


def test_grid_line_names_the_axes_inside_a_node():
    grid = fake_grid(tensor_size=2, pipeline_size=2)
    grid.node_of_rank = (0, 0, 1, 1)           # block: each tensor pair on one node
    assert grid.axis_inside_node("tensor") and not grid.axis_inside_node("pipeline")
    assert grid.describe() == ("grid D x T x P = 1 x 2 x 2 on 2 node(s): tensor axis inside a node; "
                               "pipeline axis across nodes")
    grid.node_of_rank = (0, 1, 0, 1)           # cyclic: the pipeline pairs share a node
    assert not grid.axis_inside_node("tensor") and grid.axis_inside_node("pipeline")
    assert "tensor axis SPANS nodes" in grid.describe()
    assert "pipeline axis inside a node" in grid.describe()


class RecordingPointToPoint:
    """Records ``(send peer, receive peer)`` of every exchange; receives are zeros."""

    def __init__(self):
        self.exchanges, self.bytes_sent = [], 0

    def exchange(self, send=None, receive=None):
        self.exchanges.append((None if send is None else send[1], None if receive is None else receive[2]))
        return None if receive is None else np.zeros(receive[0], dtype=receive[1])

    def wait_all(self):
        pass


class KnownShapes:
    """The engine's one-time shape message (``engine.shapes``) without a communicator: (width,) comes in."""

    def receive(self, source):
        return (SPEC.width,)

    def send(self, trailing_shape, dest):
        pass


@pytest.mark.parametrize("schedule, expected", [
    # stage 1 of 3, M = 4. 1F1B: F0 F1 B0 F2 B1 F3 B2 B3 -- each steady-state send goes in one
    # exchange with the next receive from the same neighbour; the others go alone, at once
    ("1f1b", [(None, 0), (2, None), (None, 0), (2, 2), (0, 0), (2, 2), (0, 0), (2, 2), (0, None),
              (None, 2), (0, None)]),
    # GPipe: F0..F3 B0..B3 -- only the last activation meets a receive from its peer (B0's)
    ("gpipe", [(None, 0), (2, None), (None, 0), (2, None), (None, 0), (2, None), (None, 0), (2, 2),
               (0, None), (None, 2), (0, None), (None, 2), (0, None), (None, 2), (0, None)]),
])
def test_engine_pairs_a_send_with_the_next_receive_from_the_same_neighbour(schedule, expected):
    model = Sequential(mlp_layers(SPEC)[2:4])
    params = init_flat_parameters(model.layout, 4, "float64")
    model.bind(params, np.zeros_like(params))
    sender = RecordingPointToPoint()
    engine = PipelineEngine(model, 1, 3, 4, schedule, sender, control=None)
    engine.shapes = KnownShapes()
    x = np.zeros((8, SPEC.n_inputs))
    engine.compute_gradients(x, np.zeros(8, dtype=int), np.arange(8, dtype=np.int64), seed=1, step=0,
                             global_batch_size=8, compute_dtype=np.float64)
    assert sender.exchanges == expected


# ------------------------------------------------------------------ multi-rank

def measured_run(grid, micro_batches, steps=3, point_to_point=None, schedule="1f1b"):
    x, y = synthetic_data()
    runner = ParallelTrainer(grid, SPEC, train_config(steps), micro_batches=micro_batches,
                             schedule=schedule, bucket_mb=0.002, point_to_point=point_to_point)
    with ShardedLoader(ArraySource(x, y), 24, seed=11, rank=grid.data_rank,
                       n_ranks=grid.data_size) as loader:
        losses = train_steps(runner, loader, steps)
    # evaluation communicates too, but is not a training step: it must not change the per-step count
    runner.evaluate(*synthetic_data(seed=9), batch_size=100)
    return runner, losses


def assert_measured_equals_computed(runner):
    report = communication_report(runner)
    for key in ("tensor_payload", "tensor", "pipeline"):
        assert report[key]["measured_per_rank"] == report[key]["computed_per_rank"], (key, report)
    return report


@pytest.mark.mpi(ranks=[4], timeout=240)
def test_measured_bytes_equal_the_formulas_on_four_ranks(comm, monkeypatch):
    """1 x 2 x 2 with M = 2 and 4 (both schedules), and 2 x 2 x 1: per rank and step, the bytes given
    to the allreduces and the pipeline sends equal the formulas exactly; with 2 simulated nodes
    (block order) the tensor axis lies inside a node and the pipeline axis across."""
    monkeypatch.setenv("HPCGPU_SIMULATE_NODES", "2")
    grid = make_grid(comm, 1, 2, 2)
    assert grid.describe().endswith("tensor axis inside a node; pipeline axis across nodes")
    rows, width, itemsize = 24, SPEC.width, 8
    for micro_batches, schedule in ((2, "1f1b"), (4, "1f1b"), (4, "gpipe")):
        runner, _ = measured_run(grid, micro_batches, schedule=schedule)
        report = assert_measured_equals_computed(runner)
        # stages [(0, 3), (3, 6)]: 2 blocks then 1, whatever M
        blocks = [blocks_in_stage(SPEC, r) for r in runner.parallel_model.stage_ranges]
        expected_payload = [2 * blocks[rank // 2] * rows * width * itemsize for rank in range(4)]
        assert report["tensor_payload"]["measured_per_rank"] == expected_payload
        assert report["pipeline"]["measured_per_rank"] == [rows * width * itemsize] * 4
        assert report["steps"] == 3
    grid = make_grid(comm, 2, 2, 1)
    runner, _ = measured_run(grid, 1)
    report = assert_measured_equals_computed(runner)
    assert report["tensor_payload"]["measured_per_rank"] == [2 * 3 * 12 * width * itemsize] * 4
    assert report["pipeline"]["measured"] == 0


@pytest.mark.mpi(ranks=[2], timeout=150)
def test_pipeline_trains_with_nccl_like_synchronous_sends(comm):
    """1 x 1 x 2, M = 4 and M = 1, GPipe and 1F1B: with sends that complete only when received and
    order-matched messages (NCCL's rules) the pipeline neither deadlocks nor changes a bit of the
    losses of the MPI sender."""
    grid = make_grid(comm, 1, 1, 2)
    for micro_batches in (4, 1):
        for schedule in ("1f1b", "gpipe"):
            _, reference = measured_run(grid, micro_batches, steps=4, schedule=schedule)
            runner, losses = measured_run(grid, micro_batches, steps=4, schedule=schedule,
                                          point_to_point=SynchronousPointToPoint(grid.pipeline))
            assert losses == reference, (micro_batches, schedule)
            assert_measured_equals_computed(runner)


@pytest.mark.mpi(ranks=[4], timeout=240)
def test_four_stages_with_nccl_like_synchronous_sends(comm):
    """1 x 1 x 4 (and 1 x 2 x 2), M = 3 and 6: the deeper 1F1B steady state also completes."""
    for sizes, micro_batches in (((1, 1, 4), 3), ((1, 1, 4), 6), ((1, 2, 2), 3)):
        grid = make_grid(comm, *sizes)
        for schedule in ("1f1b", "gpipe"):
            _, reference = measured_run(grid, micro_batches, steps=2, schedule=schedule)
            _, losses = measured_run(grid, micro_batches, steps=2, schedule=schedule,
                                     point_to_point=SynchronousPointToPoint(grid.pipeline))
            assert losses == reference, (sizes, micro_batches, schedule)

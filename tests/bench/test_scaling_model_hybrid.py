"""The hybrid-parallel training model (hpcgpu/bench/model_hybrid.py): each term by hand, the links it
picks inside and across nodes, and the --hybrid table of the model subcommand."""

import subprocess
import sys
from pathlib import Path

import pytest

from hpcgpu.bench.model_hybrid import MlpModel, hybrid_table, predict_hybrid
from hpcgpu.bench.model_inputs import Machine
from hpcgpu.bench.model_predict import ring_allreduce_seconds

ROOT = Path(__file__).resolve().parents[2]
MODEL = MlpModel("toy", blocks=8, width=1024, inner=4096, rows=512, itemsize=2, gradient_itemsize=2,
                 flops_per_second=1e14)


def test_parameters_count_both_weight_matrices_and_biases():
    assert MODEL.parameters == 8 * (2 * 1024 * 4096 + 1024 + 4096)


def test_data_parallel_in_one_node_by_hand():
    machine = Machine()
    p = predict_hybrid(MODEL, 8, 1, 1, 1, machine)
    compute = 6 * MODEL.parameters * 512 / 1e14
    data = ring_allreduce_seconds(MODEL.parameters * 2, 8, machine.allreduce_bus_bandwidth, machine.allreduce_hop_latency)
    assert p.compute == pytest.approx(compute) and p.data_seconds == pytest.approx(data)
    assert p.hidden == pytest.approx(min(data, 0.6 * compute))
    assert p.bubble == p.tensor_seconds == p.p2p_seconds == 0
    assert p.step == pytest.approx(compute + data - p.hidden) and p.gpus == 8


def test_tensor_parallel_allreduces_every_block_both_ways_per_micro_batch():
    machine = Machine(overlap="none")
    p = predict_hybrid(MODEL, 1, 2, 1, 4, machine)
    per_allreduce = ring_allreduce_seconds(512 / 4 * 1024 * 2, 2, machine.allreduce_bus_bandwidth,
                                           machine.allreduce_hop_latency)
    assert p.tensor_seconds == pytest.approx(8 * 2 * 4 * per_allreduce)
    assert p.compute == pytest.approx(6 * MODEL.parameters * 512 / 2 / 1e14)


def test_pipeline_bubble_and_messages_inside_and_across_nodes():
    machine = Machine(overlap="none")
    inside = predict_hybrid(MODEL, 1, 2, 4, 8, machine)            # T P = 8: one node
    assert inside.bubble == pytest.approx(inside.compute * 3 / 8)
    message = 512 / 8 * 1024 * 2
    assert inside.p2p_seconds == pytest.approx(16 * (machine.intra_latency + message / machine.intra_bandwidth))
    across = predict_hybrid(MODEL, 1, 4, 4, 8, machine)            # T P = 16: a boundary between nodes
    assert across.p2p_seconds == pytest.approx(16 * (machine.inter_latency + message / machine.inter_bandwidth_per_gpu))
    # The data allreduce of a grid spanning nodes runs at the node's InfiniBand bandwidth.
    spread = predict_hybrid(MODEL, 2, 8, 1, 1, machine)
    bus = min(machine.allreduce_bus_bandwidth, machine.node_bandwidth)
    hop = max(machine.allreduce_hop_latency, machine.inter_latency)
    assert spread.data_seconds == pytest.approx(ring_allreduce_seconds(MODEL.parameters / 8 * 2, 2, bus, hop))


def test_grids_the_trainer_refuses_are_refused():
    with pytest.raises(ValueError, match="must divide"):
        predict_hybrid(MODEL, 1, 1, 3, 1, Machine())
    with pytest.raises(ValueError, match="must divide"):
        predict_hybrid(MODEL, 1, 1, 1, 3, Machine())
    assert all(0 < p.efficiency <= 1.0 + 1e-12 for p in hybrid_table(Machine()))   # hidden == data: rounding


def test_model_subcommand_prints_the_hybrid_table():
    result = subprocess.run([sys.executable, "-m", "hpcgpu.bench", "model", "--hybrid"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "predicted, not measured" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("MLP ")]
    assert len(rows) == len(hybrid_table(Machine()))

"""Scaling model for hybrid data x tensor x pipeline training of an MLP (issue 27's larger counts).

``python -m hpcgpu.bench model --hybrid`` prints :func:`predict_hybrid` for the MLPs of
:data:`EXAMPLES` on the grids of :data:`GRIDS`. Per step and GPU (the worst-placed rank), with
``params = L (2 h f + h + f)`` and ``R`` rows per data replica per step::

    compute   = 6 params R / (T P) / rate                      (forward 2, backward 4 FLOP per weight and row)
    pipeline  = compute (M + P - 1) / M                        (GPipe / 1F1B bubble (P - 1) / (M + P - 1))
    tensor    = (L / P) 2 M allreduces of (R / M) h itemsize bytes over T ranks  (ring; on the critical path)
    p2p       = 2 M messages of (R / M) h itemsize bytes, latency + bytes / bandwidth  (counted exposed)
    data      = ring allreduce of params / (T P) x gradient itemsize over D ranks,
                hidden up to overlap_fraction x compute / M (the last micro-batch's backward)
    step      = pipeline + tensor + p2p + data - hidden
    efficiency = compute / step

Placement as :mod:`apps.train.parallel.grid` orders ranks: tensor fastest, then pipeline, then data.
Tensor groups use NVLink when ``T <= gpus_per_node``; a pipeline boundary crosses nodes when
``T P > gpus_per_node``; the data allreduce crosses nodes when ``D T P > gpus_per_node`` (then at
the node's InfiniBand bandwidth, as the data-parallel recipe of :mod:`hpcgpu.bench.model_predict`).
The rate is the FLOP/s our data-parallel MLP training reached on one H200 (not a peak): large GEMMs
of another MLP are assumed to run as fast. Not modelled: recomputation, activation memory, LayerNorm /
GELU time, the overlap of point-to-point messages with the steady state of 1F1B, and NCCL's
tree/NVLS algorithms. Nothing here has been measured on more than 2 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcgpu.bench.model_inputs import Machine
from hpcgpu.bench.model_predict import allreduce_links, ring_allreduce_seconds


@dataclass(frozen=True)
class MlpModel:
    """An MLP of ``blocks`` residual blocks ``width -> inner -> width`` trained on ``rows`` rows per
    data replica per step; activations of ``itemsize`` bytes, gradients of ``gradient_itemsize``,
    at ``flops_per_second`` per GPU."""

    name: str
    blocks: int
    width: int
    inner: int
    rows: int
    itemsize: int
    gradient_itemsize: int
    flops_per_second: float
    overlap_fraction: float = 0.6
    source: str = ""

    @property
    def parameters(self) -> float:
        return float(self.blocks * (2 * self.width * self.inner + self.width + self.inner))


@dataclass(frozen=True)
class HybridPrediction:
    """Seconds per step of one D x T x P grid with M micro-batches (worst-placed rank)."""

    model: str
    data: int
    tensor: int
    pipeline: int
    micro_batches: int
    compute: float
    bubble: float
    tensor_seconds: float
    p2p_seconds: float
    data_seconds: float
    hidden: float

    @property
    def gpus(self) -> int:
        return self.data * self.tensor * self.pipeline

    @property
    def step(self) -> float:
        return self.compute + self.bubble + self.tensor_seconds + self.p2p_seconds + self.data_seconds - self.hidden

    @property
    def efficiency(self) -> float:
        return self.compute / self.step


def predict_hybrid(model: MlpModel, data: int, tensor: int, pipeline: int, micro_batches: int,
                   machine: Machine) -> HybridPrediction:
    """One grid's step (module docstring). ``pipeline`` must divide ``model.blocks`` and
    ``micro_batches`` must divide ``model.rows`` (as the trainer requires)."""
    if min(data, tensor, pipeline, micro_batches) < 1:
        raise ValueError("data, tensor, pipeline and micro_batches must be >= 1")
    if model.blocks % pipeline or model.rows % micro_batches:
        raise ValueError(f"P={pipeline} must divide {model.blocks} blocks and M={micro_batches} must divide "
                         f"{model.rows} rows")
    compute = 6.0 * model.parameters * model.rows / (tensor * pipeline) / model.flops_per_second
    bubble = compute * (pipeline - 1) / micro_batches
    activation_bytes = model.rows / micro_batches * model.width * model.itemsize
    bus, hop = allreduce_links(tensor, machine)
    tensor_seconds = (model.blocks // pipeline) * 2 * micro_batches * ring_allreduce_seconds(activation_bytes, tensor,
                                                                                             bus, hop)
    p2p_seconds = 0.0
    if pipeline > 1:
        if tensor * pipeline <= machine.gpus_per_node:
            latency, bandwidth = machine.intra_latency, machine.intra_bandwidth
        else:
            latency, bandwidth = machine.inter_latency, machine.inter_bandwidth_per_gpu
        p2p_seconds = 2 * micro_batches * (latency + activation_bytes / bandwidth)
    gradient_bytes = model.parameters / (tensor * pipeline) * model.gradient_itemsize
    bus, hop = allreduce_links(data * tensor * pipeline, machine)
    data_seconds = ring_allreduce_seconds(gradient_bytes, data, bus, hop)
    overlappable = model.overlap_fraction * compute / micro_batches
    hidden = 0.0 if machine.overlap == "none" else min(data_seconds, overlappable if machine.overlap == "interior"
                                                       else compute + bubble)
    return HybridPrediction(model.name, data, tensor, pipeline, micro_batches, compute, bubble, tensor_seconds,
                            p2p_seconds, data_seconds, hidden)


FP16_MLP_RATE = 8.556e8 * 603155
"""FLOP/s of our fp16 data-parallel training of the 142.6M-parameter MLP on one H200: 6 x 142.6e6
FLOP per sample at 603,155 samples/s (docs/performance.md, training): 5.16e14."""

EXAMPLES = (
    MlpModel("MLP 1.07e9 (8 x 4096 -> 16384)", 8, 4096, 16384, 4096, 2, 2, FP16_MLP_RATE,
             source="docs/parallelism.md's example: fp16, 4096 rows per replica"),
    MlpModel("MLP 8.6e9 (64 x 4096 -> 16384)", 64, 4096, 16384, 4096, 2, 2, FP16_MLP_RATE,
             source="the same blocks, 64 of them: 17 GB of fp16 weights, more than one H200 holds with "
                    "gradients and optimiser state"),
)

GRIDS = ((8, 1, 1, 1), (1, 8, 1, 1), (1, 1, 8, 8), (1, 1, 8, 32), (2, 4, 1, 1),
         (64, 1, 1, 1), (8, 8, 1, 1), (8, 1, 8, 32), (1, 8, 8, 32), (512, 1, 1, 1), (64, 8, 1, 1), (8, 8, 8, 32))
"""(D, T, P, M) grids of 8, 64 and 512 GPUs."""


def hybrid_table(machine: Machine, models=EXAMPLES, grids=GRIDS) -> list[HybridPrediction]:
    """Every model on every grid it admits (P dividing its blocks)."""
    return [predict_hybrid(model, *grid, machine) for model in models for grid in grids
            if model.blocks % grid[2] == 0]


def format_hybrid_table(predictions: list[HybridPrediction]) -> str:
    lines = ["model                            GPUs    D  T  P   M  compute ms  bubble ms  tensor ms  p2p ms  "
             "data ms (hidden)  step ms    eff"]
    for p in predictions:
        lines.append(f"{p.model:32s} {p.gpus:4d} {p.data:4d} {p.tensor:2d} {p.pipeline:2d} {p.micro_batches:3d} "
                     f"{p.compute * 1e3:11.2f} {p.bubble * 1e3:10.2f} {p.tensor_seconds * 1e3:10.2f} "
                     f"{p.p2p_seconds * 1e3:7.2f} {p.data_seconds * 1e3:8.2f} ({p.hidden * 1e3:5.2f}) "
                     f"{p.step * 1e3:8.2f} {100 * p.efficiency:5.1f}%")
    return "\n".join(lines)


__all__ = ["EXAMPLES", "FP16_MLP_RATE", "GRIDS", "HybridPrediction", "MlpModel", "format_hybrid_table",
           "hybrid_table", "predict_hybrid"]

"""Arithmetic of the scaling model (:mod:`hpcgpu.bench.model`): predictions from recipes and a machine.

:func:`predict` gives one app at one GPU count (the formulas are in :mod:`hpcgpu.bench.model`'s
docstring), :func:`predict_series` a strong or weak series, :func:`validate` the model against the
measurements of :data:`hpcgpu.bench.model_inputs.CHECKS`. The inputs are
:mod:`hpcgpu.bench.model_inputs`. Nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from hpcgpu.bench.model_inputs import CHECKS, Check, GridRecipe, Machine, MdRecipe, TrainRecipe
from hpcgpu.decomposition import factorizations
from hpcgpu.errors import ConfigurationError

@dataclass
class Prediction:
    """One app at one GPU count. Times in seconds per step, bytes per step for the worst rank."""

    app: str
    mode: str
    n_gpus: int
    n_nodes: int
    dims: tuple[int, ...]
    node_tile: tuple[int, ...]
    work_per_gpu: float
    compute: float
    communication: float
    hidden: float
    intra_bytes: float
    inter_bytes: float
    seconds_per_step: float = 0.0
    efficiency: float = 1.0
    parts: dict = field(default_factory=dict)

    @property
    def exposed(self) -> float:
        return self.communication - self.hidden


# -- pieces of the recipes -----------------------------------------------------------------------------


def neighbours_per_axis(dims, periodic) -> list[int]:
    """Neighbours of the worst rank along each axis: 0 unsplit, 1 for two ranks in a wall-bounded
    axis, else 2 (a periodic pair exchanges both ways with the same peer: still two messages)."""
    return [0 if d == 1 else (2 if (p or d >= 3) else 1) for d, p in zip(dims, periodic)]


def split_neighbours(dims, node_tile, periodic) -> list[tuple[int, int]]:
    """(intra-node, inter-node) neighbours of the worst rank (a corner of its node tile) per axis."""
    result = []
    for count, d, t in zip(neighbours_per_axis(dims, periodic), dims, node_tile):
        if count == 0:
            result.append((0, 0))
        elif t == d:
            result.append((count, 0))
        elif t == 1:
            result.append((0, count))
        else:
            result.append((count - 1, 1))
    return result


def halo_face_bytes(local_shape, axis: int, halo_width: int, n_fields: int, itemsize: int) -> float:
    """Bytes of one halo message across ``axis``: cells of the face x halo width x fields x itemsize."""
    face = float(np.prod([n for i, n in enumerate(local_shape) if i != axis]))
    return face * halo_width * n_fields * itemsize


def ring_allreduce_seconds(n_bytes: float, n_gpus: int, bus_bandwidth: float, hop_latency: float) -> float:
    """Ring allreduce: ``2 (p-1)`` steps, each a latency, moving ``2 (p-1)/p x bytes`` over the ring."""
    if n_gpus <= 1:
        return 0.0
    return 2 * (n_gpus - 1) * hop_latency + 2 * (n_gpus - 1) / n_gpus * n_bytes / bus_bandwidth


def allreduce_links(n_ranks_spanned: int, machine: Machine) -> tuple[float, float]:
    """(bus bandwidth, hop latency) of a ring over ``n_ranks_spanned`` consecutive ranks: NVLink's
    inside one node, the node's InfiniBand bandwidth and latency once the ring crosses nodes."""
    if n_ranks_spanned <= machine.gpus_per_node:
        return machine.allreduce_bus_bandwidth, machine.allreduce_hop_latency
    return (min(machine.allreduce_bus_bandwidth, machine.node_bandwidth),
            max(machine.allreduce_hop_latency, machine.inter_latency))


def exchange_seconds(intra_bytes, n_intra, inter_bytes, n_inter, machine: Machine) -> float:
    """One exchange: the intra- and inter-node transfers run concurrently; each pays its latency once
    (messages grouped)."""
    intra = (machine.intra_latency + intra_bytes / machine.intra_bandwidth) if n_intra else 0.0
    inter = (machine.inter_latency + inter_bytes / machine.inter_bandwidth_per_gpu) if n_inter else 0.0
    return max(intra, inter)


def node_tiles(dims, gpus_per_node: int):
    """Node tiles (ranks of one node along each axis) that divide ``dims``."""
    per_node = min(gpus_per_node, int(np.prod(dims)))
    tiles = [t for t in factorizations(per_node, len(dims)) if all(d % x == 0 for d, x in zip(dims, t))]
    return tiles or [tuple(1 for _ in dims)]


def hidden_seconds(communication: float, compute: float, overlappable: float, overlap: str) -> float:
    if overlap == "none":
        return 0.0
    return min(communication, compute if overlap == "full" else overlappable * compute)


# -- predictions -----------------------------------------------------------------------------------------


def _grid_layout(recipe: GridRecipe, n_gpus: int, mode: str, machine: Machine, dims, tile) -> Prediction:
    if mode == "strong":
        local = [math.ceil(n / d) for n, d in zip(recipe.shape, dims)]
    else:
        local = list(recipe.shape)
    neighbours = split_neighbours(dims, tile, recipe.periodic)
    intra_bytes = inter_bytes = 0.0
    n_intra = n_inter = 0
    for axis, (intra, inter) in enumerate(neighbours):
        face = halo_face_bytes(local, axis, recipe.halo_width, recipe.n_fields, recipe.itemsize)
        intra_bytes += intra * face
        inter_bytes += inter * face
        n_intra += intra
        n_inter += inter
    per_exchange = exchange_seconds(intra_bytes, n_intra, inter_bytes, n_inter, machine)
    work = float(np.prod(local))
    compute = recipe.seconds_per_step * work / recipe.work
    interior = np.prod([max(n - 2 * recipe.halo_width * (count > 0), 0) for n, (count) in
                        zip(local, neighbours_per_axis(dims, recipe.periodic))]) / work
    communication = recipe.exchanges_per_step * per_exchange
    # Each exchange can hide behind its own share of the interior (one per stage).
    hidden = hidden_seconds(communication, compute, float(interior), machine.overlap)
    return Prediction(recipe.name, mode, n_gpus, _nodes(n_gpus, machine), tuple(dims), tuple(tile), work, compute,
                      communication, hidden, recipe.exchanges_per_step * intra_bytes,
                      recipe.exchanges_per_step * inter_bytes)


def _md_layout(recipe: MdRecipe, n_gpus: int, mode: str, machine: Machine, dims, tile) -> Prediction:
    atoms = recipe.n_atoms / n_gpus if mode == "strong" else recipe.n_atoms
    if mode == "strong":
        side = (recipe.n_atoms / recipe.density) ** (1 / 3)
        local = [side / d for d in dims]
    else:
        local = [(recipe.n_atoms / recipe.density) ** (1 / 3)] * 3
    neighbours = split_neighbours(dims, tile, (True, True, True))
    split = [d > 1 for d in dims]
    r = recipe.shell
    flux = recipe.density * math.sqrt(recipe.temperature / (2 * math.pi)) * recipe.dt   # atoms / area / step, one way
    intra_bytes = inter_bytes = 0.0
    n_intra = n_inter = 0
    for axis, (intra, inter) in enumerate(neighbours):
        # Staged exchange: the faces of later axes carry the ghosts of earlier ones.
        area = 1.0
        for other in range(3):
            if other != axis:
                area *= local[other] + (2 * r if (other < axis and split[other]) else 0.0)
        plain_area = float(np.prod([local[o] for o in range(3) if o != axis]))
        message = area * r * recipe.density * recipe.ghost_bytes + plain_area * flux * recipe.migrant_bytes
        intra_bytes += intra * message
        inter_bytes += inter * message
        n_intra += intra
        n_inter += inter
    communication = exchange_seconds(intra_bytes, n_intra, inter_bytes, n_inter, machine)
    compute = recipe.seconds_per_step * atoms / recipe.n_atoms
    interior = np.prod([max(length - 2 * r * s, 0.0) / length for length, s in zip(local, split)])
    hidden = hidden_seconds(communication, compute, float(interior), machine.overlap)
    return Prediction(recipe.name, mode, n_gpus, _nodes(n_gpus, machine), tuple(dims), tuple(tile), atoms, compute,
                      communication, hidden, intra_bytes, inter_bytes)


def _train_prediction(recipe: TrainRecipe, n_gpus: int, mode: str, machine: Machine) -> Prediction:
    batch = recipe.batch / n_gpus if mode == "strong" else recipe.batch
    compute = recipe.seconds_per_step * batch / recipe.batch
    nodes = _nodes(n_gpus, machine)
    communication = ring_allreduce_seconds(recipe.gradient_bytes, n_gpus, *allreduce_links(n_gpus, machine))
    moved = 2 * (n_gpus - 1) / n_gpus * recipe.gradient_bytes if n_gpus > 1 else 0.0
    hidden = hidden_seconds(communication, compute, recipe.overlap_fraction, machine.overlap)
    return Prediction(recipe.name, mode, n_gpus, nodes, (n_gpus,), (min(n_gpus, machine.gpus_per_node),), batch,
                      compute, communication, hidden, moved if nodes == 1 else 0.0, moved if nodes > 1 else 0.0)


def _nodes(n_gpus: int, machine: Machine) -> int:
    return math.ceil(n_gpus / machine.gpus_per_node)


def _layouts(recipe, n_gpus: int, mode: str):
    """Process grids to try: every factorisation that leaves each rank at least one cell (strong)."""
    n_axes = 3 if recipe.kind == "md" else len(recipe.shape)
    for dims in factorizations(n_gpus, n_axes):
        if recipe.kind == "grid" and mode == "strong" and any(d > n for d, n in zip(dims, recipe.shape)):
            continue
        yield dims


def predict(recipe, n_gpus: int, mode: str, machine: Machine, baseline: Prediction | None = None,
            dims: tuple[int, ...] | None = None) -> Prediction:
    """Predict one GPU count. ``mode`` is "strong" (same problem) or "weak" (same work per GPU).

    The process grid (unless ``dims`` fixes it, as an app's ``--dims`` does) and the node tile are the
    ones with the least time per step (then the least communication). Efficiency is against
    ``baseline`` (the 1-GPU prediction, computed if not given).
    """
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if recipe.kind == "train":
        best = _train_prediction(recipe, n_gpus, mode, machine)
    else:
        layout = _grid_layout if recipe.kind == "grid" else _md_layout
        candidates = [layout(recipe, n_gpus, mode, machine, dims, tile)
                      for dims in ([tuple(dims)] if dims else _layouts(recipe, n_gpus, mode))
                      for tile in node_tiles(dims, machine.gpus_per_node)]
        if not candidates:
            raise ConfigurationError(f"{recipe.name}: {n_gpus} GPUs cannot split {recipe.shape} (at least one cell "
                                     "per GPU along every axis); use fewer GPUs")
        best = min(candidates, key=lambda p: (p.compute + p.exposed, p.communication))
    best.seconds_per_step = best.compute + best.exposed
    if baseline is None:
        baseline = best if n_gpus == 1 else predict(recipe, 1, mode, machine)
    if mode == "strong":
        best.efficiency = baseline.seconds_per_step / (n_gpus * best.seconds_per_step)
    else:
        best.efficiency = baseline.seconds_per_step / best.seconds_per_step
    best.parts = {"compute": best.compute, "exposed communication": best.exposed, "hidden communication": best.hidden}
    return best


def predict_series(recipe, gpu_counts, mode: str, machine: Machine) -> list[Prediction]:
    baseline = predict(recipe, 1, mode, machine)
    return [baseline if n == 1 else predict(recipe, n, mode, machine, baseline) for n in gpu_counts]


def validate(recipes: dict, machine: Machine) -> list[dict]:
    """Model against each measurement. ``error`` is relative to the nearest end of the measured range
    (0 inside it); ``error_points`` is the same in percentage points for efficiencies."""
    rows = []
    for check in CHECKS:
        recipe = replace(recipes[check.recipe], **check.changes)
        prediction = predict(recipe, check.n_gpus, check.mode, machine, dims=check.dims)
        without = predict(recipe, check.n_gpus, check.mode, replace(machine, overlap="none"), dims=check.dims)
        value, value_without = (_quantity(check, recipe, p) for p in (prediction, without))
        low, high = check.measured
        nearest = min(max(value, low), high)
        nearest_without = min(max(value_without, low), high)
        rows.append({"what": check.what, "quantity": check.quantity, "model": value, "measured_low": low,
                     "measured_high": high, "error": value / nearest - 1.0,
                     "error_points": (value - nearest) * 100 if check.quantity == "efficiency" else None,
                     "model_no_overlap": value_without, "error_no_overlap": value_without / nearest_without - 1.0,
                     "error_points_no_overlap": ((value_without - nearest_without) * 100
                                                 if check.quantity == "efficiency" else None),
                     "source": check.source, "model_parts": dict(prediction.parts)})
    return rows


def _quantity(check: Check, recipe, prediction: Prediction) -> float:
    if check.quantity == "efficiency":
        return prediction.efficiency
    if check.quantity == "exchange seconds":
        return prediction.communication / recipe.exchanges_per_step
    return prediction.seconds_per_step * 1000

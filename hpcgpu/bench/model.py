"""Scaling model: predict strong and weak scaling from one GPU's step time and what a step moves.

No GPU is touched. For each app a *recipe* says what one step moves between GPUs; a *machine* says
how fast the links are; the prediction for ``n_gpus`` is::

    time per step = compute + exposed communication
    compute       = measured one-GPU time per step x (work per GPU / work of the measured run)
    communication = latency + bytes / bandwidth            (per exchange, worst rank)
    exposed       = communication - hidden
    hidden        = min(communication, overlappable compute)     ("interior" overlap, the default)

Recipes (worst-placed rank; bytes are sent *and* received, each way at the link's one-way speed):

- ``grid`` (Jacobi, shallow water: 2D; heat3d: 3D): a Cartesian decomposition; per neighbour a
  halo of ``face cells x halo_width x n_fields x itemsize`` bytes, ``exchanges_per_step`` times per
  step. The process grid and the node tile (the block of ``gpus_per_node`` ranks that shares a node)
  are chosen to minimise the communication time, so a neighbour across a tile edge is inter-node and
  one inside it is intra-node. Overlappable compute: the interior cells (farther than the halo width
  from every exchanged face).
- ``md`` (Lennard-Jones): a 3D decomposition of a cubic box; ghost atoms in a shell of width
  ``cutoff + skin`` sent every step, face by face (x, then y with the x ghosts, then z: the shell
  volume), ``3 x itemsize + id_bytes`` per atom; plus migration, atoms crossing a face at the
  thermal flux ``density sqrt(T / 2 pi m) dt`` per unit area per step. Overlappable compute: the
  atoms farther than the shell width from every exchanged face.
- ``train`` (data parallel): ring allreduce of the gradient, ``2 (p-1)/p x bytes / bus bandwidth``
  plus ``2 (p-1)`` hop latencies; the bus bandwidth is the slowest link: NVLink's measured allreduce
  bus bandwidth on one node, the node's InfiniBand bandwidth across nodes (one ring per NIC).
  Overlappable compute: the backward pass (``overlap_fraction`` of the step).

Links: intra-node messages of one GPU share its measured NVLink send/recv bandwidth (conservative:
H200 NVLink has more aggregate bandwidth than one peer pair reached); inter-node messages share the
node's NICs evenly among its GPUs. Intra- and inter-node transfers of one exchange run concurrently.
What the model leaves out, and where it misses, is in docs/scaling-model.md.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hpcgpu.decomposition import factorizations
from hpcgpu.errors import ConfigurationError

OVERLAP_MODES = ("interior", "none", "full")


@dataclass(frozen=True)
class Machine:
    """The links between GPUs. Bandwidths in bytes/s one way, latencies in seconds."""

    gpus_per_node: int = 8
    intra_latency: float = 10.3e-6          # NCCL grouped send+recv, 64 KiB, 2 H200 (DEVICE.md)
    intra_bandwidth: float = 202e9          # same, 16 MiB, each way
    inter_latency: float = 10.0e-6          # assumption: not measured (no multi-node machine)
    nic_count: int = 4                      # InfiniBand NICs per node
    nic_gbits: float = 400.0                # Gb/s per NIC, each way
    allreduce_bus_bandwidth: float = 332e9  # NCCL allreduce, 2 GPUs, 1 GiB (DEVICE.md)
    allreduce_hop_latency: float = 6.0e-6   # 12 us at 64 KiB on 2 GPUs = 2 ring steps
    overlap: str = "interior"

    @property
    def node_bandwidth(self) -> float:
        """InfiniBand bytes/s per node, each way."""
        return self.nic_count * self.nic_gbits * 1e9 / 8

    @property
    def inter_bandwidth_per_gpu(self) -> float:
        return self.node_bandwidth / self.gpus_per_node

    def describe(self) -> list[str]:
        return [f"{self.gpus_per_node} GPUs per node; NVLink inside a node: {self.intra_latency * 1e6:.1f} us + "
                f"bytes / {self.intra_bandwidth / 1e9:.0f} GB/s per GPU (all its intra-node messages share it)",
                f"between nodes: {self.nic_count} x {self.nic_gbits:.0f} Gb/s InfiniBand = "
                f"{self.node_bandwidth / 1e9:.0f} GB/s per node, {self.inter_bandwidth_per_gpu / 1e9:.1f} GB/s per GPU "
                f"when all send; latency {self.inter_latency * 1e6:.1f} us (assumed, not measured)",
                f"allreduce: ring, bus bandwidth {self.allreduce_bus_bandwidth / 1e9:.0f} GB/s in a node, "
                f"min(that, {self.node_bandwidth / 1e9:.0f} GB/s) across nodes; "
                f"{self.allreduce_hop_latency * 1e6:.1f} us per ring step in a node, "
                f"{max(self.allreduce_hop_latency, self.inter_latency) * 1e6:.1f} us across nodes",
                f"overlap: {OVERLAP_HELP[self.overlap]}"]


OVERLAP_HELP = {"interior": "interior compute hides the exchange up to the interior's duration "
                            "(grids: cells away from exchanged faces; md: atoms away from them; "
                            "train: the backward pass)",
                "none": "no overlap: all communication is exposed",
                "full": "all compute can hide communication (upper bound)"}


@dataclass(frozen=True)
class GridRecipe:
    """A stencil on a Cartesian grid. ``shape`` (cells, axis order as the app's) is the measured run's."""

    name: str
    shape: tuple[int, ...]
    seconds_per_step: float                 # measured, one GPU, at ``shape``
    halo_width: int
    n_fields: int
    itemsize: int
    exchanges_per_step: int
    periodic: tuple[bool, ...]
    source: str
    kind: str = "grid"

    @property
    def work(self) -> float:
        return float(np.prod(self.shape))


@dataclass(frozen=True)
class MdRecipe:
    """Lennard-Jones MD in a cubic periodic box. Lengths in LJ units (sigma), time in tau."""

    name: str
    n_atoms: float                          # of the measured run
    seconds_per_step: float
    density: float = 0.8442
    shell: float = 2.8                      # cutoff 2.5 + skin 0.3
    itemsize: int = 4                       # fp32 positions
    id_bytes: int = 4
    temperature: float = 1.44
    dt: float = 0.005
    source: str = ""
    kind: str = "md"

    @property
    def work(self) -> float:
        return self.n_atoms

    @property
    def ghost_bytes(self) -> int:
        return 3 * self.itemsize + self.id_bytes

    @property
    def migrant_bytes(self) -> int:
        return 6 * self.itemsize + self.id_bytes   # position and velocity


@dataclass(frozen=True)
class TrainRecipe:
    """Data-parallel training: every GPU holds the whole model; gradients are allreduced each step."""

    name: str
    n_parameters: float
    gradient_itemsize: int
    batch: int                              # samples per GPU of the measured run
    seconds_per_step: float
    overlap_fraction: float = 0.6           # the backward pass's share of the step (assumed)
    source: str = ""
    kind: str = "train"

    @property
    def work(self) -> float:
        return float(self.batch)

    @property
    def gradient_bytes(self) -> float:
        return self.n_parameters * self.gradient_itemsize


def default_recipes() -> dict:
    """The measured one-GPU inputs (docs/performance.md, shared/DEVICE.md), one recipe per app."""
    jacobi = GridRecipe("jacobi", (16384, 16384), 0.574 / 1000, halo_width=1, n_fields=1, itemsize=4,
                        exchanges_per_step=1, periodic=(True, False),
                        source="docs/performance.md: 16384^2 fp32, 0.574 s / 1000 iterations, 1 H200, --graph")
    swe = GridRecipe("swe", (4096, 8192), 4096 * 8192 / 5.18e9, halo_width=2, n_fields=3, itemsize=8,
                     exchanges_per_step=3, periodic=(False, True),
                     source="docs/performance.md: 8192 x 4096 fp64, 5.18e9 cell-updates/s, 1 H200, eager "
                            "(2026-12-01); h, u, v, halo 2, one exchange per SSP-RK3 stage")
    heat3d = GridRecipe("heat3d", (512, 512, 512), 512 ** 3 * 16 / 4.23e12, halo_width=1, n_fields=1, itemsize=8,
                        exchanges_per_step=1, periodic=(False, False, False),
                        source="NOT MEASURED: roofline, 512^3 fp64 at 16 B/update and 4.23 TB/s (DEVICE.md)")
    md = MdRecipe("md", 2.048e6, 2.048e6 / 1.34e9,
                  source="docs/performance.md: in.lj 2.05M atoms fp32, 1.34e9 atom-steps/s, 1 H200")
    train32 = TrainRecipe("train-fp32", 142.6e6, 4, 16384, 16384 / 58827,
                          source="docs/performance.md: 142.6M-parameter MLP, 16384/GPU, fp32 58,827 samples/s")
    train16 = TrainRecipe("train-fp16", 142.6e6, 2, 16384, 16384 / 603155,
                          source="docs/performance.md: same MLP, fp16, 603,155 samples/s")
    return {r.name: r for r in (jacobi, swe, heat3d, md, train32, train16)}


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
    if nodes == 1:
        bus, hop = machine.allreduce_bus_bandwidth, machine.allreduce_hop_latency
    else:
        bus = min(machine.allreduce_bus_bandwidth, machine.node_bandwidth)
        hop = max(machine.allreduce_hop_latency, machine.inter_latency)
    communication = ring_allreduce_seconds(recipe.gradient_bytes, n_gpus, bus, hop)
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


def with_measurement(recipes: dict, summary: dict) -> tuple[dict, str]:
    """Replace the matching recipe's one-GPU input by an app's ``--summary`` JSON (one rank).

    Time per step = (``wall_seconds`` - the ``communication`` timer's mean) / ``steps``. Returns the new
    recipes and the name of the one replaced.
    """
    for key in ("app", "steps", "wall_seconds"):
        if key not in summary:
            raise ConfigurationError(f"--measured: the summary has no {key!r}; "
                                     "expected the JSON an app writes with --summary")
    if int(summary.get("n_ranks", 1)) != 1:
        raise ConfigurationError(f"--measured: expected a one-rank summary (the model's input), found n_ranks="
                         f"{summary['n_ranks']}; rerun the app on one GPU with --summary")
    steps = max(int(summary["steps"]), 1)
    communication = summary.get("timers", {}).get("communication", {}).get("mean", 0.0)
    seconds = (float(summary["wall_seconds"]) - float(communication)) / steps
    source = (f"--measured: {summary['app']} {summary.get('model', '')} {summary.get('backend', '')}, "
              f"{steps} steps, commit {str(summary.get('git_commit', '?'))[:7]}").replace("  ", " ")
    app = str(summary["app"]).removeprefix("apps.")
    recipes = dict(recipes)
    if app == "stencil":
        name = summary.get("model", "jacobi")
        if name not in recipes:
            raise ConfigurationError(f"--measured: stencil model {name!r} has no recipe; "
                                     "expected one of jacobi, swe, heat3d")
        shape = tuple(int(n) for n in summary.get("decomposition", {}).get("global_shape", recipes[name].shape))
        sizes = {"float32": 4, "fp32": 4, "float64": 8, "fp64": 8}
        itemsize = sizes.get(summary.get("precision"), recipes[name].itemsize)
        recipes[name] = replace(recipes[name], shape=shape, seconds_per_step=seconds, itemsize=itemsize, source=source)
    elif app == "md":
        atoms = float(summary["throughput"]) * float(summary["wall_seconds"]) / steps
        name = "md"
        recipes[name] = replace(recipes[name], n_atoms=atoms, seconds_per_step=seconds, source=source)
    elif app == "train":
        name = "train-fp16" if str(summary.get("precision", "")).endswith("16") else "train-fp32"
        recipes[name] = replace(recipes[name], seconds_per_step=seconds, source=source)
    else:
        raise ConfigurationError(f"--measured: app {summary['app']!r} has no recipe; "
                         "expected apps.stencil, apps.md or apps.train")
    return recipes, name


# -- validation against every multi-GPU measurement we have ------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One multi-GPU measurement (docs/performance.md) and how the model reproduces it."""

    what: str
    recipe: str
    n_gpus: int
    mode: str
    quantity: str               # "seconds per 1000 steps", "efficiency", "exchange seconds"
    measured: tuple[float, float]
    source: str
    changes: dict = field(default_factory=dict)   # recipe fields for this case's measured one-GPU input
    dims: tuple[int, ...] | None = None           # the process grid the measured run used


CHECKS = (
    Check("Jacobi 16384^2 fp32, 2 GPUs, --peer-halo --graph", "jacobi", 2, "strong", "seconds per 1000 steps",
          (0.2989, 0.3017), "performance.md, 2026-11-30, four runs; 1-GPU input 0.574 s", dims=(2, 1)),
    Check("Jacobi 16384^2 fp32, 2 GPUs, default NCCL schedule", "jacobi", 2, "strong", "seconds per 1000 steps",
          (0.3116, 0.3205), "performance.md, 2026-11-30, three runs; 1-GPU input 0.586 s (same schedule)",
          {"seconds_per_step": 0.586e-3}, dims=(2, 1)),
    Check("Jacobi-shaped halo exchange, 2 ranks (8192 x 16386 per rank)", "jacobi", 2, "strong", "exchange seconds",
          (16.2e-6, 18.8e-6), "performance.md halo table: 16.2 us graph, 18.8 us eager", dims=(2, 1)),
    Check("MD weak 1->2 GPUs, 16.4M atoms per GPU", "md", 2, "weak", "efficiency", (0.960, 0.963),
          "performance.md: 96.3% (96.0% at 41d6fe2); 1-GPU input 1.369e9 atom-steps/s",
          {"n_atoms": 16.384e6, "seconds_per_step": 16.384e6 / 1.369e9}, dims=(2, 1, 1)),
    Check("MD weak 1->2 GPUs, 8.19M atoms per GPU", "md", 2, "weak", "efficiency", (0.932, 0.932),
          "performance.md: 93.2%; 1-GPU input assumed 1.34e9 atom-steps/s (not measured at this size)",
          {"n_atoms": 8.193532e6, "seconds_per_step": 8.193532e6 / 1.34e9}, dims=(2, 1, 1)),
    Check("MD weak 1->2 GPUs, 2.05M atoms per GPU", "md", 2, "weak", "efficiency", (0.905, 0.905),
          "performance.md: 90.5%", dims=(2, 1, 1)),
    Check("training fp32, 1->2 GPUs, 16384 per GPU", "train-fp32", 2, "weak", "efficiency", (0.987, 0.992),
          "performance.md: 98.7-99.2%"),
    Check("training fp16, 1->2 GPUs, 16384 per GPU", "train-fp16", 2, "weak", "efficiency", (0.940, 0.958),
          "performance.md: 94.0-94.4% NCCL default channels, 95.6-95.8% with 8 channels"),
)


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


# -- the subcommand ---------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    m = Machine()
    parser.add_argument("--apps", default="jacobi,swe,heat3d,md,train-fp32,train-fp16",
                        help="comma list of recipes [all: jacobi,swe,heat3d,md,train-fp32,train-fp16]")
    parser.add_argument("--gpus", default="1,2,8,16,64,512", help="comma list of GPU counts [1,2,8,16,64,512]")
    parser.add_argument("--modes", default="strong,weak", help="strong, weak or both [strong,weak]")
    parser.add_argument("--gpus-per-node", type=int, default=m.gpus_per_node, help=f"[{m.gpus_per_node}]")
    parser.add_argument("--intra-latency-us", type=float, default=m.intra_latency * 1e6,
                        help=f"NVLink message latency [{m.intra_latency * 1e6}: NCCL send/recv 64 KiB, DEVICE.md]")
    parser.add_argument("--intra-bandwidth-gbs", type=float, default=m.intra_bandwidth / 1e9,
                        help=f"NVLink GB/s per GPU, each way [{m.intra_bandwidth / 1e9:.0f}: NCCL send/recv 16 MiB]")
    parser.add_argument("--inter-latency-us", type=float, default=m.inter_latency * 1e6,
                        help=f"InfiniBand message latency [{m.inter_latency * 1e6}: assumed]")
    parser.add_argument("--nics", type=int, default=m.nic_count, help=f"InfiniBand NICs per node [{m.nic_count}]")
    parser.add_argument("--nic-gbits", type=float, default=m.nic_gbits,
                        help=f"Gb/s per NIC, each way [{m.nic_gbits:.0f}]")
    parser.add_argument("--allreduce-bus-gbs", type=float, default=m.allreduce_bus_bandwidth / 1e9,
                        help=f"allreduce bus bandwidth in a node [{m.allreduce_bus_bandwidth / 1e9:.0f}: DEVICE.md]")
    parser.add_argument("--allreduce-hop-latency-us", type=float, default=m.allreduce_hop_latency * 1e6,
                        help=f"latency per ring step [{m.allreduce_hop_latency * 1e6}: 12 us / 2 steps on 2 GPUs]")
    parser.add_argument("--overlap", choices=OVERLAP_MODES, default=m.overlap,
                        help="interior: interior compute hides the exchange up to its duration; none; full [interior]")
    parser.add_argument("--measured", metavar="FILE.json",
                        help="one-rank --summary of an app: replaces that app's input")
    parser.add_argument("--json", metavar="FILE", help="write predictions, assumptions and validation as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="draw efficiency vs GPUs (needs matplotlib)")


def machine_from_args(args) -> Machine:
    return Machine(gpus_per_node=args.gpus_per_node, intra_latency=args.intra_latency_us * 1e-6,
                   intra_bandwidth=args.intra_bandwidth_gbs * 1e9, inter_latency=args.inter_latency_us * 1e-6,
                   nic_count=args.nics, nic_gbits=args.nic_gbits, allreduce_bus_bandwidth=args.allreduce_bus_gbs * 1e9,
                   allreduce_hop_latency=args.allreduce_hop_latency_us * 1e-6, overlap=args.overlap)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def format_table(predictions: list[Prediction]) -> str:
    header = ("GPUs", "nodes", "dims", "tile/node", "ms/step", "eff", "compute ms", "exposed comm ms",
              "hidden comm ms", "intra MB", "inter MB")
    lines = [header]
    for p in predictions:
        lines.append((str(p.n_gpus), str(p.n_nodes), "x".join(map(str, p.dims)), "x".join(map(str, p.node_tile)),
                      _ms(p.seconds_per_step), f"{p.efficiency * 100:.1f}%", _ms(p.compute), _ms(p.exposed),
                      _ms(p.hidden), f"{p.intra_bytes / 1e6:.3g}", f"{p.inter_bytes / 1e6:.3g}"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in lines)


def _value_text(quantity: str, value: float) -> str:
    if quantity == "efficiency":
        return f"{value * 100:.1f}%"
    if quantity == "exchange seconds":
        return f"{value * 1e6:.1f} us"
    return f"{value:.3f} s"


def _error_text(row: dict, suffix: str = "") -> str:
    if row["quantity"] == "efficiency":
        return f"{row['error_points' + suffix]:+.1f} points"
    return f"{row['error' + suffix] * 100:+.1f}%"


def format_validation(rows: list[dict], overlap: str) -> str:
    """One line per measurement: the model under ``overlap`` and under no overlap, each with its error
    against the nearest end of the measured range."""
    out = []
    for row in rows:
        low, high = (_value_text(row["quantity"], row[k]) for k in ("measured_low", "measured_high"))
        measured = low if low == high else f"{low} to {high}"
        line = (f"  {row['what']}: measured {measured}; model ({overlap} overlap) "
                f"{_value_text(row['quantity'], row['model'])}, error {_error_text(row)}")
        if overlap != "none":
            line += (f"; no overlap {_value_text(row['quantity'], row['model_no_overlap'])}, "
                     f"error {_error_text(row, '_no_overlap')}")
        out.append(line + f"  [{row['source']}]")
    return "\n".join(out)


def write_plot(path, results: dict, results_without: dict | None = None) -> None:
    """Efficiency vs GPUs, one line per app; strong on the left, weak on the right; dashed, the same
    apps with no overlap (``results_without``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("strong", "weak") if any(m in series for series in results.values())]
    figure, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.0), squeeze=False)
    for axis, mode in zip(axes[0], modes):
        for name, series in results.items():
            if mode in series:
                gpus = [p.n_gpus for p in series[mode]]
                line, = axis.plot(gpus, [p.efficiency for p in series[mode]], "o-", label=name)
                if results_without:
                    axis.plot(gpus, [p.efficiency for p in results_without[name][mode]], "--",
                              color=line.get_color(), linewidth=1)
        axis.set_xscale("log", base=2)
        ticks = sorted({p.n_gpus for series in results.values() for p in series.get(mode, [])})
        axis.set_xticks(ticks, [str(n) for n in ticks])
        axis.set_ylim(0, 1.05)
        axis.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        axis.set_xlabel("GPUs (8 per node)")
        axis.set_ylabel("predicted parallel efficiency")
        axis.set_title(f"{mode} scaling (model; dashed: no overlap)" if results_without else f"{mode} scaling (model)")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def main(args) -> int:
    """The ``model`` subcommand: 0 on success, 2 on bad input (one message saying what to change)."""
    try:
        machine, recipes, names, modes, gpus = _parse(args)
        return _report(args, machine, recipes, names, modes, gpus)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _parse(args):
    """Validate the options; returns (machine, recipes, names, modes, gpus) or raises ConfigurationError."""
    numbers = {"--gpus-per-node": args.gpus_per_node, "--intra-bandwidth-gbs": args.intra_bandwidth_gbs,
               "--nics": args.nics, "--nic-gbits": args.nic_gbits, "--allreduce-bus-gbs": args.allreduce_bus_gbs}
    for flag, value in numbers.items():
        if not value > 0:
            raise ConfigurationError(f"{flag} {value}: expected a positive number")
    for flag, value in {"--intra-latency-us": args.intra_latency_us, "--inter-latency-us": args.inter_latency_us,
                        "--allreduce-hop-latency-us": args.allreduce_hop_latency_us}.items():
        if value < 0:
            raise ConfigurationError(f"{flag} {value}: expected a latency >= 0 microseconds")
    machine = machine_from_args(args)
    recipes = default_recipes()
    if args.measured:
        try:
            summary = json.loads(Path(args.measured).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"--measured {args.measured}: expected an app's --summary JSON, could not "
                                     f"read it ({exc}); write one with `python -m apps.NAME ... --summary FILE.json`"
                                     ) from None
        recipes, replaced = with_measurement(recipes, summary)
        print(f"input for {replaced} replaced by {args.measured}")
    names = [n.strip() for n in args.apps.split(",") if n.strip()]
    unknown = [n for n in names if n not in recipes]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown or not names:
        raise ConfigurationError(f"--apps {args.apps!r}: unknown {unknown}; expected a comma list of "
                                 f"{', '.join(recipes)}")
    if not modes or any(m not in ("strong", "weak") for m in modes):
        raise ConfigurationError(f"--modes {args.modes!r}: expected strong, weak or strong,weak")
    try:
        gpus = sorted({int(n) for n in args.gpus.split(",") if n.strip()} | {1})
    except ValueError:
        gpus = [0]
    if gpus[0] < 1:
        raise ConfigurationError(f"--gpus {args.gpus!r}: expected a comma list of positive GPU counts like 1,2,8,64")
    return machine, recipes, names, modes, gpus


def _report(args, machine: Machine, recipes: dict, names: list[str], modes: list[str], gpus: list[int]) -> int:
    """Print the tables and the validation; write --json and --plot."""
    print("Scaling model (hpcgpu.bench.model): predicted, not measured. Assumptions:")
    for line in machine.describe():
        print(f"  - {line}")
    results = {}
    for name in names:
        recipe = recipes[name]
        results[name] = {mode: predict_series(recipe, gpus, mode, machine) for mode in modes}
        print(f"\n== {name} ({recipe.kind}); input: {recipe.source}")
        for mode in modes:
            print(f"-- {mode} scaling" + (" (same problem)" if mode == "strong" else " (same work per GPU)"))
            print(format_table(results[name][mode]))
    # The measurements were made with the default inputs (one H200), not with a --measured summary.
    validation = validate(default_recipes(), machine)
    print("\nValidation against multi-GPU measurements (2 H200 on NVLink; docs/performance.md; "
          "default one-GPU inputs):")
    print(format_validation(validation, machine.overlap))
    if args.json:
        document = {"assumptions": machine.describe(), "machine": machine.__dict__,
                    "inputs": {n: {"source": recipes[n].source, "seconds_per_step": recipes[n].seconds_per_step}
                               for n in names},
                    "predictions": {n: {m: [{**{k: v for k, v in p.__dict__.items()}, "exposed": p.exposed}
                                            for p in series] for m, series in r.items()} for n, r in results.items()},
                    "validation": validation}
        Path(args.json).write_text(json.dumps(document, indent=1, default=list))
        print(f"\nwrote {args.json}")
    if args.plot:
        try:
            without = None
            if machine.overlap != "none":
                plain = replace(machine, overlap="none")
                without = {n: {m: predict_series(recipes[n], gpus, m, plain) for m in modes} for n in names}
            write_plot(args.plot, results, without)
            print(f"wrote {args.plot}")
        except ImportError:
            print("--plot: matplotlib is not installed; pip install matplotlib")
    return 0

"""Inputs of the scaling model (:mod:`hpcgpu.bench.model`): the machine, one recipe per app, measurements.

A :class:`Machine` says how fast the links between GPUs are; a recipe (:class:`GridRecipe`,
:class:`MdRecipe`, :class:`TrainRecipe`) says what one step of an app moves and how long one GPU took
for it (:func:`default_recipes`, or an app's ``--summary`` through :func:`with_measurement`);
:data:`CHECKS` are the multi-GPU measurements the model is validated against. The arithmetic that
turns these into predictions is :mod:`hpcgpu.bench.model_predict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

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
    swe = GridRecipe("swe", (4096, 8192), 4096 * 8192 / 1.456e10, halo_width=2, n_fields=3, itemsize=8,
                     exchanges_per_step=3, periodic=(False, True),
                     source="docs/performance.md: 8192 x 4096 fp64, 1.447e10-1.466e10 cell-updates/s, 1 H200, "
                            "default path (CUDA graphs; 14b8195, 2026-12-02); h, u, v, halo 2, one exchange per "
                            "SSP-RK3 stage")
    heat3d = GridRecipe("heat3d", (512, 512, 512), 512 ** 3 / 2.206e11, halo_width=1, n_fields=1, itemsize=8,
                        exchanges_per_step=1, periodic=(False, False, False),
                        source="docs/performance.md: 512^3 fp64, 2.200e11-2.214e11 cell-updates/s, 1 H200, "
                               "default path (CUDA graphs; 3b11943, 2026-12-02; one rank: the sweep fills "
                               "its own periodic ghosts, 2-9% faster than the sweep alone of a rank with "
                               "neighbours)")
    md = MdRecipe("md", 2.048e6, 2.048e6 / 1.34e9,
                  source="docs/performance.md: in.lj 2.05M atoms fp32, 1.34e9 atom-steps/s, 1 H200")
    train32 = TrainRecipe("train-fp32", 142.6e6, 4, 16384, 16384 / 58827,
                          source="docs/performance.md: 142.6M-parameter MLP, 16384/GPU, fp32 58,827 samples/s")
    train16 = TrainRecipe("train-fp16", 142.6e6, 2, 16384, 16384 / 603155,
                          source="docs/performance.md: same MLP, fp16, 603,155 samples/s")
    return {r.name: r for r in (jacobi, swe, heat3d, md, train32, train16)}


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

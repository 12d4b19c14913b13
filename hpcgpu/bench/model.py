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

# The docstring above is the subcommand's --help. The inputs (machine, recipes, measurements) are
# hpcgpu/bench/model_inputs.py, the arithmetic hpcgpu/bench/model_predict.py; this module is the
# subcommand: options, tables, JSON and plot.

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from hpcgpu.bench.model_hybrid import EXAMPLES, format_hybrid_table, hybrid_table
from hpcgpu.bench.model_inputs import OVERLAP_MODES, Machine, default_recipes, with_measurement
from hpcgpu.bench.model_predict import (Prediction, halo_face_bytes, predict, predict_series, ring_allreduce_seconds,
                                        split_neighbours, validate)
from hpcgpu.errors import ConfigurationError

# The subcommand, and (re-exported for tests/bench/test_scaling_model.py) the model's inputs and arithmetic.
__all__ = ["add_arguments", "main", "machine_from_args", "format_table", "format_validation", "write_plot",
           "Machine", "default_recipes", "with_measurement", "halo_face_bytes", "predict", "predict_series",
           "ring_allreduce_seconds", "split_neighbours", "validate"]


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
    parser.add_argument("--hybrid", action="store_true",
                        help="instead: data x tensor x pipeline training of two MLPs on 8-512 GPUs "
                             "(hpcgpu/bench/model_hybrid.py)")


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
        if getattr(args, "hybrid", False):
            return _report_hybrid(machine)
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


def _report_hybrid(machine: Machine) -> int:
    """Print the hybrid-parallel training table (:mod:`hpcgpu.bench.model_hybrid`)."""
    print("Hybrid-parallel training (hpcgpu.bench.model_hybrid): predicted, not measured. Assumptions:")
    for line in machine.describe():
        print(f"  - {line}")
    for model in EXAMPLES:
        print(f"  - {model.name}: {model.parameters:.3g} parameters, {model.rows} rows per replica, "
              f"{model.flops_per_second / 1e12:.0f} TFLOP/s per GPU; {model.source}")
    print(format_hybrid_table(hybrid_table(machine)))
    return 0


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

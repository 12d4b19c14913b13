"""Every speed target of the climate stencil (issue 25) in one command, with its fraction of the goal.

Runs, on one device, each target's measurement and prints one table last:

* ``kernels``: the shallow-water stage kernels at 8192 x 4096, fp64 and fp32, as a fraction of the
  copy bandwidth measured in the same run (``benchmarks/stencil_kernels.py``; GPU only); goal 70%.
* ``small``: 512 x 256, 20,000 steps, default path against ``--no-graph``: steps/s (goal 20,000) and
  whether the two checksums are equal.
* ``jet``: the 3600 x 1800 jet, fp64 and fp32, ``--repeats`` runs: cell-updates/s, the fraction of the
  roofline (192 B per update fp64, 96 B fp32, at the copy bandwidth measured here) and the run-to-run
  spread (goal < 10%).
* ``heat3d``: 512^3 fp64, 1000 steps, ``--repeats`` runs: the median's fraction of the copy bandwidth at 16 B per update (goal 70%).
* ``latlon``: 1440 x 720 (0.25 deg) fp64 against the channel per cell (goal: within 2x), 3000 steps
  each: long enough that start-up (first eager steps, graph captures) does not decide the ratio
  (at 500 steps the channel's run is mostly start-up and the ratio looked twice as good).
* ``peer``: the JAX/XLA peer side by side (``benchmarks/swe_jax_peer.py``): time to solution (goal 3x)
  and per cell-step (goal 1x), fp32 and fp64.

Each app run is ``python -m apps.stencil ... --summary FILE`` (its timed loop excludes set-up). The
copy bandwidth is measured first (read + write bytes): on a GPU as the apps' plausibility check does
(:func:`hpcgpu.app.plausibility.measured_copy_bandwidth`), on the CPU ``numpy.copyto`` of 256 MiB. Minimum and median over the repeats are given where there are several.

Usage::

    python3 benchmarks/stencil_targets.py                       # every target, GPU sizes
    python3 benchmarks/stencil_targets.py --only small,jet --repeats 3
    python3 benchmarks/stencil_targets.py --quick --backend cpu # a smoke test at small sizes (CPU)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcgpu.app.plausibility import measured_copy_bandwidth  # noqa: E402 - after the path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("kernels", "small", "jet", "heat3d", "latlon", "peer")
BYTES_PER_UPDATE = {"swe-fp64": 192, "swe-fp32": 96, "heat3d-fp64": 16}
_RUNS = itertools.count()


def sizes(quick: bool) -> dict:
    """Problem sizes per target (``--quick``: seconds on a CPU, for smoke tests)."""
    if quick:
        return {"small": (64, 32, 200), "jet": (120, 60, 40), "heat3d": (24, 30), "latlon": (72, 36, 20),
                "kernels": "256x128"}
    return {"small": (512, 256, 20000), "jet": (3600, 1800, 2000), "heat3d": (512, 1000),
            "latlon": (1440, 720, 3000), "kernels": "8192x4096"}


def copy_bandwidth(backend: str) -> float:
    """Measured copy bandwidth in B/s (read + write bytes): the GPU's as the apps measure it, else the best
    of 10 ``numpy.copyto`` calls."""
    if backend == "gpu":
        import cupy

        return measured_copy_bandwidth(cupy.cuda.Device().id)   # what the apps' plausibility check uses
    import numpy as np

    a = np.ones(2**25, dtype=np.float64)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(10):
        started = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - started)
    return 2 * a.nbytes / best


def run_app(args: list[str], directory: str, backend: str) -> dict:
    """One ``apps.stencil`` run; its JSON summary."""
    index = next(_RUNS)
    summary = os.path.join(directory, f"summary{index}.json")
    command = [sys.executable, "-m", "apps.stencil", "--quiet", "--no-plot", "--snapshot-every", "0",
               "--backend", "cupy" if backend == "gpu" else "numpy", "--output",
               os.path.join(directory, f"out{index}"), "--summary", summary, *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
    return json.loads(Path(summary).read_text())


def spread(values: list[float]) -> float:
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def row(target: str, measured: str, fraction: float | None, goal: str, met: bool | None) -> dict:
    return {"target": target, "measured": measured, "fraction": fraction, "goal": goal, "met": met}


def measure_small(size, repeats, directory, backend) -> list[dict]:
    nx, ny, steps = size
    base = ["--model", "swe", "--nx", str(nx), "--ny", str(ny), "--steps", str(steps)]
    graph = [run_app(base, directory, backend) for _ in range(repeats)]
    eager = run_app(base + ["--no-graph"], directory, backend)
    rates = [s["steps"] / s["wall_seconds"] for s in graph]
    same = len({s["checksum"] for s in graph + [eager]}) == 1
    median = statistics.median(rates)
    return [row(f"{nx} x {ny} steps/s, default path", f"{min(rates):,.0f} min / {median:,.0f} median "
                f"(--no-graph {eager['steps'] / eager['wall_seconds']:,.0f}); graph used: {graph[0].get('graph')}",
                median / 20000, ">= 20,000 steps/s", median >= 20000),
            row(f"{nx} x {ny} checksums, default == --no-graph", "equal" if same else "DIFFER", None, "equal", same)]


def measure_jet(size, repeats, directory, backend, copy) -> list[dict]:
    nx, ny, steps = size
    rows = []
    for precision in ("fp64", "fp32"):
        runs = [run_app(["--model", "swe", "--nx", str(nx), "--ny", str(ny), "--steps", str(steps),
                         "--precision", precision], directory, backend) for _ in range(repeats)]
        rates = [s["throughput"] for s in runs]
        median = statistics.median(rates)
        roofline = copy / BYTES_PER_UPDATE[f"swe-{precision}"]
        rows.append(row(f"{nx} x {ny} jet {precision}", f"{min(rates):.3e} min / {median:.3e} median cell-updates/s, "
                        f"spread {100 * spread(rates):.1f}%", median / roofline, "spread < 10% (roofline shown)",
                        spread(rates) < 0.10))
    return rows


def measure_heat3d(size, repeats, directory, backend, copy) -> list[dict]:
    n, steps = size
    rates = [run_app(["--model", "heat3d", "--nx", str(n), "--ny", str(n), "--nz", str(n), "--steps", str(steps),
                      "--nan-check-every", "0"], directory, backend)["throughput"] for _ in range(repeats)]
    median = statistics.median(rates)
    fraction = median * BYTES_PER_UPDATE["heat3d-fp64"] / copy
    return [row(f"heat3d {n}^3 fp64 app", f"{min(rates):.3e} min / {median:.3e} median cell-updates/s", fraction,
                ">= 70% of copy (median)", fraction >= 0.70)]


def measure_latlon(size, directory, backend) -> list[dict]:
    nx, ny, steps = size
    common = ["--nx", str(nx), "--ny", str(ny), "--steps", str(steps), "--nan-check-every", "0"]
    latlon = run_app(["--model", "swe", "--grid", "latlon", *common], directory, backend)
    channel = run_app(["--model", "swe", *common], directory, backend)
    ratio = channel["throughput"] / latlon["throughput"]
    return [row(f"lat-lon {nx} x {ny} vs channel per cell", f"lat-lon {latlon['throughput']:.3e}, channel "
                f"{channel['throughput']:.3e}: channel {ratio:.1f}x faster", 2.0 / ratio, "within 2x", ratio <= 2.0)]


def measure_kernels(size, directory, backend) -> list[dict]:
    if backend != "gpu":
        return [row("stage kernels", "GPU only", None, ">= 70% of copy", None)]
    out = os.path.join(directory, "kernels.json")
    command = [sys.executable, "benchmarks/stencil_kernels.py", "--variants", "none", "--heat3d-size", "0",
               "--swe-size", size, "--repeats", "5", "--batch", "10", "--dtypes", "float64,float32", "--json", out]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if not Path(out).exists():
        raise RuntimeError(f"stencil_kernels.py failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}")
    rows = []
    results = [r for r in json.loads(Path(out).read_text())["results"] if r["kernel"] == "swe" and r.get("glups")]
    for dtype in ("float64", "float32"):
        candidates = [r for r in results if r["dtype"] == dtype and r.get("percent_of_measured_copy")]
        if candidates:
            best = max(candidates, key=lambda r: r["glups"])
            fraction = best["percent_of_measured_copy"] / 100
            rows.append(row(f"stage kernels {size} {dtype}", f"{best['glups']:.2f} G updates/s ({best['variant']})",
                            fraction, ">= 70% of copy", fraction >= 0.70))
    return rows


def measure_peer(directory, backend, quick) -> list[dict]:
    if backend != "gpu" and not quick:
        return [row("JAX peer", "GPU only", None, ">= 3x time to solution", None)]
    out = os.path.join(directory, "peer.json")
    nx, ny = (120, 60) if quick else (3600, 1800)
    command = [sys.executable, "benchmarks/swe_jax_peer.py", "--nx", str(nx), "--ny", str(ny), "--steps",
               "20" if quick else "2000", "--repeats", "1" if quick else "3", "--json", out]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    if not Path(out).exists():
        return [row("JAX peer", f"not run: {(result.stderr.strip().splitlines() or ['?'])[-1][:80]}", None,
                    ">= 3x time to solution", None)]
    rows = []
    for pair in json.loads(Path(out).read_text())["rows"]:
        ours, peer = pair["ours"], pair["peer"]
        per_cell = statistics.median(ours["rates"]) / statistics.median(peer["rates"])
        solution = per_cell * ours["dt"] / peer["dt"]
        rows.append(row(f"JAX peer {ours['precision']}", f"time to solution {solution:.2f}x, per cell-step "
                        f"{per_cell:.2f}x", solution / 3.0, ">= 3x and >= 1x per cell-step",
                        solution >= 3.0 and per_cell >= 1.0))
    return rows


def print_table(rows: list[dict], copy: float, backend: str) -> None:
    print(f"\nstencil targets (issue 25), {backend}; copy bandwidth measured here {copy / 1e12:.3f} TB/s")
    print(f"{'target':<44} {'of goal':>8} {'met':>5}  measured (goal)")
    for r in rows:
        fraction = "-" if r["fraction"] is None else f"{100 * r['fraction']:.0f}%"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['target']:<44} {fraction:>8} {met:>5}  {r['measured']} ({r['goal']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(TARGETS), help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--repeats", type=int, default=3, help="runs per repeated target [3]")
    parser.add_argument("--backend", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test; the goals do not apply)")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    args = parser.parse_args(argv)
    only = [t for t in args.only.split(",") if t]
    unknown = sorted(set(only) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}")
    backend = args.backend
    if backend == "auto":
        try:
            import cupy

            backend = "gpu" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
        except Exception:   # noqa: BLE001 - no CuPy or no device: the CPU path
            backend = "cpu"
    size = sizes(args.quick)
    copy = copy_bandwidth(backend)
    rows = []
    with tempfile.TemporaryDirectory(prefix="stencil-targets-") as directory:
        for target in only:
            started = time.perf_counter()
            if target == "kernels":
                rows += measure_kernels(size["kernels"], directory, backend)
            elif target == "small":
                rows += measure_small(size["small"], args.repeats, directory, backend)
            elif target == "jet":
                rows += measure_jet(size["jet"], args.repeats, directory, backend, copy)
            elif target == "heat3d":
                rows += measure_heat3d(size["heat3d"], args.repeats, directory, backend, copy)
            elif target == "latlon":
                rows += measure_latlon(size["latlon"], directory, backend)
            elif target == "peer":
                rows += measure_peer(directory, backend, args.quick)
            print(f"  {target}: {time.perf_counter() - started:.1f} s", flush=True)
    print_table(rows, copy, backend)
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": backend, "quick": args.quick, "copy_bytes_per_second": copy,
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

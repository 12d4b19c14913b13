"""Where a lat-lon shallow-water step's time goes, piece by piece, on one device.

Builds the ``apps.stencil --grid latlon`` model (one rank, the app's options) and times, per call:

* ``stage kernel``: one SSP-RK3 stage over all owned cells (polar rows write their increments);
* ``polar filter (METHOD)``: the filter and combine of one stage, for each method of ``--filters``
  (GPU: ``auto``, ``fused``, ``cufft``, :data:`apps.stencil.sphere.polar_filter_gpu.DEVICE_FILTER`;
  CPU: the NumPy filter);
* ``halo exchange``: one exchange of (h, u, v), pole mirrors included;
* ``step``: a whole step (three stages);
* ``history entry``: the diagnostics of one history entry (energy, enstrophy; a host synchronisation).

On a GPU every piece but the history entry is captured as a CUDA graph of ``--calls`` calls and
replayed ``--repeats`` times (the app's default path replays graphs too); the median time per call
is printed. On the CPU each piece runs eagerly. The last table gives microseconds per call and, for
the step, steps/s and cell-updates/s.

Usage::

    python3 benchmarks/latlon_step.py                                  # 1440 x 720 fp64, auto filter
    python3 benchmarks/latlon_step.py --precision fp32 --filters auto,fused,cufft
    python3 benchmarks/latlon_step.py --nx 72 --ny 36 --backend cpu    # a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hpcgpu  # noqa: E402 - after the path
from apps.stencil.app import build_parser, make_model, resolve_options, setup_architecture  # noqa: E402
from apps.stencil.swe_scheme.stage import shallow_water_stage  # noqa: E402
from apps.stencil.sphere.polar_filter import filter_and_combine  # noqa: E402


class _NoTimers:
    def phase(self, name):
        return contextlib.nullcontext()


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nx", type=int, default=1440, help="cells along longitude [1440]")
    parser.add_argument("--ny", type=int, default=720, help="cells along latitude [720]")
    parser.add_argument("--precision", choices=("fp64", "fp32"), default="fp64")
    parser.add_argument("--filters", default="auto,fused,cufft",
                        help="GPU polar-filter methods to time, comma-separated [auto,fused,cufft]")
    parser.add_argument("--backend", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--calls", type=int, default=30, help="calls per captured graph (GPU) [30]")
    parser.add_argument("--repeats", type=int, default=5, help="timed replays (GPU) or calls (CPU) [5]")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    return parser.parse_args(argv)


def _time_per_call(fn, arch, calls: int, repeats: int, graph: bool) -> float:
    """Median seconds per call of ``fn``: replays of a graph of ``calls`` calls, or eager calls."""
    fn()
    arch.synchronize()
    if graph:
        from hpcgpu.runtime.capture import capture_graph

        stream = arch.compute_stream
        with arch.on_stream(stream):
            recorded = capture_graph(stream, lambda: [fn() for _ in range(calls)])
        recorded.upload(stream)
        run, per_run = (lambda: recorded.launch(stream)), calls
    else:
        run, per_run = fn, 1
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        arch.synchronize()
        times.append((time.perf_counter() - started) / per_run)
    return statistics.median(times)


def measure(arguments) -> dict:
    backend = {"auto": "auto", "gpu": "cupy", "cpu": "numpy"}[arguments.backend]
    app_arguments = ["--grid", "latlon", "--nx", str(arguments.nx), "--ny", str(arguments.ny),
                     "--precision", arguments.precision, "--backend", backend, "--snapshot-every", "0"]
    comm = hpcgpu.Communicator()
    options = resolve_options(build_parser().parse_args(app_arguments))
    arch = setup_architecture(comm, options)
    model = make_model(comm, arch, options)
    model.prepare()
    graph = bool(arch.is_gpu)
    state = [f.data for f in model.state]
    source, target = ([f.data for f in triple] for triple in model.work)
    a, b = 0.75, 0.25   # the second stage's weights
    filters = [m for m in arguments.filters.split(",") if m] if arch.is_gpu else ["numpy"]
    if arch.is_gpu:
        from apps.stencil.sphere import polar_filter_gpu
        unknown = set(filters) - {"auto", "fused", "cufft"}
        if unknown:
            raise SystemExit(f"--filters: unknown method(s) {sorted(unknown)}; choose from auto, fused, cufft")
    rows = []

    def add(name, seconds, extra=None):
        rows.append({"piece": name, "us_per_call": seconds * 1e6, **(extra or {})})
        print(f"  {name:34s} {seconds * 1e6:10.1f} us", flush=True)

    print(f"lat-lon {arguments.nx} x {arguments.ny} {arguments.precision}, {'gpu' if arch.is_gpu else 'cpu'}, "
          f"{len(model.plan.rows)} filtered rows, {'graphs of ' + str(arguments.calls) + ' calls' if graph else 'eager'}",
          flush=True)
    add("stage kernel", _time_per_call(
        lambda: shallow_water_stage(target, state, source, a, b, model.dt, model.tile.metrics, model.owned,
                                    model.increment, model.filtered_rows),
        arch, arguments.calls, arguments.repeats, graph))
    for method in filters:
        if arch.is_gpu:
            polar_filter_gpu.DEVICE_FILTER["method"] = method
        try:
            seconds = _time_per_call(lambda: filter_and_combine(target, state, source, model.increment, a, b, model.plan,
                                                                model.gather),
                                     arch, arguments.calls, arguments.repeats, graph)
        finally:
            if arch.is_gpu:
                polar_filter_gpu.DEVICE_FILTER["method"] = "auto"
        add(f"polar filter ({method})", seconds)
    add("halo exchange", _time_per_call(
        lambda: hpcgpu.exchange_halos(model.work[0], boundary_conditions=model.boundary_conditions),
        arch, arguments.calls, arguments.repeats, graph))
    step = _time_per_call(lambda: model.step(_NoTimers()), arch, arguments.calls, arguments.repeats, graph)
    add("step", step, {"steps_per_second": 1 / step, "cell_updates_per_second": arguments.nx * arguments.ny / step})
    add("history entry", _time_per_call(model._diagnostics_now, arch, 1, arguments.repeats, False))
    return {"nx": arguments.nx, "ny": arguments.ny, "precision": arguments.precision,
            "backend": "gpu" if arch.is_gpu else "cpu", "graphs": graph, "rows": rows}


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    report = measure(arguments)
    step = next(row for row in report["rows"] if row["piece"] == "step")
    print(f"step: {step['steps_per_second']:,.0f} steps/s, {step['cell_updates_per_second']:.3e} cell-updates/s")
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

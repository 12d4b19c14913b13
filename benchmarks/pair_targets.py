"""Issue 28's runs on a pair of GPUs (or two CPU ranks) in one command, with a table of targets last.

Each section launches the apps or the benchmark programs under MPI with two ranks (and one where it
needs a baseline), each run under a timeout, and turns their ``--summary`` / ``--json`` output into
table rows (target, measured, fraction of the goal, met):

* ``jacobi``: 16384^2, 1000 iterations, on 1 rank and on 2 ranks with every schedule (default: CUDA
  graphs, NCCL, interior overlapped; ``--peer-halo``, GPU only; ``--no-graph``; ``--no-overlap``):
  each wall time, the fastest against issue 3's 0.30 s on 2 GPUs, and every checksum equal.
* ``swe``: shallow-water weak scaling 1 -> 2 ranks at 8192 x 4096 per rank
  (``python -m hpcgpu.bench scaling --weak``); goal 97%.
* ``latlon``: the lat-lon model 1 -> 2 ranks in latitude bands, 1440 x 720 per rank (``--dims 2,1``).
* ``md``: MD weak scaling 1 -> 2 ranks at 2,048,000 and 16,384,000 atoms per rank (``hpcgpu.bench
  scaling --app md --weak``); goal 95% at both.
* ``train``: data-parallel training 1 -> 2 ranks, fp32, bf16 and fp16 (``benchmarks/train_ddp.py
  --rounds R``: each round pairs a 2-rank step with the same step without communication); goal 95%.
* ``network``: the same runs as two pretend nodes (``jobscripts/mpirun/simulate-nodes.sh`` with
  ``HPCGPU_SIMULATE_NODES=2``, ``NCCL_SOCKET_IFNAME=lo``, ``NCCL_DEBUG=INFO``: NCCL's network
  transport between the two ranks, see docs/multinode.md): the halo benchmark's latency and
  bandwidth plain and across the pretend nodes, whether NCCL's log shows its network transport,
  and for Jacobi, shallow water, MD and training the checksum against the plain run and the
  communication time per step.
* ``split``: ``apps.train --model residual-mlp`` with ``--tensor-parallel 2`` and ``--pipeline-parallel
  2 --micro-batches 4`` against the one-rank run: loss curves within the stated tolerance, step
  time, and the communication bytes the run measured against the computed volume.

The MPI launcher is the test suite's (:mod:`hpcgpu.jobs.launch`: ``$HPCGPU_MPIEXEC``, else the ``mpiexec``
beside Python, else on ``PATH``; extra flags from ``$HPCGPU_MPIEXEC_FLAGS``; Open MPI gets
``--oversubscribe --bind-to none``), and a run past ``--timeout`` is killed with its process group.
On the GPU machines keep ``NCCL_NVLS_ENABLE=0`` (and, as root, ``OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``). Every run's command, log and output are kept under ``--output``
(a new directory: an existing one is refused, so no earlier campaign is overwritten); ``--json``
writes the rows. The exit status is 1 when a goal is missed or a run fails.

Usage::

    python3 benchmarks/pair_targets.py --output pair-run                                # everything, 2 GPUs
    python3 benchmarks/pair_targets.py --only swe,md --output pair-scaling
    python3 benchmarks/pair_targets.py --quick --backend cpu --output /tmp/pair-smoke   # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcgpu.jobs.launch import mpiexec_command, run_command, run_mpi  # noqa: E402 - after the path
SECTIONS = ("jacobi", "swe", "latlon", "md", "train", "network", "split")
SIMULATE_NODES = ROOT / "jobscripts" / "mpirun" / "simulate-nodes.sh"


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of sections [{','.join(SECTIONS)}]")
    parser.add_argument("--backend", choices=("gpu", "cpu"), default="gpu", help="gpu: CuPy + NCCL [gpu]; cpu: NumPy ranks")
    parser.add_argument("--quick", action="store_true", help="small sizes and few steps: a smoke test of the program")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run [600]")
    parser.add_argument("--rounds", type=int, default=5, help="train: in-process pairs per precision [5]")
    parser.add_argument("--output", required=True, help="a new directory for every run's command, log and output")
    parser.add_argument("--json", metavar="FILE", help="write the table's rows as JSON")
    arguments = parser.parse_args(argv)
    unknown = set(arguments.only.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    return arguments


def sizes(quick: bool) -> dict:
    """Problem sizes per section (``--quick``: seconds on two CPU cores)."""
    if quick:
        return {"jacobi": (96, 40), "swe": (64, 32, 20), "latlon": (72, 36, 20), "md": ((4, 20), (5, 20)),
                "train": ["--width", "32", "--depth", "1", "--inputs", "16", "--classes", "4", "--batch-per-gpu", "16",
                          "--steps", "2", "--warmup", "1"],
                "net_swe": (64, 32, 20), "net_md": (4, 20), "net_train": 5, "net_jacobi": (96, 40),
                "split": ["--depth", "2", "--width", "16", "--hidden", "32", "--steps", "6", "--batch-size", "24"],
                "halo_sizes": "1024,65536"}
    return {"jacobi": (16384, 1000), "swe": (8192, 4096, 200), "latlon": (1440, 720, 1000),
            "md": ((80, 200), (160, 100)),
            "train": ["--warmup", "3", "--steps", "20"],
            "net_swe": (3600, 1800, 500), "net_md": (80, 200), "net_train": 100, "net_jacobi": (8192, 500),
            "split": ["--steps", "50"],
            "halo_sizes": "16384,4194304"}


class Campaign:
    """Launches the runs (each under a timeout, its command and log kept) and collects the rows."""

    def __init__(self, arguments):
        self.arguments = arguments
        self.output = Path(arguments.output)
        if self.output.exists():
            print(f"pair_targets.py: --output {self.output} exists: give a new directory (an earlier campaign is "
                  "never overwritten)", file=sys.stderr)
            raise SystemExit(2)
        self.output.mkdir(parents=True)
        self.gpu = arguments.backend == "gpu"
        self.backend = "cupy" if self.gpu else "numpy"
        self.judged = self.gpu and not arguments.quick   # the speed goals hold for 2 GPUs at the full sizes
        self.rows: list[dict] = []
        self._count = 0

    # ---------------------------------------------------------------------------------- launching
    def run(self, name: str, args: list[str], ranks: int | None = None, env: dict | None = None,
            timeout: float | None = None) -> tuple[Path, str]:
        """Run ``python ARGS`` on ``ranks`` MPI ranks (None: one process without the launcher), with its
        command and log under ``output/NN-name``, killed after ``timeout`` s (default ``--timeout``);
        return (directory, log). ``{dir}`` in an argument is that directory. Raises RuntimeError with the
        log's tail when the run fails or times out."""
        timeout = timeout or self.arguments.timeout
        self._count += 1
        directory = self.output / f"{self._count:02d}-{name}"
        directory.mkdir()
        args = [part.replace("{dir}", str(directory)) for part in args]
        started = time.perf_counter()
        if ranks is None:
            command = [sys.executable, *args]
            result = run_command(command, timeout, env=env, cwd=ROOT, label="pair_targets")  # the tool's ranks too
        else:
            wrapper = [str(SIMULATE_NODES)] if (env or {}).get("HPCGPU_SIMULATE_NODES") else []
            command = mpiexec_command(ranks, [*wrapper, sys.executable, *args])
            result = run_mpi(ranks, [*wrapper, sys.executable, *args], timeout=timeout, env=env, cwd=ROOT)
        log = result.output
        code = f"timeout after {timeout:.0f} s" if result.timed_out else result.returncode
        (directory / "command.txt").write_text(" ".join(f"{k}={v}" for k, v in (env or {}).items()) + " " +
                                               shlex.join(command) + "\n")
        (directory / "log.txt").write_text(log)
        print(f"  {directory.name}: {'ok' if code == 0 else 'FAILED (' + str(code) + ')'} in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        if code != 0:
            raise RuntimeError(f"{name} failed ({code}); {directory / 'log.txt'}:\n{log[-2000:]}")
        return directory, log

    def app(self, name: str, ranks: int, module: str, args: list[str], env=None) -> dict:
        """One app run with ``--summary``; its summary."""
        quiet = ["--quiet"] + (["--no-plot", "--snapshot-every", "0"] if module == "apps.stencil" else
                               ["--no-plot"] if module == "apps.md" else [])
        directory, _ = self.run(name, ["-m", module, *args, "--backend", self.backend, *quiet, "--output", "{dir}/out",
                                       "--summary", "{dir}/summary.json"], ranks, env)
        return json.loads((directory / "summary.json").read_text())

    def weak_scaling(self, name: str, app: str, args: list[str]) -> float:
        """Efficiency at 2 ranks of a ``hpcgpu.bench scaling --weak --ranks 1,2`` series."""
        directory, _ = self.run(name, ["-m", "hpcgpu.bench", "scaling", "--app", app, "--weak", "--ranks", "1,2",
                                       "--backend", self.backend, "--timeout", str(self.arguments.timeout),
                                       "--output", "{dir}/series", "--", *args],
                                timeout=2 * self.arguments.timeout + 60)   # two runs, each under --timeout
        rows = json.loads((directory / "series" / "scaling.json").read_text())["rows"]
        one, two = (next(r for r in rows if r["n_ranks"] == n) for n in (1, 2))
        if one["status"] != "ok" or two["status"] != "ok":
            raise RuntimeError(f"{name}: {one['status']} / {two['status']}: {one.get('error') or two.get('error')}")
        return (two["throughput"] / 2) / one["throughput"]

    def add_speed(self, section, target, measured, value, goal_value, goal, at_least=True):
        """A row with a speed goal, judged only on GPUs at the full sizes (elsewhere shown, not judged)."""
        if not self.judged:
            self.add(section, target, measured, None, goal + ": not judged here", None)
            return
        fraction = value / goal_value if at_least else goal_value / value
        self.add(section, target, measured, fraction, goal, fraction >= 1.0)

    def add(self, section, target, measured, fraction=None, goal="-", met=None):
        self.rows.append({"section": section, "target": target, "measured": measured, "fraction": fraction,
                          "goal": goal, "met": met})

    def section(self, name, function, size):
        print(f"{name}:", flush=True)
        try:
            function(self, size)
        except Exception as error:   # report (the failing run's log tail on stderr) and go on with the other sections
            print(f"{name} did not finish: {error}", file=sys.stderr, flush=True)
            self.add(name, f"{name} (did not finish)", str(error).splitlines()[0][:160], None, "runs", False)


def communication_per_step(summary: dict) -> float:
    """Seconds per step in the slowest rank's communication timer (0 when the app has none)."""
    timers = summary.get("timers", {})
    total = sum(timer["max"] for key, timer in timers.items() if key in ("communication", "allreduce"))
    return total / max(summary["steps"], 1)


# -------------------------------------------------------------------------------------------- sections
def section_jacobi(c: Campaign, size):
    n, steps = size
    args = ["--model", "jacobi", "--nx", str(n), "--ny", str(n), "--steps", str(steps)]
    runs = {"1 rank": c.app("jacobi-1", 1, "apps.stencil", args)}
    schedules = {"default": [], "--no-graph": ["--no-graph"], "--no-overlap": ["--no-overlap"]}
    if c.gpu:
        schedules["--peer-halo"] = ["--peer-halo"]
    for label, extra in schedules.items():
        runs[label] = summary = c.app("jacobi-2" + label.replace("--", "-"), 2, "apps.stencil", args + extra)
        c.add("jacobi", f"jacobi {n}^2 x {steps}, 2 ranks, {label}", f"{summary['wall_seconds']:.4f} s "
              f"({summary['throughput']:.3e} {summary['unit']})")
    best = min((label for label in runs if label != "1 rank"), key=lambda label: runs[label]["wall_seconds"])
    c.add_speed("jacobi", f"jacobi {n}^2 x {steps}, 2 ranks, fastest schedule", f"{best}: "
                f"{runs[best]['wall_seconds']:.4f} s", runs[best]["wall_seconds"], 0.30, "<= 0.30 s (3)", at_least=False)
    same = len({s["checksum"] for s in runs.values()}) == 1
    c.add("jacobi", "jacobi checksums, 1 rank == every 2-rank schedule", "equal" if same else
          "DIFFER: " + ", ".join(f"{k} {v['checksum'][7:15]}" for k, v in runs.items()), None, "equal", same)


def section_swe(c: Campaign, size):
    nx, ny, steps = size
    efficiency = c.weak_scaling("swe-weak", "stencil", ["--model", "swe", "--nx", str(nx), "--ny", str(ny),
                                                        "--steps", str(steps), "--snapshot-every", "0", "--no-plot"])
    c.add_speed("swe", f"shallow water weak 1 -> 2 ranks, {nx} x {ny} per rank", f"{100 * efficiency:.1f}%",
                efficiency, 0.97, ">= 97% (25, 28)")


def section_latlon(c: Campaign, size):
    nx, ny, steps = size
    base = ["--grid", "latlon", "--nx", str(nx), "--steps", str(steps)]
    one = c.app("latlon-1", 1, "apps.stencil", base + ["--ny", str(ny)])
    two = c.app("latlon-2", 2, "apps.stencil", base + ["--ny", str(2 * ny), "--dims", "2,1"])
    efficiency = (two["throughput"] / 2) / one["throughput"]
    c.add("latlon", f"lat-lon weak 1 -> 2 ranks, {nx} x {ny} per rank (latitude bands)",
          f"{100 * efficiency:.1f}% ({one['throughput']:.3e} -> {two['throughput']:.3e} {one['unit']})",
          None, "- (95% at deac075)", None)


def section_md(c: Campaign, size):
    for cells, steps in size:
        atoms = 4 * cells ** 3
        efficiency = c.weak_scaling(f"md-weak-{cells}", "md", ["--cells", str(cells), "--steps", str(steps), "--no-plot"])
        c.add_speed("md", f"MD weak 1 -> 2 ranks, {atoms:,} atoms per rank", f"{100 * efficiency:.1f}%",
                    efficiency, 0.95, ">= 95% (5, 28)")


def section_train(c: Campaign, size):
    precisions = "fp32,bf16,fp16" if c.gpu else "fp32"
    directory, _ = c.run("train-ddp", ["benchmarks/train_ddp.py", "--frameworks", "hpcgpu", "--precisions", precisions,
                                       "--rounds", str(c.arguments.rounds), "--backend", c.backend, *size,
                                       "--json", "{dir}/ddp.json"], 2)
    for result in json.loads((directory / "ddp.json").read_text())["results"]:
        if result.get("framework") != "hpcgpu" or "median_efficiency" not in result:
            continue
        efficiency = result["median_efficiency"]
        rounds = ", ".join(f"{100 * e:.1f}" for e in result.get("round_efficiencies", []))
        c.add_speed("train", f"training 1 -> 2 ranks, {result['precision']}", f"{100 * efficiency:.1f}% median of "
                    f"{len(result.get('round_efficiencies', []))} pairs ({rounds})", efficiency, 0.95, ">= 95% (6, 28)")


def _nccl_network_used(log: str) -> str:
    if "via NET/" in log or "NET/Socket : Using" in log or "NET/IB : Using" in log:
        return "yes"
    return "no NET/ line in NCCL's log" if "NCCL INFO" in log else "no NCCL log (CPU ranks)"


def section_network(c: Campaign, size):
    network_env = {"HPCGPU_SIMULATE_NODES": "2", "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO",
                   "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    transports = "nccl" if c.gpu else "mpi"
    halo = {}
    for label, env, extra in (("plain", None, []), ("net", network_env, ["--simulate-nodes", "2"])):
        directory, log = c.run(f"halo-{label}", ["-m", "hpcgpu.bench", "halo", "--backend", c.backend, "--transports",
                                                 transports, "--layouts", "rows", "--sizes", size["halo_sizes"],
                                                 "--seconds", "0.2", *extra, "--json", "{dir}/halo.json"], 2, env)
        halo[label] = [r for r in json.loads((directory / "halo.json").read_text())["results"]
                       if r["transport"] == transports]
        if label == "net":
            c.add("network", "NCCL's network transport between the pretend nodes", _nccl_network_used(log), None,
                  "yes (GPU)", (_nccl_network_used(log) == "yes") if c.gpu else None)
    for plain, net in zip(halo["plain"], halo["net"]):
        def describe(r):
            rate = f", {r['gigabytes_per_second']:.1f} GB/s" if r.get("gigabytes_per_second") else ""
            return f"{r['microseconds']:.1f} us{rate}"
        c.add("network", f"halo {plain['bytes']:,} B each way ({transports} {plain.get('layout', 'rows')})",
              f"plain {describe(plain)} / pretend nodes {describe(net)}")
    nx, ny, steps = size["net_swe"]
    jn, jsteps = size["net_jacobi"]
    cells, md_steps = size["net_md"]
    apps = {"jacobi": ("apps.stencil", ["--model", "jacobi", "--nx", str(jn), "--ny", str(jn), "--steps", str(jsteps)]),
            "swe": ("apps.stencil", ["--model", "swe", "--nx", str(nx), "--ny", str(ny), "--steps", str(steps)]),
            "md": ("apps.md", ["--cells", str(cells), "--steps", str(md_steps)]),
            "train": ("apps.train", ["--steps", str(size["net_train"])])}
    for name, (module, args) in apps.items():
        plain = c.app(f"{name}-plain", 2, module, args)
        net = c.app(f"{name}-net", 2, module, args, network_env)
        same = plain["checksum"] == net["checksum"]
        c.add("network", f"{name}: checksum, pretend nodes == plain", "equal" if same else "DIFFER", None, "equal", same)
        c.add("network", f"{name}: communication per step, plain / pretend nodes",
              f"{1e3 * communication_per_step(plain):.3f} / {1e3 * communication_per_step(net):.3f} ms; "
              f"step {1e3 * plain['wall_seconds'] / plain['steps']:.3f} / {1e3 * net['wall_seconds'] / net['steps']:.3f} ms")


def _relative_difference(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b))


def section_split(c: Campaign, size):
    args = ["--model", "residual-mlp", *size]
    reference = c.app("split-1", 1, "apps.train", args)
    tolerance = 1e-5   # fp32: docs/parallelism.md, "1 x 2 x 1 in fp32"
    grids = {"T = 2": ["--tensor-parallel", "2"], "P = 2, M = 4": ["--pipeline-parallel", "2", "--micro-batches", "4"]}
    for label, extra in grids.items():
        summary = c.app("split-" + label.split()[0].lower() + "2", 2, "apps.train", args + extra)
        difference = _relative_difference(summary["diagnostics"]["loss_curve"], reference["diagnostics"]["loss_curve"])
        c.add("split", f"{label}: loss curve against 1 rank ({len(reference['diagnostics']['loss_curve'])} steps)",
              f"max relative difference {difference:.1e}", None, f"<= {tolerance:g}", difference <= tolerance)
        step_ms = 1e3 * summary["wall_seconds"] / summary["steps"]
        one_ms = 1e3 * reference["wall_seconds"] / reference["steps"]
        c.add("split", f"{label}: step time", f"{step_ms:.2f} ms (1 rank {one_ms:.2f} ms)")
        volume = summary["diagnostics"].get("communication", {})
        kind = "tensor" if label.startswith("T") else "pipeline"
        if kind in volume:
            measured, computed = volume[kind]["measured"], volume[kind]["computed"]
            c.add("split", f"{label}: {kind} bytes per step and rank, measured / computed",
                  f"{measured:,.0f} / {computed:,.0f}", None, "equal", measured == computed)
        if kind == "pipeline":
            pipeline = summary["diagnostics"].get("pipeline", {})
            measured = pipeline.get("bubble_measured") or []
            c.add("split", f"{label}: pipeline bubble, formula / measured per stage",
                  f"{pipeline.get('bubble_formula', float('nan')):.3f} / " + ", ".join(f"{b:.3f}" for b in measured))


FUNCTIONS = {"jacobi": section_jacobi, "swe": section_swe, "latlon": section_latlon, "md": section_md,
             "train": section_train, "network": section_network, "split": section_split}


def size_of(section: str, table: dict):
    if section == "network":
        return table
    return table[section]


def print_table(rows: list[dict], header: str) -> None:
    print(f"\n{header}")
    print(f"{'target':62s} {'of goal':>8s} {'met':>5s}  measured (goal)")
    for row in rows:
        fraction = f"{100 * row['fraction']:.0f}%" if row["fraction"] is not None else "-"
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(f"{row['target'][:62]:62s} {fraction:>8s} {met:>5s}  {row['measured']} ({row['goal']})")


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    campaign = Campaign(arguments)
    table = sizes(arguments.quick)
    started = time.perf_counter()
    for section in arguments.only.split(","):
        campaign.section(section, FUNCTIONS[section], size_of(section, table))
    header = (f"pair targets (issue 28), {arguments.backend}, 2 ranks{', quick sizes' if arguments.quick else ''}; "
              f"{time.perf_counter() - started:.0f} s; runs under {campaign.output}")
    print_table(campaign.rows, header)
    if arguments.json:
        Path(arguments.json).write_text(json.dumps({"arguments": vars(arguments), "rows": campaign.rows}, indent=1))
    return 0 if all(row["met"] is not False for row in campaign.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Scaling study: run an app on 1, 2, 4 ... ranks and find the phase that stops it scaling.

Start from the single-GPU baseline, then run the same app on more ranks, each run under the MPI
launcher (``mpiexec``, or ``srun`` inside a Slurm allocation) with a timeout, and read its
``--summary`` JSON (docs/app-contract.md). Two kinds of series:

- ``--strong``: the same problem on every rank count. Ideal: time per step falls as 1/N.
- ``--weak``: the problem grows with the rank count so each rank keeps the same work. Ideal: time
  per step stays constant. The problem is replicated along the process grid the decomposition
  would choose (``hpcgpu.decomposition.choose_dims``), and that grid is passed as ``--dims``, so
  every rank owns exactly the baseline's block: stencil ``--nx/--ny/--nz`` and md ``--cells`` are
  multiplied per axis (atoms per rank constant, the cube-root rule made exact); train multiplies
  the global ``--batch-size``. How each app is sized and grown is its *scaling recipe*
  (``apps/<app>/scaling_recipe.py``, registered through :mod:`hpcgpu.bench.recipes`).

Parallel efficiency compares throughput per rank with the baseline's (N0 ranks, usually 1)::

    efficiency(N) = (throughput(N) / N) / (throughput(N0) / N0)

which is T(N0) N0 / (N T(N)) for a strong series and T(N0) / T(N) for a weak one. The study warns
when a rank count is larger than the machine's physical cores (oversubscribed CPU runs time-share
cores: their efficiency says nothing about scaling) and when an efficiency is above 100% (superlinear:
a smaller share per rank fits in cache, or the baseline was slowed by noise or warm-up). Each phase of the
app's timers (compute, communication, io, host overhead, ...) is turned into seconds per step and
compared with its ideal (baseline per-step time x N0/N for strong, unchanged for weak); the phase
with the most time per step above its ideal at the largest rank count is flagged as the bottleneck.

Writes ``scaling.json``, ``scaling.csv`` and ``scaling.png`` (efficiency vs ranks, stacked phase
times per rank count) to ``--output``, each run's output, summary and log to ``--output/ranksN/``,
and prints the table last. Example::

    python -m hpcgpu.bench scaling --app stencil --ranks 1,2,4,8 --weak -- --model jacobi --nx 8192 --ny 8192
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from hpcgpu.bench.recipes import ENTRY_POINT_GROUP, RunPlan, get_recipe
from hpcgpu.bench.scaling_report import format_seconds, format_table, write_csv, write_plot
from hpcgpu.errors import ConfigurationError

__all__ = ["RunPlan", "add_arguments", "analyse", "main", "make_row", "plan_series", "scaling_warnings"]

#: Phases listed first, in this order; others (neighbor, thermo, ...) follow alphabetically.
PHASE_ORDER = ("compute", "communication", "io", "host overhead")


def add_arguments(parser) -> None:
    # No choices= here: finding the recipes loads the apps' entry points, which only this subcommand needs.
    parser.add_argument("--app", required=True, metavar="APP",
                        help="which app to scale: stencil, md, train, or any other with a scaling recipe "
                             f"(entry-point group {ENTRY_POINT_GROUP}: hpcgpu.bench.recipes)")
    parser.add_argument("--ranks", default="1,2,4", help="comma list of rank counts; the smallest is the baseline [1,2,4]")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--strong", dest="mode", action="store_const", const="strong",
                      help="same problem on every rank count [default]")
    mode.add_argument("--weak", dest="mode", action="store_const", const="weak",
                      help="problem grows with the rank count (same work per rank)")
    parser.set_defaults(mode="strong")
    parser.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto",
                        help="auto: srun inside a Slurm allocation, else mpiexec [auto]")
    parser.add_argument("--backend", choices=("auto", "cupy", "numpy"), default=None,
                        help="passed to the app as --backend [the app's default: auto]")
    parser.add_argument("--output", default="scaling", metavar="DIR", help="results directory [scaling]")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="kill a run after this many seconds [600]")
    parser.add_argument("--dry-run", action="store_true", help="print the planned commands and exit")


# -- planning ----------------------------------------------------------------------------------------------


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise ConfigurationError(f"--ranks {text!r}: expected a comma list of positive rank counts like 1,2,4,8")
    return ranks


def plan_series(app: str, ranks: list[int], mode: str, extra_args: list[str]) -> list[RunPlan]:
    """The runs of a series: ``extra_args`` override the app recipe's default flags; sizes scaled for ``weak``.

    Raises
    ------
    ConfigurationError
        When the options cannot be scaled (bad ``--dims``, ``--data`` with ``--weak``, ...).
    """
    recipe = get_recipe(app)
    try:
        return recipe.plan_fn(ranks, mode, list(recipe.default_args) + list(extra_args))
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"cannot plan the {mode} series of {recipe.module} from {shlex.join(extra_args)!r}: "
                                 f"{exc}") from None


# -- running -------------------------------------------------------------------------------------------------


def choose_launcher(requested: str) -> str:
    if requested != "auto":
        return requested
    return "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "mpiexec"


def _run_srun(n_ranks: int, args: list[str], timeout: float):
    from hpcgpu.jobs.launch import run_command

    command = ["srun", "-n", str(n_ranks), *shlex.split(os.environ.get("HPCGPU_SRUN_FLAGS", "")), *args]
    return run_command(command, timeout, label="hpcgpu.bench scaling")   # kills the whole step, not only srun


def _failure_line(output: str) -> str:
    """The most telling line of a failed run's output: the last error, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith(("error:", "Error")) or "Error:" in line or "No module named" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def run_one(app: str, plan: RunPlan, launcher: str, run_dir: Path, timeout: float, backend: str | None) -> dict:
    """Run one plan; returns ``{"status", "summary" (or None), "error", "log", "command"}``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    summary_path = run_dir / "summary.json"
    summary_path.unlink(missing_ok=True)   # a stale summary must not pass for this run's
    args = [sys.executable, "-m", get_recipe(app).module, *plan.app_args, "--output", str(run_dir), "--summary", str(summary_path)]
    if backend:
        args += ["--backend", backend]
    record = {"command": shlex.join(args), "log": str(run_dir / "log.txt"), "summary": None, "error": None}
    if plan.error:
        record.update(status="not run", error=plan.error)
        return record
    root = Path(__file__).resolve().parents[2]   # so ``python -m apps.X`` works from a checkout
    if launcher == "srun":
        result = _run_srun(plan.n_ranks, args, timeout)
    else:
        from hpcgpu.jobs.launch import run_mpi

        result = run_mpi(plan.n_ranks, args, timeout=timeout, cwd=str(root) if (root / "apps").is_dir() else None)
    (run_dir / "log.txt").write_text(result.output)
    if result.timed_out:
        record.update(status="timed out", error=f"killed after {timeout:.0f} s (--timeout)")
    elif result.returncode != 0:
        record.update(status=f"failed (exit {result.returncode})", error=_failure_line(result.output))
    elif not summary_path.is_file():
        record.update(status="failed", error=f"exit 0 but no summary at {summary_path}")
    else:
        record.update(status="ok", summary=json.loads(summary_path.read_text()))
    return record


# -- analysis ------------------------------------------------------------------------------------------------


def ordered_phases(names) -> list[str]:
    names = set(names)
    return [p for p in PHASE_ORDER if p in names] + sorted(names - set(PHASE_ORDER))


def make_row(plan: RunPlan, record: dict) -> dict:
    """One table row from a run record: time per step, throughput and per-phase seconds per step."""
    row = {"n_ranks": plan.n_ranks, "status": record["status"], "problem": plan.description,
           "global_size": plan.global_size, "size_per_rank": plan.size_per_rank, "size_unit": plan.size_unit,
           "command": record["command"], "log": record["log"], "error": record["error"]}
    summary = record["summary"]
    if summary is None:
        return row
    steps = max(int(summary["steps"]), 1)
    wall = float(summary["wall_seconds"])
    row.update(steps=summary["steps"], wall_seconds=wall, seconds_per_step=wall / steps,
               throughput=float(summary["throughput"]), unit=summary["unit"], backend=summary.get("backend"),
               phases={name: {"seconds_per_step": t["mean"] / steps, "max_seconds_per_step": t["max"] / steps,
                              "share": t["mean"] / wall if wall > 0 else 0.0, "imbalance": t["imbalance"]}
                       for name, t in summary["timers"].items()})
    return row


def physical_cores() -> int:
    """Physical CPU cores this process may use (hyperthreads not counted; the affinity mask respected)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        cores, current = set(), {}
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("physical id", "core id"):
                    current[key] = value.strip()
                elif not key and current:
                    cores.add((current.get("physical id"), current.get("core id")))
                    current = {}
        if current:
            cores.add((current.get("physical id"), current.get("core id")))
        physical = len(cores) or usable
    except OSError:
        physical = usable
    return max(1, min(physical, usable))


#: Efficiency above this (1 + noise) is reported as superlinear.
SUPERLINEAR_EFFICIENCY = 1.05


def scaling_warnings(rows: list[dict], cores: int | None) -> list[str]:
    """Warnings that keep a reader from trusting misleading efficiencies (after :func:`analyse`).

    ``cores``: physical cores of the machine (:func:`physical_cores`); CPU runs with more ranks than
    that are oversubscribed; None skips that check (srun may spread the ranks over several nodes).
    """
    done = [r for r in rows if r["status"] == "ok"]
    messages = []
    crowded = [r["n_ranks"] for r in done
               if cores is not None and r.get("backend") in (None, "cpu") and r["n_ranks"] > cores]
    if crowded:
        messages.append(
            f"warning: oversubscribed: {', '.join(map(str, crowded))} rank(s) on {cores} physical core(s); ranks "
            "time-share cores there, so those rows measure contention, not scaling (run them on more cores or nodes)")
    fast = [r for r in done if r.get("efficiency") is not None and r["efficiency"] > SUPERLINEAR_EFFICIENCY]
    if fast:
        listed = ", ".join(f"{100 * r['efficiency']:.0f}% at {r['n_ranks']} ranks" for r in fast)
        messages.append(
            f"warning: efficiency above 100% ({listed}) is superlinear or noise, not better-than-perfect "
            "parallelism: a smaller share per rank can fit in cache, or the baseline run was slowed (JIT "
            "warm-up, other load on the machine, too few steps); rerun with more --steps before trusting it")
    return messages


def analyse(rows: list[dict], mode: str) -> dict | None:
    """Efficiency and per-phase growth against the baseline (in place); returns the bottleneck record.

    The baseline is the smallest rank count that ran. A phase's ideal time per step at N ranks is the
    baseline's x N0/N (strong) or unchanged (weak); its *excess* is the measured time above that. The
    bottleneck is the phase with the largest excess at the largest rank count that ran.
    """
    done = [r for r in rows if r["status"] == "ok"]
    if not done:
        return None
    base = done[0]
    for row in done:
        scale = base["n_ranks"] / row["n_ranks"] if mode == "strong" else 1.0
        row["speedup"] = row["throughput"] / base["throughput"] if base["throughput"] > 0 else None
        row["efficiency"] = (row["speedup"] * base["n_ranks"] / row["n_ranks"]) if row["speedup"] is not None else None
        for name in ordered_phases(set(row["phases"]) | set(base["phases"])):
            phase = row["phases"].setdefault(name, {"seconds_per_step": 0.0, "max_seconds_per_step": 0.0,
                                                    "share": 0.0, "imbalance": 0.0})
            before = base["phases"].get(name, {}).get("seconds_per_step", 0.0)
            phase["ideal_seconds_per_step"] = before * scale
            phase["excess_seconds_per_step"] = phase["seconds_per_step"] - before * scale
            phase["growth"] = phase["seconds_per_step"] / before if before > 0 else None
        worst = max(row["phases"], key=lambda n: row["phases"][n]["excess_seconds_per_step"])
        row["grows_most"] = worst if row is not base and row["phases"][worst]["excess_seconds_per_step"] > 0 else None
    last = done[-1]
    if last is base:
        return {"phase": None, "message": f"only the baseline ({base['n_ranks']} rank(s)) ran: nothing to compare"}
    name = last["grows_most"]
    if name is None:
        return {"phase": None, "from_ranks": base["n_ranks"], "to_ranks": last["n_ranks"],
                "message": f"no phase grows beyond ideal {mode} scaling from {base['n_ranks']} to {last['n_ranks']} ranks"}
    phase = last["phases"][name]
    before = base["phases"].get(name, {}).get("seconds_per_step", 0.0)
    lost = last["seconds_per_step"] - base["seconds_per_step"] * (base["n_ranks"] / last["n_ranks"] if mode == "strong" else 1.0)
    share_of_lost = phase["excess_seconds_per_step"] / lost if lost > 0 else None
    growth = (f"grows {phase['growth']:.1f}x" if phase["growth"] is not None else "appears") + \
        f" from {base['n_ranks']} to {last['n_ranks']} ranks"
    message = (f"{name} {growth} ({format_seconds(before)} -> {format_seconds(phase['seconds_per_step'])} per step, "
               f"ideal {format_seconds(phase['ideal_seconds_per_step'])}"
               + (f"; {100 * share_of_lost:.0f}% of the time lost to scaling" if share_of_lost is not None else "")
               + "): the bottleneck")
    return {"phase": name, "from_ranks": base["n_ranks"], "to_ranks": last["n_ranks"], "growth": phase["growth"],
            "baseline_seconds_per_step": before, "seconds_per_step": phase["seconds_per_step"],
            "ideal_seconds_per_step": phase["ideal_seconds_per_step"],
            "excess_seconds_per_step": phase["excess_seconds_per_step"], "share_of_lost_time": share_of_lost,
            "message": message}


# -- the subcommand ------------------------------------------------------------------------------------------


def main(args) -> int:
    """Run the series; 0 when every run succeeded, 1 when some failed (outputs are written anyway)."""
    try:
        ranks = parse_ranks(args.ranks)
        plans = plan_series(args.app, ranks, args.mode, list(getattr(args, "app_args", None) or []))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    launcher = choose_launcher(args.launcher)
    output = Path(args.output).resolve()
    title = f"{get_recipe(args.app).module}: {args.mode} scaling, {plans[0].description} on {ranks[0]} rank(s)"
    if args.dry_run:
        for plan in plans:
            print(f"{plan.n_ranks:>4} ranks: " + (f"cannot run: {plan.error}" if plan.error else
                  f"{launcher} -n {plan.n_ranks} python -m {get_recipe(args.app).module} {shlex.join(plan.app_args)}"))
        return 0
    output.mkdir(parents=True, exist_ok=True)
    print(f"scaling study of {title}; launcher {launcher}; results in {output}", flush=True)
    rows = []
    for plan in plans:
        started = time.perf_counter()
        record = run_one(args.app, plan, launcher, output / f"ranks{plan.n_ranks}", args.timeout, args.backend)
        print(f"  {plan.n_ranks:>4} ranks ({plan.description}): {record['status']} in "
              f"{time.perf_counter() - started:.1f} s" + (f" -- {record['error']}" if record["error"] else ""), flush=True)
        rows.append(make_row(plan, record))
    bottleneck = analyse(rows, args.mode)
    phases = ordered_phases({name for row in rows for name in row.get("phases", {})})
    result = {"app": args.app, "mode": args.mode, "launcher": launcher, "ranks": ranks,
              "baseline_ranks": next((r["n_ranks"] for r in rows if r["status"] == "ok"), None),
              "efficiency_definition": "(throughput(N) / N) / (throughput(N0) / N0)",
              "phases": phases, "rows": rows, "bottleneck": bottleneck}
    warnings = scaling_warnings(rows, None if launcher == "srun" else physical_cores())
    result["warnings"] = warnings
    (output / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
    write_csv(output / "scaling.csv", rows, phases)
    written = ["scaling.json", "scaling.csv"]
    try:
        write_plot(output / "scaling.png", rows, phases, title)
        written.append("scaling.png")
    except ImportError as exc:
        print(f"note: no plot ({exc}); pip install matplotlib", file=sys.stderr)
    print()
    print(title)
    print(format_table(rows, phases))
    if bottleneck is not None:
        print(bottleneck["message"])
    for message in warnings:
        print(message)
    print(f"wrote {', '.join(written)} in {output}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1

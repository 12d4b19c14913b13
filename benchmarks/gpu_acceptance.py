"""The GPU acceptance in one command: every GPU check and one-GPU speed target, one table, one JSON file.

Made for a short GPU window (one 10-minute call on a one-GPU machine). The correctness sections run
while the GPU test suite runs beside them; the timed sections run afterwards, alone on the GPU:

* ``suite``: ``python -m pytest tests -m gpu`` (``-n 4`` when pytest-xdist is installed): passed, failed,
  skipped; met when nothing failed. Runs in the background while ``examples`` and ``kill`` run.
* ``examples``: every ``examples/*.py`` on the GPU and on the CPU (``--backend cupy`` / ``numpy``, the
  same options): the summaries' checksums and every variable of every netCDF file (read with
  netCDF4-python) bit for bit; Gray-Scott also at
  512 x 512, whose end-of-run diagnostics once corrupted the heap.
* ``kill``: kill -9 of a one-rank GPU channel run with asynchronous checkpoints at seeded moments
  (``tests/faults/scenarios.py``): every earlier netCDF record readable and equal to the uninterrupted
  run's, the restart ending with the uninterrupted file. (Two ranks cannot share one GPU over NCCL, so
  one rank; the CPU campaign covers the multi-rank kills.)
* ``kernels``: ``benchmarks/kernel_layer.py``: the kernel layer's 5-point 8192², 7-point 512³ and
  Gray-Scott 8192², fp64 and fp32, against the copy bandwidth measured in the same run (goal >= 80%).
* ``stencil``: ``benchmarks/stencil_targets.py`` (stage kernels, 512 x 256 steps/s, the 3600 x 1800 jet,
  heat3d 512³, lat-lon against the channel; the JAX peer when JAX is installed): its rows as they are.
* ``md``: ``apps.md`` in.lj at 32,000 atoms (goal >= 3e8 atom-steps/s) and 2,048,000 (goal >= 1e9).
* ``train``: ``benchmarks/train_ddp.py`` against PyTorch on one GPU, fp32, bf16 and fp16 (goal: >= 1.0x
  PyTorch's samples/s); not run without PyTorch.
* ``health``: ``python -m hpcgpu check`` with the real NVML: the verdict (goal: HEALTHY).

Every run has its own timeout; a section that fails or times out becomes a failed row with the tail
of its log, and the other sections go on. Each row names the card it was measured on.
``--backend cpu --quick`` is a smoke test of the program itself (CPU ranks, small sizes, no speed goals
judged; examples compare two CPU runs, so it checks run-to-run determinism instead of GPU == CPU).

Usage::

    python3 benchmarks/gpu_acceptance.py --output acceptance --json acceptance.json   # on the GPU machine
    python3 benchmarks/gpu_acceptance.py --only kernels,md --output acceptance-2
    python3 benchmarks/gpu_acceptance.py --backend cpu --quick --output /tmp/smoke     # the CI smoke test

Exit status: 0 when every judged row is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import importlib.util
import json
import random
import re
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcgpu.jobs.launch import run_command  # noqa: E402 - after the path
from hpcgpu.provenance import git_commit  # noqa: E402

SECTIONS = ("suite", "examples", "kill", "kernels", "health", "md", "train", "stencil")   # the order they run in
#: Sections that check results, not speed: they may share the GPU with the test suite.
CORRECTNESS = ("examples", "kill")
KERNEL_GOAL = 0.80        # of the measured copy bandwidth
MD_GOALS = {20: 3e8, 80: 1e9}   # in.lj cells per side -> atom-steps/s


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of sections [{','.join(SECTIONS)}]")
    parser.add_argument("--backend", choices=("gpu", "cpu"), default="gpu", help="gpu [default]; cpu: a smoke test")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the program")
    parser.add_argument("--kills", type=int, default=3, help="kill section: kills of the GPU run [3]")
    parser.add_argument("--seed", type=int, default=2026, help="kill section: seed of the kill moments [2026]")
    parser.add_argument("--workers", type=int, default=4, help="suite: pytest-xdist workers when installed [4]")
    parser.add_argument("--time-limit", type=float, default=570.0, metavar="SECONDS",
                        help="the whole program's limit: every run's timeout is cut to what is left, and a section "
                             "that cannot start in time becomes a 'not run' row, so the table is always printed [570]")
    parser.add_argument("--output", required=True, help="a new directory for every run's command and log")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    arguments = parser.parse_args(argv)
    unknown = set(arguments.only.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    return arguments


def device_name(gpu: bool) -> str:
    """The card the rows are measured on (``cpu`` for the smoke test)."""
    if not gpu:
        return "cpu"
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


class Acceptance:
    """Launches the runs (each under its timeout, command and log kept under ``--output``) and collects rows."""

    def __init__(self, arguments):
        self.arguments = arguments
        self.output = Path(arguments.output)
        if self.output.exists():
            print(f"gpu_acceptance.py: --output {self.output} exists: give a new directory", file=sys.stderr)
            raise SystemExit(2)
        self.output.mkdir(parents=True)
        self.gpu = arguments.backend == "gpu"
        self.backend = "cupy" if self.gpu else "numpy"
        self.judged = self.gpu and not arguments.quick
        self.device = device_name(self.gpu)
        self.rows: list[dict] = []
        self._count = 0
        self.deadline = time.monotonic() + arguments.time_limit

    def left(self, wanted: float) -> float:
        """A run's timeout: ``wanted`` seconds, or what is left before the time limit (less a margin)."""
        return max(1.0, min(wanted, self.deadline - time.monotonic() - 10.0))

    def run(self, name: str, args: list[str], timeout: float, env: dict | None = None) -> tuple[Path, str]:
        """``python ARGS`` (``{dir}`` is the run's directory) under ``timeout``; (directory, log).
        Raises RuntimeError with the log's tail when it fails."""
        self._count += 1
        directory = self.output / f"{self._count:02d}-{name}"
        directory.mkdir()
        command = [sys.executable, *(part.replace("{dir}", str(directory)) for part in args)]
        started = time.perf_counter()
        timeout = self.left(timeout)
        result = run_command(command, timeout, env=env, cwd=ROOT, label="gpu_acceptance")
        (directory / "command.txt").write_text(shlex.join(command) + "\n")
        (directory / "log.txt").write_text(result.output)
        code = f"timeout after {timeout:.0f} s" if result.timed_out else result.returncode
        print(f"  {directory.name}: {'ok' if code == 0 else f'FAILED ({code})'} in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        if code != 0:
            raise RuntimeError(f"{name} failed ({code}): {result.output[-1500:]}")
        return directory, result.output

    def add(self, section, target, measured, fraction=None, goal="-", met=None):
        self.rows.append({"section": section, "target": target, "measured": measured, "fraction": fraction,
                          "goal": goal, "met": met, "device": self.device})

    def add_speed(self, section, target, measured, value, goal_value, goal):
        """A speed row: judged only on a GPU at the full sizes."""
        if not self.judged:
            self.add(section, target, measured, None, goal + ": not judged here", None)
        else:
            self.add(section, target, measured, value / goal_value, goal, value >= goal_value)

    def section(self, name: str) -> None:
        print(f"{name}:", flush=True)
        if self.deadline - time.monotonic() < 30:
            self.add(name, f"{name} (not run)", f"--time-limit {self.arguments.time_limit:.0f} s reached", None, "runs",
                     False)
            return
        started = time.perf_counter()
        try:
            FUNCTIONS[name](self)
        except Exception as error:   # noqa: BLE001 - a failed row, then the other sections
            print(f"{name} did not finish: {error}", file=sys.stderr, flush=True)
            self.add(name, f"{name} (did not finish)", str(error).splitlines()[0][:200] if str(error) else
                     type(error).__name__, None, "runs", False)
        print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)


# ------------------------------------------------------------------------------------------ sections
def section_suite(a: Acceptance) -> None:
    parallel = (["-n", str(a.arguments.workers)] if importlib.util.find_spec("xdist") else [])
    selection = ["tests", "-m", "gpu"] if not a.arguments.quick else ["tests/stencils/test_cuda_source.py", "-k", "launch"]
    directory = a.output / "suite"
    directory.mkdir()
    command = [sys.executable, "-m", "pytest", *selection, *parallel, "-q", "-p", "no:cacheprovider",
               "--junitxml", str(directory / "junit.xml")]
    result = run_command(command, a.left(420 if not a.arguments.quick else 120), cwd=ROOT, label="gpu_acceptance")
    (directory / "log.txt").write_text(result.output)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", result.output)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.output, flags=re.MULTILINE)
    measured = (f"{counts.get('passed', 0)} passed, {failed} failed, {counts.get('skipped', 0)} skipped"
                + (" (timed out)" if result.timed_out else "") + (f": {', '.join(failures[:6])}" if failures else ""))
    a.add("suite", "GPU test suite (pytest -m gpu)" if not a.arguments.quick else "test suite smoke", measured,
          None, "no failure", failed == 0 and not result.timed_out and counts.get("passed", 0) > 0)


def _checksum_and_variables(directory: Path) -> tuple[str, dict]:
    """The run's summary checksum and ``{file: {variable: array}}`` of its netCDF files (netCDF4-python)."""
    from hpcgpu.testing.faults import netcdf_records

    summary = json.loads((directory / "summary.json").read_text())
    return summary["checksum"], {p.name: netcdf_records(p) for p in sorted((directory / "out").glob("*.nc"))}


def _same_variables(first: dict, second: dict) -> bool:
    return bool(first) and first.keys() == second.keys() and all(
        a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)
        for a, b in ((first[f], second[f]) for f in first))


def section_examples(a: Acceptance) -> None:
    steps = "40" if a.arguments.quick else "200"
    cases = [(path.stem, [str(path.relative_to(ROOT)), "--steps", steps]) for path in sorted((ROOT / "examples").glob("*.py"))]
    cases.append(("gray_scott 512", ["examples/gray_scott.py", "--n", "96" if a.arguments.quick else "512",
                                     "--steps", steps]))
    other = "numpy"   # GPU against CPU; on the CPU smoke test, two CPU runs
    for label, args in cases:
        results = {}
        for backend in (a.backend, other):
            directory, _ = a.run(f"{label.replace(' ', '-')}-{backend}",
                                 [*args, "--backend", backend, "--quiet", "--output", "{dir}/out",
                                  "--summary", "{dir}/summary.json"], timeout=240)
            results[backend if backend not in results else backend + "-again"] = _checksum_and_variables(directory)
        (first, first_files), (second, second_files) = results.values()
        same_files = _same_variables(first_files, second_files)
        a.add("examples", f"{label}: {a.backend} == {other}", f"checksum {'equal' if first == second else 'DIFFERS'}, "
              f"netCDF variables {'bit-identical' if same_files else 'DIFFER' if first_files else 'missing'} "
              f"({', '.join(first_files) or 'no .nc'})", None, "equal", first == second and same_files)


def section_kill(a: Acceptance) -> None:
    from tests.faults.scenarios import Scenario, kill_and_restart, reference_contents

    size = ["--nx", "96", "--ny", "48", "--steps", "300"] if a.arguments.quick else \
        ["--nx", "1024", "--ny", "512", "--steps", "3000"]
    chain = ["--restart", "latest", "--quiet", "--output", "{out}", "--checkpoint-dir", "{out}/checkpoints"]
    scenario = Scenario("gpu-channel-async", ["-m", "apps.stencil", "--backend", a.backend, *size, "--snapshot-every",
                                              "25", "--checkpoint-every", "250", "--async-checkpoint", "--no-plot",
                                              *chain], "swe.nc", "netcdf", ["time", "h", "u", "v", "zeta"], n_ranks=1)
    work = a.output / "kill"
    started = time.perf_counter()
    reference = reference_contents(scenario, work / "reference")
    seconds = time.perf_counter() - started
    n_records = scenario.count(reference)
    rng = random.Random(a.arguments.seed)
    survived = restarted = 0
    for trial in range(a.arguments.kills):
        after, delay = (rng.randint(1, n_records - 1), rng.uniform(0, 0.05)) if trial % 2 else (0, rng.uniform(0, seconds))
        out = work / f"kill-{trial}"
        result = kill_and_restart(scenario, out, reference, delay, "all", after, log=out.with_suffix(".log"))
        survived += result.survived
        restarted += result.restart_equal
        print(f"  kill {trial + 1}: records {result.records_after_kill}, survived {result.survived}, "
              f"restart equal {result.restart_equal} {result.detail[:100]}", flush=True)
    tried = a.arguments.kills
    a.add("kill", f"kill -9 of a 1-rank {a.backend} run with --async-checkpoint",
          f"{survived}/{tried} files survived, {restarted}/{tried} restarts equal ({n_records} records)", None,
          "all", survived == restarted == tried)


def section_kernels(a: Acceptance) -> None:
    sizes = ["--n2d", "128", "--n3d", "24", "--gpu-n2d", "512", "--gpu-n3d", "64", "--repeats", "2"] \
        if a.arguments.quick else []
    directory, _ = a.run("kernel-layer", ["benchmarks/kernel_layer.py", "--backend", a.backend, *sizes,
                                          "--json", "{dir}/kernel_layer.json"], timeout=240)
    for row in json.loads((directory / "kernel_layer.json").read_text())["rows"]:
        shape = "x".join(map(str, row["shape"]))
        if row["device"] == "cpu":
            a.add("kernels", f"layer {row['stencil']} {shape} cpu {row['threads']} thread(s)",
                  f"{row['layer_over_hand']:.1%} of hand-written Numba, bits {'same' if row['bitwise_equal'] else 'DIFFER'}",
                  None, "bits equal", row["bitwise_equal"])
        elif row["status"] in ("measured", "IMPLAUSIBLE"):
            a.add_speed("kernels", f"layer {row['stencil']} {shape} {row['dtype']}",
                        f"{row['effective_tbps']:.2f} TB/s = {row['of_copy_bandwidth']:.0%} of the copy measured "
                        f"({row['copy_tbps']:.2f} TB/s){' IMPLAUSIBLE' if row['status'] != 'measured' else ''}",
                        row["of_copy_bandwidth"] if row["status"] == "measured" else 0.0, KERNEL_GOAL,
                        f">= {KERNEL_GOAL:.0%} of copy")


def section_stencil(a: Acceptance) -> None:
    only = "small,heat3d,latlon" if a.arguments.quick else "kernels,small,jet,heat3d,latlon"
    if not a.arguments.quick and importlib.util.find_spec("jax"):
        only += ",peer"
    directory, _ = a.run("stencil-targets", ["benchmarks/stencil_targets.py", "--only", only, "--repeats", "2",
                                             "--backend", a.arguments.backend, *(["--quick"] if a.arguments.quick else []),
                                             "--json", "{dir}/stencil_targets.json"], timeout=400)
    for row in json.loads((directory / "stencil_targets.json").read_text())["rows"]:
        judged = a.judged and row["met"] is not None
        a.add("stencil", row["target"], row["measured"], row["fraction"] if judged else None,
              row["goal"] if judged else f"{row['goal']}: not judged here", row["met"] if judged else None)


def section_md(a: Acceptance) -> None:
    cases = [(4, 50)] if a.arguments.quick else [(20, 1000), (80, 200)]
    for cells, steps in cases:
        directory, _ = a.run(f"md-{cells}", ["-m", "apps.md", "--cells", str(cells), "--steps", str(steps),
                                             "--backend", a.backend, "--quiet", "--no-plot", "--output", "{dir}/out",
                                             "--summary", "{dir}/summary.json"], timeout=180)
        summary = json.loads((directory / "summary.json").read_text())
        atoms = 4 * cells ** 3
        goal = MD_GOALS.get(cells, 0.0)
        a.add_speed("md", f"in.lj {atoms:,} atoms, {steps} steps", f"{summary['throughput']:.3g} {summary['unit']}",
                    summary["throughput"], goal, f">= {goal:.0e} atom-steps/s" if goal else "-")


def section_train(a: Acceptance) -> None:
    if a.gpu and not importlib.util.find_spec("torch"):
        a.add("train", "training against PyTorch", "not run: PyTorch is not installed", None, "-", None)
        return
    sizes = ["--width", "64", "--depth", "1", "--inputs", "32", "--classes", "8", "--batch-per-gpu", "32",
             "--steps", "2", "--warmup", "1", "--backend", "numpy", "--frameworks", "hpcgpu"] if a.arguments.quick else []
    directory, _ = a.run("train-ddp", ["benchmarks/train_ddp.py", "--precisions", "fp32,bf16,fp16", *sizes,
                                       "--json", "{dir}/train.json"], timeout=300)
    results = json.loads((directory / "train.json").read_text())["results"]
    ours = {r["precision"]: r for r in results if r["framework"] == "hpcgpu" and not r.get("error")}
    torch = {r["precision"]: r for r in results if r["framework"] == "torch" and not r.get("error")}
    for precision, record in ours.items():
        if precision in torch:
            ratio = record["samples_per_second"] / torch[precision]["samples_per_second"]
            a.add_speed("train", f"train_ddp {precision} against PyTorch, 1 GPU", f"{ratio:.2f}x "
                        f"({record['samples_per_second']:,.0f} against {torch[precision]['samples_per_second']:,.0f} "
                        "samples/s)", ratio, 1.0, ">= 1.0x PyTorch")
        else:
            a.add("train", f"train_ddp {precision}", f"{record['samples_per_second']:,.0f} samples/s (no PyTorch row)")
    for r in results:
        if r.get("error"):
            a.add("train", f"train_ddp {r['framework']} {r['precision']}", r["error"][:160], None, "runs", False)


def section_health(a: Acceptance) -> None:
    directory = a.output / "health"
    directory.mkdir()
    result = run_command([sys.executable, "-m", "hpcgpu", "check", "--backend", a.backend, "--json",
                          str(directory / "check.json")], a.left(120), cwd=ROOT, label="gpu_acceptance")
    (directory / "log.txt").write_text(result.output)
    report = json.loads((directory / "check.json").read_text())
    verdict = {"ok": "HEALTHY", "warn": "WARNINGS", "fail": "FAILED"}[report["verdict"]]
    problems = [f"{f.get('check', '?')}: {f.get('status')}" for f in report["findings"] if f.get("status") != "ok"]
    a.add("health", "hpcgpu check", f"{verdict}" + (f" ({'; '.join(problems[:4])})" if problems else ""), None,
          "HEALTHY", report["verdict"] == "ok" if a.gpu else None)


FUNCTIONS = {"suite": section_suite, "examples": section_examples, "kill": section_kill, "kernels": section_kernels,
             "stencil": section_stencil, "md": section_md, "train": section_train, "health": section_health}


def print_table(rows: list[dict], header: str) -> None:
    print(f"\n{header}")
    print(f"{'section':9s} {'target':54s} {'of goal':>8s} {'met':>4s}  measured (goal)")
    for row in rows:
        fraction = f"{100 * row['fraction']:.0f}%" if row["fraction"] is not None else "-"
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(f"{row['section']:9s} {row['target'][:54]:54s} {fraction:>8s} {met:>4s}  {row['measured']} ({row['goal']})")


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    acceptance = Acceptance(arguments)
    chosen = arguments.only.split(",")
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        # The suite checks results only, as do the correctness sections: they share the GPU. The timed
        # sections wait for the suite, so that nothing else runs on the GPU while they measure.
        suite = pool.submit(acceptance.section, "suite") if "suite" in chosen else None
        for name in [s for s in SECTIONS if s in chosen and s in CORRECTNESS]:
            acceptance.section(name)
        if suite is not None:
            suite.result()
    for name in [s for s in SECTIONS if s in chosen and s not in CORRECTNESS and s != "suite"]:
        acceptance.section(name)
    commit = git_commit() or "unknown"
    header = (f"GPU acceptance on {acceptance.device}, {arguments.backend}{', quick sizes' if arguments.quick else ''}, "
              f"tree {commit[:10]}, {datetime.date.today().isoformat()}; {time.perf_counter() - started:.0f} s; "
              f"runs under {acceptance.output}")
    print_table(acceptance.rows, header)
    if arguments.json:
        Path(arguments.json).write_text(json.dumps({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                                                    "device": acceptance.device, "git_commit": commit,
                                                    "arguments": vars(arguments), "rows": acceptance.rows}, indent=1))
    return 0 if all(row["met"] is not False for row in acceptance.rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

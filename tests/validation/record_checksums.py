"""Record the checksums of each app's reference runs, or compare them with an earlier recording.

A refactoring must not change results. This program runs a fixed list of cases (each app's default
run, shortened where the default takes minutes, on 1 and 2 ranks, plus the other models of
``apps.stencil``) and writes every run's checksum to a JSON file; ``--compare`` runs them again and
lists each case that differs. The GPU validation matrix records its runs in the same format when
``HPCGPU_CHECKSUM_RECORD`` names a file (tests/validation/test_gpu_matrix.py).

Usage::

    python tests/validation/record_checksums.py --record before.json            # CPU cases
    python tests/validation/record_checksums.py --compare before.json           # exit 1 if any differs
    python tests/validation/record_checksums.py --diff before.json after.json   # two recordings (e.g. GPU)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hpcgpu.jobs.launch import run_mpi  # noqa: E402

#: A small residual MLP: the model that tensor and pipeline parallelism split.
RESIDUAL = ["--model", "residual-mlp", "--depth", "4", "--width", "128", "--steps", "30"]

CPU_CASES = [
    # (app, arguments, ranks); every case runs with --backend numpy
    ("stencil", ["--steps", "200"], 1),
    ("stencil", ["--steps", "200"], 2),
    ("stencil", ["--steps", "200", "--no-overlap"], 2),
    ("stencil", ["--grid", "latlon", "--steps", "60"], 1),
    ("stencil", ["--grid", "latlon", "--steps", "60"], 2),
    ("stencil", ["--model", "jacobi", "--nx", "1001", "--ny", "777", "--steps", "200"], 1),
    ("stencil", ["--model", "jacobi", "--nx", "1001", "--ny", "777", "--steps", "200"], 2),
    ("stencil", ["--model", "heat3d", "--nx", "67", "--ny", "45", "--nz", "33", "--steps", "50"], 1),
    ("stencil", ["--model", "heat3d", "--nx", "67", "--ny", "45", "--nz", "33", "--steps", "50"], 2),
    ("md", [], 1),
    ("md", [], 2),
    ("md", ["--cells", "7,9,8", "--thermostat", "langevin", "--steps", "60"], 2),
    ("train", ["--steps", "60"], 1),
    ("train", ["--steps", "60"], 2),
    ("train", ["--steps", "60", "--zero", "1"], 2),
    ("train", ["--steps", "60", "--precision", "fp64"], 2),
    # three and four ranks: uneven and two-dimensional decompositions, every parallel training layout
    ("stencil", ["--steps", "200"], 3),
    ("stencil", ["--steps", "200"], 4),
    ("stencil", ["--grid", "latlon", "--steps", "60"], 3),
    ("stencil", ["--model", "jacobi", "--nx", "1001", "--ny", "777", "--steps", "200"], 3),
    ("stencil", ["--model", "jacobi", "--nx", "1001", "--ny", "777", "--steps", "200"], 4),
    ("stencil", ["--model", "heat3d", "--nx", "67", "--ny", "45", "--nz", "33", "--steps", "50"], 4),
    ("md", ["--steps", "60"], 3),
    ("md", ["--steps", "60"], 4),
    ("train", ["--steps", "60"], 3),
    ("train", ["--steps", "60", "--zero", "1"], 4),
    ("train", RESIDUAL + ["--tensor-parallel", "2"], 2),
    ("train", RESIDUAL + ["--tensor-parallel", "2"], 4),
    ("train", RESIDUAL + ["--pipeline-parallel", "2", "--micro-batches", "4"], 2),
    ("train", RESIDUAL + ["--pipeline-parallel", "2", "--micro-batches", "4", "--pipeline-schedule", "gpipe"], 2),
    ("train", RESIDUAL + ["--tensor-parallel", "2", "--pipeline-parallel", "2"], 4),
    ("train", RESIDUAL + ["--pipeline-parallel", "2", "--zero", "1"], 4),
]


def case_key(app: str, args: list[str], ranks: int) -> str:
    return f"{ranks} rank(s): python -m apps.{app} {' '.join(args)}".rstrip()


def run_case(app: str, args: list[str], ranks: int, workdir: Path) -> str:
    name = f"run{len(list(workdir.iterdir())):03d}"
    summary = workdir / f"{name}.json"
    extra = ["--no-plot"] if app != "md" else []
    command = [sys.executable, "-m", f"apps.{app}", *args, "--backend", "numpy", *extra, "--quiet",
               "--output", str(workdir / name), "--summary", str(summary)]
    result = run_mpi(ranks, command, timeout=900, cwd=str(ROOT))
    if result.returncode != 0:
        raise SystemExit(f"{case_key(app, args, ranks)} failed (exit {result.returncode}):\n{result.output[-3000:]}")
    return json.loads(summary.read_text())["checksum"]


def run_all(only: str | None = None) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for app, args, ranks in CPU_CASES:
            key = case_key(app, args, ranks)
            if only and only not in key:
                continue
            results[key] = run_case(app, args, ranks, Path(tmp))
            print(f"{results[key][:16]}  {key}", flush=True)
    return results


def diff(before: dict, after: dict, only: bool = False) -> int:
    if only:  # a partial run: compare the cases that ran
        before = {key: before[key] for key in before if key in after}
    changed = [key for key in before if key in after and before[key] != after[key]]
    missing = [key for key in before if key not in after]
    for key in changed:
        print(f"CHANGED  {key}: {before[key][:16]} -> {after[key][:16]}")
    for key in missing:
        print(f"MISSING  {key}")
    same = len(before) - len(changed) - len(missing)
    print(f"{same} of {len(before)} checksums unchanged, {len(changed)} changed, {len(missing)} not run")
    return 1 if changed or missing else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="FILE", help="run the CPU cases and write their checksums to FILE")
    group.add_argument("--compare", metavar="FILE", help="run the CPU cases and compare with FILE")
    group.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two recordings")
    parser.add_argument("--only", metavar="TEXT", help="run only the cases whose command contains TEXT, e.g. 'apps.md'")
    options = parser.parse_args(argv)
    if options.diff:
        return diff(*(json.loads(Path(p).read_text()) for p in options.diff))
    results = run_all(options.only)
    if options.record:
        Path(options.record).write_text(json.dumps(results, indent=1) + "\n")
        return 0
    return diff(json.loads(Path(options.compare).read_text()), results, only=bool(options.only))


if __name__ == "__main__":
    sys.exit(main())

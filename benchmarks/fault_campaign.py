"""Kill campaign: kill -9 running jobs at seeded random moments and count the files that survived.

For each scenario of ``tests/faults/scenarios.py`` (apps.stencil channel and lat-lon snapshots,
apps.md's H5MD trajectory, a user model's NetCDFOutput from ``examples/gray_scott.py``) the
uninterrupted run is the reference; then, ``--kills`` times, the same command is started, every rank
(or one rank, chosen at random) is killed with SIGKILL at a random moment of the run, the file is
read with the users' library (netCDF4, h5py) and compared with the reference's first records, and the
same command (``--restart latest``) is run again to the end and compared with the whole reference.

Half the kills fall at a uniformly random time after the ranks started (start-up, stepping,
checkpoints, writes alike); the other half just after the file has counted a random record (while
records are being written; netCDF files), so the writes themselves are hit often.

    python benchmarks/fault_campaign.py --kills 50 --json campaign.json
    python benchmarks/fault_campaign.py --only user-model --kills 5

Prints one line per kill and a table: survived / tried (every earlier record readable and equal to
the uninterrupted run's) and restarted equal / tried, per scenario.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.faults.scenarios import SCENARIOS, kill_and_restart, reference_contents  # noqa: E402


def campaign(name: str, kills: int, seed: int, work: Path) -> dict:
    scenario = SCENARIOS[name]
    started = time.perf_counter()
    reference = reference_contents(scenario, work / "reference")
    run_seconds = time.perf_counter() - started
    n_records = scenario.count(reference)
    rng = random.Random(seed)
    results = []
    for trial in range(kills):
        target = rng.choice(["all", "all", *range(scenario.n_ranks)])
        if scenario.kind == "netcdf" and trial % 2:
            after, delay = rng.randint(1, n_records - 1), rng.uniform(0.0, 0.05)
        else:
            after, delay = 0, rng.uniform(0.0, run_seconds)
        out = work / f"kill-{trial:03d}"
        result = kill_and_restart(scenario, out, reference, delay, target, after, log=out.with_suffix(".log"))
        results.append(result.as_dict())
        print(f"{name:16s} kill {trial + 1:3d}/{kills}: ranks {target!s:3s} "
              + (f"after record {after:3d} + {delay:.3f} s" if after else f"at {delay:6.2f} s          ")
              + f" records {result.records_after_kill!s:>4s}  survived {result.survived!s:5s} restart-equal "
              f"{result.restart_equal!s:5s} {result.detail[:120]}", flush=True)
    return {"scenario": name, "file": scenario.file, "kind": scenario.kind, "n_ranks": scenario.n_ranks,
            "reference_records": n_records, "reference_seconds": run_seconds, "kills": results,
            "survived": sum(r["survived"] for r in results), "restart_equal": sum(r["restart_equal"] for r in results),
            "tried": len(results)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=50, help="kills per scenario [50]")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="scenario (repeatable) [all]")
    parser.add_argument("--seed", type=int, default=2026, help="seed of the kill moments and targets [2026]")
    parser.add_argument("--work", type=Path, default=None, help="directory for the runs [a temporary one]")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="hpcgpu-fault-campaign-"))
    summaries = []
    for index, name in enumerate(args.only or list(SCENARIOS)):
        summaries.append(campaign(name, args.kills, args.seed + index, work / name))
    print()
    print(f"{'scenario':16s} {'file':16s} {'survived':>10s} {'restart equal':>14s}")
    for s in summaries:
        print(f"{s['scenario']:16s} {s['file']:16s} {s['survived']:>4d} / {s['tried']:<3d} "
              f"{s['restart_equal']:>6d} / {s['tried']:<3d}")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                                         "processor": platform.processor(), "seed": args.seed,
                                         "scenarios": summaries}, indent=1))
    return 0 if all(s["survived"] == s["tried"] == s["restart_equal"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())

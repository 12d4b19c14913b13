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

Two jobs on one directory (``tests/faults/two_jobs.py``): ``--two-jobs N`` starts the same command twice
on one output directory, N times per scenario: half the second jobs start at a random moment of the
first job's start-up (0-2 s after it), half just after the first job's file counted a random record
(netCDF; apps.md: a random moment of the first half of the run). ``--requeues N`` starts a requeued job
with ``--wait-for-lock`` while the first still runs (every other time the first is stopped by SIGTERM,
exit 75, else it runs to its end); ``--stale-kills N`` kills the holder with -9 (all ranks or one) and
starts a new job at once, which must take the directory over. Each trial passes when exactly one job
wrote at a time (exit codes, the refusal line), the file equals the uninterrupted run's with no record
of zeros, and the newest checkpoint is the final step, all of one run.

    python benchmarks/fault_campaign.py --kills 0 --two-jobs 20 --requeues 4 --stale-kills 4 --json two.json
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
from tests.faults.two_jobs import killed_holder_then_new_job, requeue_with_wait, two_jobs  # noqa: E402


def campaign(name: str, kills: int, seed: int, work: Path, two: int = 0, requeues: int = 0,
             stale_kills: int = 0) -> dict:
    scenario = SCENARIOS[name]
    started = time.perf_counter()
    reference = reference_contents(scenario, work / "reference")
    run_seconds = time.perf_counter() - started
    n_records = scenario.count(reference)
    rng = random.Random(seed)
    concurrent = two_jobs_campaign(name, scenario, reference, run_seconds, n_records, rng, work, two, requeues,
                                   stale_kills)
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
            "tried": len(results), "two_jobs": concurrent}


def two_jobs_campaign(name, scenario, reference, run_seconds, n_records, rng, work, two, requeues, stale_kills):
    """The concurrent trials of one scenario; a list of TwoJobsResult dicts (printed one line each)."""
    netcdf = scenario.kind == "netcdf"
    trials = []
    for trial in range(two):
        if trial % 2 == 0:
            trials.append(("together", rng.uniform(0.0, 2.0), 0, None))
        elif netcdf:
            trials.append(("running", rng.uniform(0.0, 0.05), rng.randint(1, n_records // 2), None))
        else:
            trials.append(("running", rng.uniform(2.0, max(2.5, run_seconds / 2)), 0, None))
    for trial in range(requeues):
        trials.append(("requeue-wait", 0.0, rng.randint(1, n_records // 2) if netcdf else 0, trial % 2 == 0))
    for _ in range(stale_kills):
        target = rng.choice(["all", *range(scenario.n_ranks)])
        if netcdf:
            trials.append(("killed", rng.uniform(0.0, 0.05), rng.randint(1, n_records - 1), target))
        else:
            trials.append(("killed", rng.uniform(1.0, max(1.5, run_seconds / 2)), 0, target))   # while it runs
    results = []
    for index, (kind, delay, after, extra) in enumerate(trials):
        out = work / f"{kind}-{index:03d}"
        if kind in ("together", "running"):
            result = two_jobs(scenario, out, reference, delay, after, kind=kind)
        elif kind == "requeue-wait":
            result = requeue_with_wait(scenario, out, reference, after, stop=extra)
        else:
            result = killed_holder_then_new_job(scenario, out, reference, delay, extra, after)
        results.append(result.as_dict())
        print(f"{name:16s} {result.kind:17s} {index + 1:3d}/{len(trials)}: "
              + (f"after record {after:3d} + {delay:.3f} s" if after else f"at {delay:6.2f} s          ")
              + f" exits {result.exits!s:9s} one-writer {result.one_writer!s:5s} file-equal {result.file_equal!s:5s} "
              f"zero-records {result.zero_records} checkpoints-ok {result.checkpoints_ok!s:5s} {result.detail[:120]}",
              flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=50, help="kills per scenario [50]")
    parser.add_argument("--two-jobs", type=int, default=0, metavar="N",
                        help="trials per scenario of two jobs on one directory at random offsets [0]")
    parser.add_argument("--requeues", type=int, default=0, metavar="N",
                        help="trials per scenario of a requeued job with --wait-for-lock while the first runs [0]")
    parser.add_argument("--stale-kills", type=int, default=0, metavar="N",
                        help="trials per scenario of a holder killed with -9, then a new job at once [0]")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="scenario (repeatable) [all]")
    parser.add_argument("--seed", type=int, default=2026, help="seed of the kill moments and targets [2026]")
    parser.add_argument("--work", type=Path, default=None, help="directory for the runs [a temporary one]")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="hpcgpu-fault-campaign-"))
    summaries = []

    def write_json():
        if args.json:
            args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                                             "processor": platform.processor(), "seed": args.seed,
                                             "scenarios": summaries}, indent=1))

    for index, name in enumerate(args.only or list(SCENARIOS)):
        summaries.append(campaign(name, args.kills, args.seed + index, work / name, args.two_jobs, args.requeues,
                                  args.stale_kills))
        write_json()   # after each scenario: a campaign stopped early keeps what it finished
    print()
    if args.kills:
        print(f"{'scenario':16s} {'file':16s} {'survived':>10s} {'restart equal':>14s}")
        for s in summaries:
            print(f"{s['scenario']:16s} {s['file']:16s} {s['survived']:>4d} / {s['tried']:<3d} "
                  f"{s['restart_equal']:>6d} / {s['tried']:<3d}")
    concurrent = [(s["scenario"], r) for s in summaries for r in s["two_jobs"]]
    if concurrent:
        print(f"{'scenario':16s} {'trial':17s} {'tried':>5s} {'passed':>6s} {'refused':>7s} {'one writer':>10s} "
              f"{'file equal':>10s} {'zero records':>12s} {'checkpoints ok':>14s}")
        for key in sorted({(name, r["kind"]) for name, r in concurrent}):
            rows = [r for name, r in concurrent if (name, r["kind"]) == key]
            print(f"{key[0]:16s} {key[1]:17s} {len(rows):5d} {sum(r['passed'] for r in rows):6d} "
                  f"{sum(2 in r['exits'] for r in rows):7d} {sum(r['one_writer'] for r in rows):10d} "
                  f"{sum(r['file_equal'] for r in rows):10d} {sum(r['zero_records'] for r in rows):12d} "
                  f"{sum(r['checkpoints_ok'] for r in rows):14d}")
    kills_ok = all(s["survived"] == s["tried"] == s["restart_equal"] for s in summaries)
    return 0 if kills_ok and all(r["passed"] for _, r in concurrent) else 1


if __name__ == "__main__":
    sys.exit(main())

"""apps.md against LAMMPS on the CPU, core for core: in.lj (fcc 0.8442, T 1.44, lj/cut 2.5, skin 0.3,
dt 0.005, NVE), the neighbour list checked every step on both sides (``neigh_modify delay 0 every 1 check
yes``; apps.md's default), medians over alternated repeats.

Cases, for every ``--cells`` size: 1 and 2 MPI ranks with one thread per rank on both sides, and one
apps.md rank with every core (Numba threads) against LAMMPS on every core (its usual best: one MPI rank
per core). Each repeat runs every case of both programs in turn, so load from other users hits both
alike. Measured per run: the wall time of the timed loop (LAMMPS "Loop time", apps.md ``wall_seconds``),
the CPU time (user + sys) of all its processes, the load average, and each program's phase breakdown
(LAMMPS "MPI task timing breakdown"; apps.md's per-phase timers). CPU time of the steps alone is the
median CPU time of a ``--steps`` run minus that of a 0-step run (start-up, compilation, setup).

Usage (repository root)::

    python benchmarks/md_lammps_cpu.py [--cells 20 40] [--repeats 3] [--steps 100] [--cases 1 2 all]
                                       [--json md_lammps_cpu.json]

Needs LAMMPS's ``lmp`` (Debian/Ubuntu: ``apt-get install lammps``; or ``LMP=/path/to/lmp``) and, for more
than one LAMMPS rank, the ``mpirun`` of the MPI it was built with (default: ``mpirun.openmpi`` when
present, else ``mpirun`` next to ``lmp``; or ``LMP_MPIRUN``). apps.md runs under the ``mpiexec`` on PATH
(``MPIEXEC`` to override) with this Python.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IN_LJ = """\
units lj
atom_style atomic
lattice fcc 0.8442
region box block 0 ${cells} 0 ${cells} 0 ${cells}
create_box 1 box
create_atoms 1 box
mass 1 1.0
velocity all create 1.44 87287 loop geom
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
neighbor 0.3 bin
neigh_modify delay 0 every 1 check yes
fix 1 all nve
thermo 50
run ${steps}
"""

#: LAMMPS sections -> the apps.md timer that holds the same work.
PHASES = {"Pair": "forces", "Neigh": "neighbor", "Comm": "communication", "Modify": "compute",
          "Output": "thermo", "Other": "host overhead"}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(command: list[str], env: dict, cwd: Path, timeout: float) -> tuple[float, str]:
    """Run ``command``; return (CPU seconds of it and its descendants, combined output)."""
    before = children_cpu_seconds()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    cpu = children_cpu_seconds() - before
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return cpu, done.stdout


class Lammps:
    name = "lammps"

    def __init__(self, workdir: Path):
        self.binary = os.environ.get("LMP") or shutil.which("lmp")
        if not self.binary:
            sys.exit("no LAMMPS binary: install it (Debian/Ubuntu: apt-get install lammps) or set LMP=/path/to/lmp")
        self.mpirun = os.environ.get("LMP_MPIRUN") or shutil.which("mpirun.openmpi") or str(
            Path(self.binary).resolve().parent / "mpirun")
        self.workdir = workdir
        (workdir / "in.lj").write_text(IN_LJ)
        self.version = subprocess.run([self.binary, "-h"], stdout=subprocess.PIPE, text=True).stdout
        found = re.search(r"Simulator - (.+)", self.version) or re.search(r"LAMMPS \(([^)]*)\)", self.version)
        self.version = found.group(1).strip() if found else "unknown"

    def command(self, ranks: int) -> list[str]:
        if ranks == 1:
            return [self.binary]
        extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return [self.mpirun, *extra, "--bind-to", "none", "-n", str(ranks), self.binary]

    def run(self, cells: int, steps: int, ranks: int, threads: int, tag: str, timeout: float) -> dict:
        log = self.workdir / f"{tag}.log"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        cpu, _ = run_measured(self.command(ranks) + ["-in", "in.lj", "-log", str(log), "-screen", "none",
                                                     "-var", "cells", str(cells), "-var", "steps", str(steps)],
                              env, self.workdir, timeout)
        text = log.read_text()
        result = {"cpu_seconds": cpu, "wall_seconds": None, "phases": {}}
        loop = re.search(r"Loop time of ([0-9.eE+-]+) on", text)
        if loop:
            result["wall_seconds"] = float(loop.group(1))
        for section, phase in PHASES.items():
            row = re.search(rf"^{section}\s*\|\s*([0-9.eE+-]+)?\s*\|\s*([0-9.eE+-]+)", text, re.MULTILINE)
            if row:
                result["phases"][phase] = float(row.group(2))
        builds = re.search(r"Neighbor list builds = (\d+)", text)
        result["neighbor_builds"] = int(builds.group(1)) if builds else None
        return result


class AppsMd:
    name = "apps.md"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.mpiexec = os.environ.get("MPIEXEC") or shutil.which("mpiexec") or "mpiexec"

    def run(self, cells: int, steps: int, ranks: int, threads: int, tag: str, timeout: float) -> dict:
        summary = self.workdir / f"{tag}.json"
        env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cpu, _ = run_measured([self.mpiexec, "-n", str(ranks), sys.executable, "-m", "apps.md", "--backend", "numpy",
                               "--cells", str(cells), "--steps", str(steps), "--quiet", "--no-plot",
                               "--output", str(self.workdir / tag), "--summary", str(summary)],
                              env, ROOT, timeout)
        record = json.loads(summary.read_text())
        phases = {name: values["mean"] for name, values in record["timers"].items()}
        return {"cpu_seconds": cpu, "wall_seconds": record["wall_seconds"], "phases": phases,
                "neighbor_builds": record["diagnostics"].get("neighbor_builds"), "checksum": record["checksum"]}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[20], help="fcc unit cells per axis [20]")
    parser.add_argument("--steps", type=int, default=100, help="timed steps [100]")
    parser.add_argument("--repeats", type=int, default=3, help="alternated repeats of every case [3]")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="cores of the all-cores case [all]")
    parser.add_argument("--cases", nargs="+", choices=("1", "2", "all"), default=["1", "2", "all"],
                        help="1 rank, 2 ranks (one thread per rank), all cores [all three]")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run [1800]")
    parser.add_argument("--json", default="md_lammps_cpu.json", help="result file [md_lammps_cpu.json]")
    options = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="md-lammps-cpu-"))
    programs = (Lammps(workdir), AppsMd(workdir))
    # (label, ranks, threads) per program: one thread per rank, then every core of the machine.
    cases = [("1 rank x 1 thread", {"lammps": (1, 1), "apps.md": (1, 1)}),
             ("2 ranks x 1 thread", {"lammps": (2, 1), "apps.md": (2, 1)}),
             (f"all {options.cores} cores", {"lammps": (options.cores, 1), "apps.md": (1, options.cores)})]
    cases = [case for case, key in zip(cases, ("1", "2", "all")) if key in options.cases]
    runs = []
    for repeat in range(options.repeats):
        for cells in options.cells:
            for label, layout in cases:
                for program in programs:
                    ranks, threads = layout[program.name]
                    for steps in (0, options.steps):
                        tag = f"{program.name}-{cells}-{ranks}x{threads}-{steps}-{repeat}"
                        load = os.getloadavg()[0]
                        result = program.run(cells, steps, ranks, threads, tag, options.timeout)
                        result.update(program=program.name, cells=cells, case=label, ranks=ranks, threads=threads,
                                      steps=steps, repeat=repeat, load_before=load, load_after=os.getloadavg()[0])
                        runs.append(result)
                        print(f"[{time.strftime('%H:%M:%S')}] {tag}: wall {result['wall_seconds']} s, cpu "
                              f"{result['cpu_seconds']:.2f} s, load {load:.1f}", flush=True)
    table = []
    for cells in options.cells:
        n_atoms = 4 * cells**3
        for label, _ in cases:
            row = {"cells": cells, "n_atoms": n_atoms, "case": label}
            for program in programs:
                mine = [r for r in runs if r["program"] == program.name and r["cells"] == cells and r["case"] == label]
                timed = [r for r in mine if r["steps"] == options.steps]
                wall = median(r["wall_seconds"] for r in timed)
                cpu = median(r["cpu_seconds"] for r in timed) - median(r["cpu_seconds"] for r in mine if r["steps"] == 0)
                phases = sorted({name for r in timed for name in r["phases"]})
                row[program.name] = {
                    "wall_seconds": wall, "cpu_seconds_of_steps": cpu,
                    "atom_steps_per_second": n_atoms * options.steps / wall if wall else None,
                    "atom_steps_per_cpu_second": n_atoms * options.steps / cpu if cpu > 0 else None,
                    "phases_seconds": {name: median(r["phases"].get(name) for r in timed) for name in phases},
                    "neighbor_builds": median(r["neighbor_builds"] for r in timed),
                    "load_median": median(r["load_before"] for r in timed)}
            md, lmp = row["apps.md"], row["lammps"]
            row["ratio_wall"] = lmp["wall_seconds"] / md["wall_seconds"]
            row["ratio_cpu"] = lmp["cpu_seconds_of_steps"] / md["cpu_seconds_of_steps"]
            table.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True).stdout.strip()
    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    conditions = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit, "cpu": cpu_model,
                  "cores": os.cpu_count(), "lammps": programs[0].version, "steps": options.steps,
                  "repeats": options.repeats, "load_average_min_median_max": [
                      min(r["load_before"] for r in runs), median(r["load_before"] for r in runs),
                      max(r["load_before"] for r in runs)],
                  "command": "python benchmarks/md_lammps_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    Path(options.json).write_text(json.dumps({"conditions": conditions, "table": table, "runs": runs}, indent=1))
    print(f"\nin.lj on the CPU, {options.steps} steps, medians of {options.repeats} alternated repeats; "
          f"load average median {conditions['load_average_min_median_max'][1]:.1f}; ratio = LAMMPS time / apps.md time")
    print(f"{'atoms':>8} {'case':<20} {'LAMMPS wall':>11} {'apps.md wall':>12} {'ratio':>6} "
          f"{'LAMMPS cpu':>10} {'apps.md cpu':>11} {'ratio':>6}")
    for row in table:
        md, lmp = row["apps.md"], row["lammps"]
        print(f"{row['n_atoms']:>8} {row['case']:<20} {lmp['wall_seconds']:>10.3f}s {md['wall_seconds']:>11.3f}s "
              f"{row['ratio_wall']:>6.2f} {lmp['cpu_seconds_of_steps']:>9.3f}s {md['cpu_seconds_of_steps']:>10.3f}s "
              f"{row['ratio_cpu']:>6.2f}")
    print("\nphases (median wall seconds; LAMMPS Pair/Neigh/Comm/Modify/Output/Other -> forces/neighbor/"
          "communication/compute/thermo/host overhead)")
    for row in table:
        for program in ("lammps", "apps.md"):
            phases = ", ".join(f"{k} {v:.3f}" for k, v in row[program]["phases_seconds"].items() if v is not None)
            print(f"{row['n_atoms']:>8} {row['case']:<20} {program:<8} {phases}")
    print(f"\nwrote {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

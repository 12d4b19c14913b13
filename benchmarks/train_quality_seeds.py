"""Test accuracy of an ``apps.train`` recipe over several seeds (how robust is a published figure?).

One MNIST-1D run of 6000 steps is chaotic: a different seed, rank count or BLAS (CPU against GPU)
moves the final test accuracy by a point or two. This script runs the app itself for each seed
(``python -m apps.train --seed S ...``, optionally under ``mpirun -np R``), several runs at a time,
and prints every seed's accuracy with the mean, minimum and maximum::

    python benchmarks/train_quality_seeds.py --model mlp --seeds 0-9 --jobs 2
    python benchmarks/train_quality_seeds.py --model cnn --seeds 0-15 --jobs 8 --backend cupy --gpus 2
    python benchmarks/train_quality_seeds.py --model cnn --ranks 2 -- --weight-decay 0.1

Arguments after ``--`` go to ``apps.train`` unchanged (a recipe variation to compare).
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_seeds(text):
    """``"0-9"`` or ``"1,5,42"`` -> list of ints."""
    seeds = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += list(range(int(first), int(last or first) + 1))
    return seeds


def run_one(index, seed, options, workdir):
    summary = os.path.join(workdir, f"seed{seed}.json")
    command = [sys.executable, "-m", "apps.train", "--model", options.model, "--seed", str(seed),
               "--backend", options.backend, "--quiet", "--no-plot", "--output", os.path.join(workdir, f"out{seed}"),
               "--summary", summary, *options.app_args]
    if options.ranks > 1:
        command = [options.mpiexec, "-n", str(options.ranks), *options.mpiexec_flags.split(), *command]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPOSITORY, os.environ.get("PYTHONPATH")])))
    if options.gpus and options.ranks == 1:     # one-rank runs spread over the GPUs
        environment["CUDA_VISIBLE_DEVICES"] = str(index % options.gpus)
    if options.backend == "numpy":     # small matrices: one BLAS thread per run is fastest
        environment.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    completed = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=options.timeout)
    wall = time.perf_counter() - start
    if completed.returncode != 0:
        raise RuntimeError(f"seed {seed}: rc {completed.returncode}\n{completed.stderr[-2000:]}")
    with open(summary) as handle:
        result = json.load(handle)
    return {"seed": seed, "test_accuracy": result["diagnostics"]["test_accuracy"],
            "test_loss": result["diagnostics"]["test_loss"], "backend": result["backend"], "wall_seconds": wall}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"), help="[mlp]")
    parser.add_argument("--seeds", default="0-9", help="seeds, e.g. 0-9 or 1,5,42 [0-9]")
    parser.add_argument("--ranks", type=int, default=1, help="ranks per run (mpiexec -n) [1]")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time [1]")
    parser.add_argument("--backend", default="numpy", choices=("numpy", "cupy"), help="[numpy]")
    parser.add_argument("--gpus", type=int, default=0, help="one-rank runs: spread them over N GPUs [0: as launched]")
    parser.add_argument("--mpiexec", default=os.environ.get("HPCGPU_MPIEXEC", "mpiexec"))
    parser.add_argument("--mpiexec-flags", default=os.environ.get("HPCGPU_MPIEXEC_FLAGS", ""))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run [600]")
    parser.add_argument("--json", metavar="FILE", help="write the per-seed results as JSON")
    options, rest = parser.parse_known_args(argv)
    options.app_args = rest[1:] if rest[:1] == ["--"] else rest
    seeds = parse_seeds(options.seeds)
    label = " ".join([options.model, f"{options.ranks} rank(s)", options.backend, *options.app_args])
    with tempfile.TemporaryDirectory() as workdir, \
            concurrent.futures.ThreadPoolExecutor(max_workers=options.jobs) as pool:
        results = list(pool.map(lambda item: run_one(*item, options, workdir), enumerate(seeds)))
    accuracies = [r["test_accuracy"] for r in results]
    print(f"{label}")
    print(" ".join(f"{r['seed']}:{100 * r['test_accuracy']:.1f}" for r in results))
    print(f"test accuracy over {len(seeds)} seeds: mean {100 * statistics.mean(accuracies):.2f}%  "
          f"min {100 * min(accuracies):.1f}%  max {100 * max(accuracies):.1f}%  "
          f"(wall per run {statistics.mean(r['wall_seconds'] for r in results):.1f} s, backend {results[0]['backend']})")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"label": label, "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()

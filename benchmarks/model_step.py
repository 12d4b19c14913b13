"""Time per step of a whole model run by hpcgpu, against a hand-written single-loop Numba step.

    NUMBA_NUM_THREADS=1 python benchmarks/model_step.py                       # 680 x 1200, one core
    NUMBA_NUM_THREADS=1 python benchmarks/model_step.py --ny 680 --nx 1200 --steps 200 --repeats 7 --json step.json

The model: explicit heat diffusion (5-point stencil, float64) on ``--ny`` x ``--nx`` cells between two
walls held at fixed temperatures (Dirichlet along y, periodic along x), a :class:`hpcgpu.FieldModel`
run by :func:`hpcgpu.run_model` on one rank, exactly as a user's model file runs (command line,
driver, NaN check every 100 steps, halo fill and walls every step; no netCDF output).

The hand-written step: one ``numba.njit`` loop over the cells that reads the walls and the periodic
neighbours itself (no ghost cells), the same arithmetic in the same order, and a swap of two arrays.
Both final states are compared bit for bit.

Per-step cost: for hpcgpu the driver's timed loop of ``--steps`` steps (from the end of the model's
``prepare`` to its ``settle``: every step, halo fill, walls, NaN checks and progress bookkeeping; not
start-up, compilation or output), for the hand-written step its loop of ``--steps`` steps; in process
CPU time and in wall time. hpcgpu and hand-written runs alternate, ``--repeats`` times, and the medians
are reported with the ratio hand / hpcgpu (the target is >= 0.9).
The overhead outside the kernels is hpcgpu's per-step time minus the time of the stencil sweep
alone (``kernel.apply`` over the owned cells, same fields).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hpcgpu  # noqa: E402
from hpcgpu.app.checksum import hash_arrays  # noqa: E402
from hpcgpu.provenance import git_commit  # noqa: E402

LOWER_WALL, UPPER_WALL, ALPHA = 1.0, 0.0, 0.2


@hpcgpu.stencil
def heat(u, alpha):
    return u[0, 0] + alpha * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])


def initial(y, x, ny, nx):
    return 0.5 + 0.25 * np.sin(2 * np.pi * x / nx) * np.sin(np.pi * y / ny)


class WalledHeat(hpcgpu.FieldModel):
    """Heat diffusion between two walls (benchmark)."""

    name, version, default_steps = "walled_heat", "1.0", 100
    fields, stencils = ("u",), (heat,)
    output_every = None
    boundary_conditions = hpcgpu.BoundaryConditions({(0, "lower"): hpcgpu.Dirichlet(LOWER_WALL),
                                                     (0, "upper"): hpcgpu.Dirichlet(UPPER_WALL)})
    options = (hpcgpu.Option("ny", int, 680, "cells along y", minimum=1),
               hpcgpu.Option("nx", int, 1200, "cells along x", minimum=1),
               hpcgpu.Option("alpha", float, ALPHA, "kappa dt / dx^2", positive=True))
    last = None   # the last model built (the benchmark reads its state)

    def __init__(self, comm, arch, options):
        ny, nx = options.ny, options.nx
        super().__init__(comm, arch, hpcgpu.Decomposition(comm, (ny, nx), periodic=(False, True)))
        self.current["u"].set_from_global(lambda y, x: initial(y, x, ny, nx))
        WalledHeat.last = self

    def step(self, timers):
        self.advance(heat, timers=timers)

    def prepare(self):
        super().prepare()
        self.loop_started = (time.process_time(), time.perf_counter())   # the driver's clock starts next

    def settle(self, timers):
        super().settle(timers)
        self.loop_ended = (time.process_time(), time.perf_counter())     # the driver's clock stops next


def hand_written_step():
    """``step(new, u, alpha, lower, upper)``: one loop over the cells, walls and periodic wrap inline."""
    from numba import njit

    @njit(cache=False)
    def step(new, u, alpha, lower, upper):
        ny, nx = u.shape
        for i in range(ny):
            for j in range(nx):
                north = u[i - 1, j] if i > 0 else lower
                south = u[i + 1, j] if i < ny - 1 else upper
                west = u[i, j - 1] if j > 0 else u[i, nx - 1]
                east = u[i, j + 1] if j < nx - 1 else u[i, 0]
                new[i, j] = u[i, j] + alpha * ((((north + south) + west) + east) - 4.0 * u[i, j])

    return step


def run_hand(step_fn, ny, nx, steps):
    """The final state and the (CPU, wall) seconds per step of the loop."""
    y, x = np.ix_(np.arange(ny), np.arange(nx))
    u = np.array(np.broadcast_to(initial(y, x, ny, nx), (ny, nx)), dtype=np.float64)
    new = np.empty_like(u)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step_fn(new, u, ALPHA, LOWER_WALL, UPPER_WALL)
        u, new = new, u
    return u, ((time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps)


def run_model(ny, nx, steps, directory):
    """The final state and the (CPU, wall) seconds per step of the driver's timed loop."""
    argv = ["--ny", str(ny), "--nx", str(nx), "--steps", str(steps), "--quiet", "--backend", "numpy",
            "--output", str(directory), "--no-watchdog"]
    code = WalledHeat.main(argv)
    assert code == 0, code
    model = WalledHeat.last
    per_step = tuple((end - start) / steps for start, end in zip(model.loop_started, model.loop_ended))
    return model.current["u"].gather(root=0), per_step


def sweep_time(ny, nx, repeats):
    """Seconds of one ``kernel.apply`` over the owned cells of the model's fields (the kernel alone)."""
    model = WalledHeat.last
    binding = heat.bind(model.spare["u"], {"u": model.current["u"]})
    values = binding.parameter_values({"alpha": ALPHA})
    samples = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(20):
            binding.run("owned", values)
        samples.append((time.process_time() - started) / 20)
    return statistics.median(samples)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ny", type=int, default=680, help="cells along y [680]")
    parser.add_argument("--nx", type=int, default=1200, help="cells along x [1200]")
    parser.add_argument("--steps", type=int, default=300, help="steps per run [300]")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats [5]")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    args = parser.parse_args(argv)
    ny, nx, steps = args.ny, args.nx, args.steps
    hand_step = hand_written_step()
    run_hand(hand_step, 4, 4, 1)   # compile
    per_step = {"hpcgpu": {"cpu": [], "wall": []}, "hand": {"cpu": [], "wall": []}}
    finals = {}
    with tempfile.TemporaryDirectory() as scratch:
        run_model(ny, nx, 2, Path(scratch) / "warm-up")   # compiles the stencil
        for repeat in range(args.repeats):
            for name in ("hand", "hpcgpu"):
                if name == "hand":
                    final, (cpu, wall) = run_hand(hand_step, ny, nx, steps)
                else:
                    final, (cpu, wall) = run_model(ny, nx, steps, Path(scratch) / f"run{repeat}")
                per_step[name]["cpu"].append(cpu)
                per_step[name]["wall"].append(wall)
                finals[name] = hash_arrays([("u", final)])
        identical = finals["hand"] == finals["hpcgpu"]
        kernel_alone = sweep_time(ny, nx, args.repeats)
    median = {name: {kind: statistics.median(values) for kind, values in times.items()}
              for name, times in per_step.items()}
    ratio_cpu = median["hand"]["cpu"] / median["hpcgpu"]["cpu"]
    ratio_wall = median["hand"]["wall"] / median["hpcgpu"]["wall"]
    overhead = median["hpcgpu"]["cpu"] - kernel_alone
    threads = os.environ.get("NUMBA_NUM_THREADS", "all")
    print(f"walled heat {ny} x {nx}, float64, 1 rank, NUMBA_NUM_THREADS={threads}; per step, median of "
          f"{args.repeats} runs of {steps} steps:")
    print(f"{'':<22}{'CPU ms':>10}{'wall ms':>10}")
    print(f"{'hpcgpu (run_model)':<22}{median['hpcgpu']['cpu'] * 1e3:>10.3f}{median['hpcgpu']['wall'] * 1e3:>10.3f}")
    print(f"{'hand-written Numba':<22}{median['hand']['cpu'] * 1e3:>10.3f}{median['hand']['wall'] * 1e3:>10.3f}")
    print(f"{'kernel sweep alone':<22}{kernel_alone * 1e3:>10.3f}")
    print(f"hand / hpcgpu: {ratio_cpu:.3f} (CPU time), {ratio_wall:.3f} (wall); outside the kernel: "
          f"{overhead * 1e3:.3f} ms CPU per step; final states {'bitwise equal' if identical else 'DIFFER'}")
    if args.json:
        record = {"benchmark": "model_step", "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "git_commit": git_commit(), "machine": platform.node(), "cpu": platform.processor(),
                  "command": " ".join(sys.argv), "numba_num_threads": threads, "shape": [ny, nx],
                  "per_step_s": median, "samples": per_step, "kernel_alone_s": kernel_alone,
                  "hand_over_hpcgpu_cpu": ratio_cpu, "hand_over_hpcgpu_wall": ratio_wall,
                  "overhead_cpu_s": overhead, "bitwise_equal": identical}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())

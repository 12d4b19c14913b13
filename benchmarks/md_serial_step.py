"""GPU step benchmark: atom-steps per second of the one-process MD step (``apps.md.serial.step``) on an
fcc LJ liquid.

The shared kernels alone, without the app around them (no decomposition, ghosts from periodic images,
no thermo output, checkpoints or summary): ``python -m apps.md`` measures the app's own steps through
the simulation driver. The system is LAMMPS ``bench/in.lj`` scaled: fcc at reduced density 0.8442,
T = 1.44, plain cut 2.5, skin 0.3, dt = 0.005. Timing uses CuPy events around ``steps`` steps (rebuilds
included) after a warm-up that compiles the kernels. Run it on a GPU machine, from the repository root::

    python benchmarks/md_serial_step.py --cells 80 --steps 100 --dtype float32     # 2,048,000 atoms
    python benchmarks/md_serial_step.py --cells 20 --steps 100 --dtype float32     # 32,000 atoms

Prints one line per run (also written as JSON with ``--json FILE``); :func:`benchmark_step` returns
the numbers as a dict.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.md import lattice, potential, serial  # noqa: E402


def benchmark_step(cells: int = 20, steps: int = 100, dtype: str = "float32", warmup_steps: int = 10,
                   rebuild_every: int = 1, rebuild_check: bool = True, sort_every: int = 1) -> dict:
    """Time ``steps`` GPU MD steps of an fcc lattice of ``cells**3`` unit cells; return the rates.

    Returns a dict with ``n_atoms``, ``steps``, ``seconds``, ``atom_steps_per_second``, ``n_builds``,
    ``capacity`` and the final thermo values (a sanity check that the run stayed physical).
    """
    import cupy

    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells, cells, cells))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), dt=0.005, skin=0.3,
                             rebuild_every=rebuild_every, rebuild_check=rebuild_check, sort_every=sort_every)
    state = serial.init(positions, velocities, box, config, atom_ids=atom_ids, xp=cupy, dtype=np.dtype(dtype))
    for _ in range(warmup_steps):
        serial.step(state, config)
    builds_before = state.n_builds
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(steps):
        serial.step(state, config)
    stop.record()
    stop.synchronize()
    seconds = cupy.cuda.get_elapsed_time(start, stop) / 1000.0
    sample = serial.thermo(state, config)
    result = {
        "n_atoms": int(atom_ids.size), "steps": steps, "dtype": dtype, "seconds": seconds,
        "atom_steps_per_second": atom_ids.size * steps / seconds,
        "n_builds": state.n_builds - builds_before, "capacity": state.neighbor_list.capacity,
        "temperature": sample.temperature, "pair_energy": sample.pair_energy, "pressure": sample.pressure,
    }
    print(f"LJ fcc {cells}^3 cells, {result['n_atoms']} atoms, {dtype}: {steps} steps in {seconds:.4f} s, "
          f"{result['atom_steps_per_second']:.3e} atom-steps/s, {result['n_builds']} rebuilds, "
          f"T={sample.temperature:.4f} E_pair={sample.pair_energy:.6f} P={sample.pressure:.5f}")
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/md_serial_step.py", description="Benchmark the GPU LJ MD step (atom-steps per second).")
    parser.add_argument("--cells", type=int, nargs="+", default=[20, 80], help="fcc unit cells per axis")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--rebuild-every", type=int, default=1)
    parser.add_argument("--no-check", action="store_true", help="rebuild every --rebuild-every steps unconditionally")
    parser.add_argument("--sort-every", type=int, default=1, help="sort atoms by cell every N rebuilds (0: never)")
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    results = [benchmark_step(cells, args.steps, args.dtype, rebuild_every=args.rebuild_every,
                              rebuild_check=not args.no_check, sort_every=args.sort_every) for cells in args.cells]
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(results, stream, indent=2)


if __name__ == "__main__":
    main()

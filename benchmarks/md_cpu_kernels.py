"""Time the CPU neighbour build and force kernel alone on in.lj (fcc 0.8442, 20^3 cells = 32,000 atoms, one
rank with its periodic ghosts), milliseconds per call, best of ``--repeats`` means of ``--calls`` calls.

Usage (repository root):  python benchmarks/md_cpu_kernels.py [--cells 20] [--calls 10] [--repeats 5]
Numba's threads: NUMBA_NUM_THREADS (default: every core).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from apps.md import cells, forces, lattice, neighbors, potential, serial


def best_mean_ms(work, calls: int, repeats: int) -> float:
    work()   # compiled (or loaded from Numba's cache) before timing
    means = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            work()
        means.append((time.perf_counter() - started) / calls * 1e3)
    return min(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (options.cells,) * 3)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    state = serial.init(positions, velocities, box, config, atom_ids=atom_ids)
    width = config.potential.max_cutoff + config.skin
    grid = cells.make_cell_grid(np.zeros(3), box, width, width)
    cell_list = cells.bin_atoms(state.positions, grid)
    listed = state.neighbor_list
    n_local = listed.n_local
    storage, counts = np.empty_like(listed.neighbors), np.empty_like(listed.counts)
    result = np.empty((n_local, 3))
    build = best_mean_ms(lambda: neighbors._build_once(state.positions, n_local, cell_list, grid, width, storage,
                                                       counts), options.calls, options.repeats)
    force = best_mean_ms(lambda: forces.compute_forces(state.positions, state.types, listed, state.pair_table, result),
                         options.calls, options.repeats)
    print(f"{n_local} atoms, {state.positions.shape[0] - n_local} ghosts, {counts.mean():.1f} neighbours per atom")
    print(f"neighbour build  {build:7.2f} ms")
    print(f"forces + energy  {force:7.2f} ms")


if __name__ == "__main__":
    main()

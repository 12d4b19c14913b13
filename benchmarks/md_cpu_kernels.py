"""Time the CPU neighbour builds and force kernels alone on in.lj (fcc 0.8442, 20^3 cells = 32,000 atoms,
one rank with its periodic ghosts): the half list (the CPU path) and the full list (the GPU layout),
CPU milliseconds per call (this process, all its threads: robust on a shared machine), best of
``--repeats`` means of ``--calls`` calls.

Usage (repository root):  python benchmarks/md_cpu_kernels.py [--cells 20] [--calls 10] [--repeats 5]
Numba's threads: NUMBA_NUM_THREADS (default: every core).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from apps.md import cells, forces, half_list, lattice, neighbors, potential, serial


def best_mean_ms(work, calls: int, repeats: int) -> float:
    work()   # compiled (or loaded from Numba's cache) before timing
    means = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(calls):
            work()
        means.append((time.process_time() - started) / calls * 1e3)
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
    half_build = best_mean_ms(lambda: half_list.build_half_neighbor_list(
        state.positions, n_local, cell_list, grid, width, config.skin, listed.capacity, neighbors.GROWTH),
        options.calls, options.repeats)
    full_list = neighbors.build_neighbor_list(state.positions, n_local, cell_list, grid, config.potential.max_cutoff,
                                              config.skin)
    timed = {}
    for name, chosen in (("half", listed), ("full", full_list)):
        for energy in (False, True):
            timed[name, energy] = best_mean_ms(lambda: forces.compute_forces(
                state.positions, state.types, chosen, state.pair_table, result, compute_energy=energy),
                options.calls, options.repeats)
    print(f"{n_local} atoms, {state.positions.shape[0] - n_local} ghosts, {counts.mean():.1f} neighbours per atom "
          f"(full list), {listed.counts.mean():.1f} (half list)")
    print(f"neighbour build, half list (CPU path)   {half_build:7.2f} ms")
    print(f"neighbour build, full list (GPU layout) {build:7.2f} ms")
    for (name, energy), value in timed.items():
        print(f"forces{' + energy' if energy else '         '}, {name} list            {value:7.2f} ms")


if __name__ == "__main__":
    main()

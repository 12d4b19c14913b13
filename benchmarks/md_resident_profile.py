"""Device time per kernel of the device-resident MD step (apps.md.resident), launched eagerly with CUDA
events around each kernel, on in.lj-style fcc systems (density 0.8442, T 1.44, cut 2.5, skin 0.3).

    python3 benchmarks/md_resident_profile.py --cells 20 80 --steps 100

Prints, per system, the microseconds per step of each kernel (rebuild kernels averaged over all steps,
and per rebuild) and the sum, against the wall time of the same steps replayed as graphs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profile(cells: int, steps: int, dtype) -> None:
    import cupy

    import hpcgpu
    from apps.md import distributed, lattice, potential, serial
    from apps.md.forces import compute_forces_periodic
    from apps.md.integrate import velocity_verlet_second_half
    from apps.md.resident_kernels import _kernel
    from apps.md.watch import NOT_EXCEEDED, first_half_and_watch
    from hpcgpu.particles import ParticleDomain

    comm = hpcgpu.Communicator()
    hpcgpu.arch.auto(comm, backend="cupy")
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells,) * 3)
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, resident=True)
    state = distributed.init(ParticleDomain(comm, box, config.ghost_width), positions, velocities, config,
                             atom_ids=atom_ids, xp=cupy, dtype=dtype)
    resident = state.resident
    for _ in range(20):
        distributed.step(state, config)
    distributed.settle(state, config)
    totals, rebuilds = {}, 0
    events = [cupy.cuda.Event() for _ in range(8)]
    dtype = state.positions.dtype
    n = state.n_local
    from apps.md._arrays import THREADS_PER_BLOCK, blocks_for

    for _ in range(steps):
        events[0].record()
        _kernel("md_resident_begin")((blocks_for(resident.n_cells),), (THREADS_PER_BLOCK,),
                                     (resident.counter, resident.watch, resident.cell_count, np.int32(resident.n_cells)))
        events[1].record()
        first_half_and_watch(state.positions, state.velocities, state.forces, state.masses, config.dt, resident.reference,
                             (0.5 * config.skin) ** 2, 0, resident.watch, step_counter=resident.counter)
        events[2].record()
        flagged = int(resident.watch[0].get()) != NOT_EXCEEDED   # eager only: to sort rebuild steps apart
        events[2].synchronize()
        # The three kernels of ResidentSteps._rebuild_if_flagged, with events between them.
        box_, per_length, shape = resident._geometry()
        events[3].record()
        _kernel("md_resident_bin", dtype)(
            (blocks_for(n),), (THREADS_PER_BLOCK,),
            (state.positions, state.images, resident.reference, np.int32(n), np.int32(1), *box_, *per_length, *shape,
             resident.cell_count, resident.cell_atoms, np.int32(resident.cell_capacity), resident.watch, resident.control))
        events[7].record()
        _kernel("md_resident_sort_cells")(
            (blocks_for(32 * resident.n_cells),), (THREADS_PER_BLOCK,),
            (resident.watch, resident.cell_count, np.int32(resident.n_cells), np.int32(resident.cell_capacity),
             resident.cell_atoms))
        events[6].record()
        inverse = tuple(resident.real(1.0 / v) for v in resident.box)
        _kernel("md_resident_neighbors", dtype)(
            (blocks_for(n * resident.build_lanes),), (THREADS_PER_BLOCK,),
            (resident.reference, np.int32(n), *box_, *inverse, *per_length, *shape, resident.cell_count,
             resident.cell_atoms, np.int32(resident.cell_capacity), resident.real(resident.cutoff ** 2),
             np.int32(resident.neighbor_capacity), resident.neighbors, resident.counts, resident.watch,
             resident.control, np.int32(1), np.int32(resident.build_lanes.bit_length() - 1),
             *(resident.real(0),) * 3, np.int32(7), np.uint64(0)))
        events[4].record()
        events[4].synchronize()
        rebuild_parts = [cupy.cuda.get_elapsed_time(events[a], events[b]) * 1e3 for a, b in ((3, 7), (7, 6), (6, 4))]
        compute_forces_periodic(state.positions, state.types, state.neighbor_list, state.pair_table, state.forces,
                                resident.box, lanes=resident.lanes)
        events[5].record()
        velocity_verlet_second_half(state.velocities, state.forces, state.masses, config.dt)
        events[6].record()
        events[6].synchronize()
        parts = {"begin": (0, 1), "first half + watch": (1, 2), "forces": (4, 5), "second half": (5, 6)}
        for name, (a, b) in parts.items():
            totals[name] = totals.get(name, 0.0) + cupy.cuda.get_elapsed_time(events[a], events[b]) * 1e3
        for name, micro in zip(("rebuild: bin", "rebuild: sort cells", "rebuild: neighbours"), rebuild_parts):
            totals[name] = totals.get(name, 0.0) + micro
        rebuilds += flagged
        state.step += 1
    print(f"\n{n} atoms ({np.dtype(dtype).name}), lanes per atom {resident.lanes}, {steps} eager steps, {rebuilds} rebuilds")
    for name, micro in totals.items():
        extra = f"   ({micro / max(rebuilds, 1):8.1f} us per rebuild)" if name.startswith("rebuild") else ""
        print(f"  {name:<28} {micro / steps:8.1f} us/step{extra}")
    print(f"  {'sum':<28} {sum(totals.values()) / steps:8.1f} us/step")
    # The same number of steps replayed as graphs (chunks of 25), device time between two events.
    distributed.settle(state, config)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(steps):
        distributed.step(state, config)
    distributed.settle(state, config)
    stop.record()
    stop.synchronize()
    print(f"  {'graphs, wall of the GPU':<28} {cupy.cuda.get_elapsed_time(start, stop) * 1e3 / steps:8.1f} us/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[20, 80])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    options = parser.parse_args()
    for cells in options.cells:
        profile(cells, options.steps, np.dtype(options.dtype))


if __name__ == "__main__":
    main()

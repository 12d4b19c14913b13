"""Device time per part of the slab driver's MD step (apps.md.resident_slab), 2.05M atoms per GPU.

    mpirun -np 2 python3 benchmarks/md_slab_profile.py --cells 80 --steps 100

Each rank holds an in.lj fcc slab of ``cells`` x ``cells`` x ``cells`` unit cells (the box is ``P * cells``
long on x, ``--dims P,1,1``). The step's parts (the chain in the driver's docstring) are launched eagerly
with a CUDA event after each, NCCL calls included; rank 0 prints microseconds per step for each part,
split into steps without and with a rebuild, and the sum against the GPU time of the same number of
steps replayed as graphs. Without a GPU it exits with a message.
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
    from apps.md.watch import NOT_EXCEEDED
    from hpcgpu.particles import ParticleDomain

    comm = hpcgpu.Communicator()
    hpcgpu.arch.auto(comm, backend="cupy")
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells * comm.size, cells, cells))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, resident=True)
    domain = ParticleDomain(comm, box, config.ghost_width, dims=(comm.size, 1, 1))
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=cupy,
                             dtype=dtype)
    steps_driver = state.resident
    for _ in range(20):
        distributed.step(state, config)
    distributed.settle(state, config)

    quiet, rebuild, n_rebuilds = {}, {}, 0
    for _ in range(steps):
        events = [("start", cupy.cuda.Event())]
        events[0][1].record()

        def mark(name, events=events):
            event = cupy.cuda.Event()
            event.record()
            events.append((name, event))

        steps_driver._record_step(energy=False, mark=mark)
        events[-1][1].synchronize()
        flagged = int(steps_driver.watch[0].get()) != NOT_EXCEEDED
        totals = rebuild if flagged else quiet
        n_rebuilds += flagged
        for (_, before), (name, after) in zip(events, events[1:]):
            totals[name] = totals.get(name, 0.0) + cupy.cuda.get_elapsed_time(before, after) * 1e3
        state.step += 1
    steps_driver.settle(state)

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    comm.barrier()
    start.record()
    for _ in range(steps):
        distributed.step(state, config)
    distributed.settle(state, config)
    stop.record()
    stop.synchronize()
    graph_step = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / steps
    if comm.rank != 0:
        return
    n_quiet = steps - n_rebuilds
    print(f"\n{comm.size} ranks, {state.n_atoms} atoms ({np.dtype(dtype).name}), rank 0 holds {state.n_local}; "
          f"{steps} eager steps: {n_quiet} without and {n_rebuilds} with a rebuild")
    print(f"  {'part':<40} {'us/step (no rebuild)':>22} {'us per rebuild step':>22}")
    for name in dict.fromkeys([*quiet, *rebuild]):
        print(f"  {name:<40} {quiet.get(name, 0.0) / max(n_quiet, 1):22.1f} {rebuild.get(name, 0.0) / max(n_rebuilds, 1):22.1f}")
    print(f"  {'sum':<40} {sum(quiet.values()) / max(n_quiet, 1):22.1f} {sum(rebuild.values()) / max(n_rebuilds, 1):22.1f}")
    print(f"  {'graphs (chunks of 25), GPU time per step':<40} {graph_step:22.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=80, help="fcc unit cells per GPU and axis [80: 2.05M atoms]")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    options = parser.parse_args()
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:   # noqa: BLE001
        sys.exit(f"md_slab_profile needs CUDA GPUs with CuPy ({error})")
    profile(options.cells, options.steps, np.dtype(options.dtype))


if __name__ == "__main__":
    main()

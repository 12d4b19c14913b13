"""GPU time per step of the slab driver's graphs with one part of the step left out (apps.md.resident_slab).

    mpirun -np 2 python3 benchmarks/md_slab_variants.py --cells 80 --reps 3

Eager launches (benchmarks/md_slab_profile.py) time the small kernels and the NCCL calls with the host's
launch gaps in them; here every variant is a captured graph of ``--chunk`` steps, replayed ``--reps``
times from the same snapshot (same rebuild steps), and the difference to the full step is what the part
costs inside a graph. A part the step cannot do without is done twice instead (the NCCL calls: the same
messages into the same buffers; the difference is then its cost); the migration and the ghost send-list
selection are left out (the first lets atoms stray out of their slab for the few chunks timed: a timing
tool only). Rank 0 prints microseconds per step (the slower rank's), the rebuilds per chunk (they must
agree with the full step's for the difference to mean anything) and the difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _AllreduceTimes:
    """The driver's device collectives with every allreduce issued ``times`` times (idempotent: a min of one
    word in place)."""

    def __init__(self, movers, times):
        self._movers, self._times = movers, times

    def allreduce(self, *args, **kwargs):
        for _ in range(self._times):
            result = self._movers.allreduce(*args, **kwargs)
        return result

    def __getattr__(self, name):
        return getattr(self._movers, name)


def _exchange_times(steps, method_name, times):
    """Run ``method_name`` of the driver with its NCCL exchange issued ``times`` times (0: left out; 2: the
    same messages into the same buffers again, which changes nothing but the time)."""
    method = getattr(type(steps), method_name)
    exchange = type(steps)._exchange

    def patched(*args, **kwargs):
        steps._exchange = lambda per_side: [exchange(steps, per_side) for _ in range(times)]
        try:
            return method(steps, *args, **kwargs)
        finally:
            del steps._exchange
    return patched


#: Variants that keep the physics (and so the rebuild steps) of the full step: a part left out where the
#: step does not need it, or an idempotent part done twice (its cost is then the difference to "full").
VARIANTS = ("full", "allreduce twice", "migrant NCCL twice", "ghost NCCL twice", "no migration",
            "no ghost lists", "no IF nodes")


def apply(steps, variant):
    """Undo every patch, then patch the driver for ``variant``."""
    from apps.md import chunked_graphs

    chunked_graphs.GRAPH_CONDITIONALS = variant != "no IF nodes"   # the [flag] kernels as plain graph nodes
    for name in ("_record_migration", "_record_ghost_exchange", "_record_ghost_lists"):
        steps.__dict__.pop(name, None)
    if isinstance(steps.movers, _AllreduceTimes):
        steps.movers = steps.movers._movers
    if variant == "allreduce twice":
        steps.movers = _AllreduceTimes(steps.movers, 2)
    if variant == "migrant NCCL twice":
        steps._record_migration = _exchange_times(steps, "_record_migration", 2)
    if variant == "no migration":
        steps._record_migration = lambda mark=None: None
    if variant == "ghost NCCL twice":
        steps._record_ghost_exchange = _exchange_times(steps, "_record_ghost_exchange", 2)
    if variant == "no ghost lists":
        original = type(steps)._record_ghost_lists
        steps._record_ghost_lists = lambda source: None if source is steps.positions else original(steps, source)


def run(cells: int, chunk: int, reps: int, dtype, exchange: str) -> None:
    import cupy

    import hpcgpu
    from apps.md import distributed, lattice, potential, serial
    from apps.md.resident_slab import W_BUILDS
    from hpcgpu.particles import ParticleDomain

    comm = hpcgpu.Communicator()
    hpcgpu.arch.auto(comm, backend="cupy")
    positions, atom_ids, box = lattice.make_lattice("fcc", 0.8442, (cells * comm.size, cells, cells))
    velocities = lattice.thermal_velocities(atom_ids, np.ones(atom_ids.size), 1.44, 87287)
    config = serial.MDConfig(potential=potential.lennard_jones(cutoff=2.5), skin=0.3, resident=True,
                             check_interval=chunk, exchange=exchange)
    domain = ParticleDomain(comm, box, config.ghost_width, dims=(comm.size, 1, 1))
    mine = domain.subbox.contains(positions)
    state = distributed.init(domain, positions[mine], velocities[mine], config, atom_ids=atom_ids[mine], xp=cupy,
                             dtype=dtype)
    steps = state.resident
    for _ in range(2 * chunk):
        distributed.step(state, config)
    distributed.settle(state, config)
    start_step = state.step
    steps._record_save()   # the snapshot every replay starts from
    cupy.cuda.Device().synchronize()

    rows = []
    for variant in VARIANTS:
        apply(steps, variant)
        steps._graphs.clear()
        graph = steps._graph(chunk, False)
        times, builds = [], []
        for _ in range(reps + 1):
            steps._restore(start_step)
            steps._build_from_reference()
            builds_before = int(steps.words[W_BUILDS].get())
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            cupy.cuda.Device().synchronize()
            comm.barrier()
            start.record()
            graph.launch()
            stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / chunk)
            builds.append(int(steps.words[W_BUILDS].get()) - builds_before)
        per_step = comm.allreduce(float(np.median(times[1:])), "max")
        rows.append((variant, per_step, builds[-1]))
    apply(steps, "full")
    steps._graphs.clear()
    steps._restore(start_step)
    steps._build_from_reference()
    if comm.rank == 0:
        full = rows[0][1]
        print(f"\n{comm.size} ranks, {state.n_atoms} atoms ({np.dtype(dtype).name}), exchange "
              f"{steps.summary()['exchange']}, graphs of {chunk} steps, "
              f"median of {reps} replays from one snapshot (slower rank)")
        print(f"  {'variant':<22} {'us/step':>10} {'minus full':>11} {'builds/chunk':>13}")
        for variant, per_step, n_builds in rows:
            print(f"  {variant:<22} {per_step:10.1f} {per_step - full:11.1f} {n_builds:13d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=80, help="fcc unit cells per GPU and axis [80: 2.05M atoms]")
    parser.add_argument("--chunk", type=int, default=25, help="steps per graph [25]")
    parser.add_argument("--reps", type=int, default=3, help="timed replays per variant [3]")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--exchange", choices=("auto", "peer", "nccl"), default="auto",
                        help="the slab driver's exchange (the NCCL variants change nothing with peer) [auto]")
    options = parser.parse_args()
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as error:   # noqa: BLE001
        sys.exit(f"md_slab_variants needs CUDA GPUs with CuPy ({error})")
    run(options.cells, options.chunk, options.reps, np.dtype(options.dtype), options.exchange)


if __name__ == "__main__":
    main()

"""Step-time overhead of hang and straggler detection (``hpcgpu.health``), measured in one job.

A synthetic bulk-synchronous step -- a NumPy update of ``--cells`` float64 values and a ring exchange of
``--message`` bytes with the neighbouring ranks (MPI Sendrecv), the shape of a stencil step -- runs in
alternating blocks of ``--block`` steps: plain blocks, and blocks with the driver's hooks
(:class:`hpcgpu.health.run_health.RunHealth`: the watchdog's mark after every step, its thread looking
every interval and sending a heartbeat to rank 0, the straggler comparison every ``--straggler-every``
steps). Slow drifts of a shared machine hit both kinds of block alike; the overhead is the ratio of the
median block times. A tight loop of the hook alone gives its cost per call in nanoseconds.

    mpiexec -n 4 python benchmarks/watchdog_overhead.py                     # defaults
    mpiexec -n 2 python benchmarks/watchdog_overhead.py --cells 1000000 --json overhead.json

Prints a table (rank 0); ``--json FILE`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from types import SimpleNamespace

import numpy as np


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=20_000, help="float64 values updated per step per rank [20000]")
    parser.add_argument("--message", type=int, default=8192, help="bytes sent to each ring neighbour per step [8192]")
    parser.add_argument("--block", type=int, default=500, help="steps per block [500]")
    parser.add_argument("--blocks", type=int, default=10, help="blocks in all, half of them with the hooks [10]")
    parser.add_argument("--straggler-every", type=int, default=100, help="steps between straggler comparisons [100]")
    parser.add_argument("--calls", type=int, default=200_000, help="calls of the hook alone, for its cost [200000]")
    parser.add_argument("--json", default=None, help="write the results here (rank 0)")
    return parser.parse_args(argv)


class SyntheticStep:
    """One step: ``values = 0.5 * values + 1`` in place, then a ring Sendrecv both ways (timed as
    ``compute`` and ``communication`` in a :class:`~hpcgpu.app.timers.PhaseTimers`)."""

    def __init__(self, comm, timers, cells: int, message: int):
        self.comm, self.timers = comm, timers
        self.values = np.ones(cells)
        self.send = np.ones(max(1, message // 8))
        self.receive = np.empty_like(self.send)
        self.right, self.left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size

    def __call__(self) -> None:
        with self.timers.phase("compute"):
            np.multiply(self.values, 0.5, out=self.values)
            np.add(self.values, 1.0, out=self.values)
        if self.comm.size > 1:
            with self.timers.phase("communication"):
                self.comm.mpi.Sendrecv(self.send, dest=self.right, recvbuf=self.receive, source=self.left)
                self.comm.mpi.Sendrecv(self.send, dest=self.left, recvbuf=self.receive, source=self.right)


def main(argv=None) -> int:
    options = parse_arguments(argv)
    import hpcgpu
    from hpcgpu.app.timers import PhaseTimers
    from hpcgpu.health.run_health import RunHealth

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.CPU("benchmark")
    timers = PhaseTimers(arch)
    step_fn = SyntheticStep(comm, timers, options.cells, options.message)
    flags = SimpleNamespace(watchdog=True, straggler_every=options.straggler_every, straggler_margin=0.2,
                            straggler_windows=3)
    health = RunHealth.from_options(comm, arch, flags, output=None, loud=False)
    for _ in range(50):   # warm-up: caches, connections
        step_fn()
    step = 0
    blocks = {"plain": [], "hooks": []}
    for block in range(options.blocks):
        mode = "hooks" if block % 2 else "plain"
        comm.barrier()
        started = time.perf_counter()
        for _ in range(options.block):
            step_fn()
            step += 1
            if mode == "hooks":
                health.step_done(step, timers)
        comm.barrier()
        blocks[mode].append((time.perf_counter() - started) / options.block)
    # The hook alone: the watchdog's mark (and the straggler detector's "not yet" test), per call.
    health.stragglers.every = 0
    started = time.perf_counter()
    for call in range(options.calls):
        health.step_done(step + call, timers)
    hook_ns = (time.perf_counter() - started) / options.calls * 1e9
    extra = health.finish()
    plain, hooks = statistics.median(blocks["plain"]), statistics.median(blocks["hooks"])
    hook_ns = comm.mpi.allreduce(hook_ns, op=__import__("mpi4py.MPI", fromlist=["MPI"]).MAX)
    result = {
        "n_ranks": comm.size, "host": platform.node(), "python": platform.python_version(),
        "cells": options.cells, "message_bytes": options.message, "block_steps": options.block,
        "blocks": options.blocks, "straggler_every": options.straggler_every,
        "plain_step_us_median": plain * 1e6, "hooks_step_us_median": hooks * 1e6,
        "overhead_percent": 100 * (hooks / plain - 1), "hook_call_ns_max_over_ranks": hook_ns,
        "block_step_us": {mode: [t * 1e6 for t in times] for mode, times in blocks.items()},
        "watchdog_interval_s": extra["health"]["watchdog"]["interval_s"],
    }
    if comm.rank == 0:
        print(f"watchdog overhead: {comm.size} rank(s), {options.cells} cells + {options.message} B ring exchange per step, "
              f"{options.blocks} blocks of {options.block} steps")
        print(f"{'blocks':<26} {'median us/step':>15} {'min':>10} {'max':>10}")
        for mode, label in (("plain", "plain"), ("hooks", "watchdog + stragglers")):
            times = [t * 1e6 for t in blocks[mode]]
            print(f"{label:<26} {statistics.median(times):>15.2f} {min(times):>10.2f} {max(times):>10.2f}")
        print(f"overhead of the hooks: {result['overhead_percent']:+.2f}% of a step (median blocks); the hook alone "
              f"{hook_ns:.0f} ns per call (slowest rank)")
        if options.json:
            with open(options.json, "w") as handle:
                json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

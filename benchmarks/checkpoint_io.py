"""Checkpoint write throughput against a plain write of the same bytes, restart time, and the
slowdown that an asynchronous checkpoint inflicts on the stepping thread.

    mpiexec -n 4 python benchmarks/checkpoint_io.py --mib-per-rank 256 --dir /scratch/$USER/bench
    python benchmarks/checkpoint_io.py --mib-per-rank 1024 --json checkpoint_io.json
    python benchmarks/checkpoint_io.py --skip-throughput --overhead 1024:0 --overhead 1.5:100

*Throughput* (skipped with ``--skip-throughput``). For each repeat, every rank:

1. *plain*: writes ``--mib-per-rank`` MiB to its own file in 16 MiB ``os.write`` calls, then fsync
   (the best a program can do on this disk with this many writers);
2. *checkpoint*: ``CheckpointManager.save`` of a float64 field with that many MiB per rank (a
   strided interior view, as in every app: tiles, CRC32, rank file, master file with Virtual
   Datasets, fsync, agreement, rename);
3. *restart*: ``CheckpointManager.load`` of that checkpoint into a fresh field (reads and verifies
   every byte).

Times are the slowest rank's (barrier before and after). The table reports GB/s and the
checkpoint/plain ratio of the best repeat of each; the issue's target is a ratio >= 0.70. ``--async``
also reports how long an asynchronous save blocks the caller.

*Overhead* (``--overhead MIB:EVERY``, repeatable). A Python-bound loop stands in for an app that
launches GPU kernels from Python: every iteration runs ``--loop-ops`` small array operations (NumPy
on the CPU, CuPy kernels with ``--backend cupy``), so the stepping thread always needs the GIL. The
loop runs ``--loop-iterations`` iterations without checkpoints and, alternating, with an asynchronous
checkpoint of MIB MiB per rank (3 fields, like the shallow-water model) every EVERY iterations
(``poll()`` every iteration, the final ``wait()`` included). EVERY = 0 means one save at the start
of the loop (a large state written while stepping continues). Reported, medians of
``--overhead-repeats``:

* ``slowdown``: loop time with checkpoints / without - 1 (the issue's target: <= 5% with a
  checkpoint every 100 steps of the ``apps.stencil`` GPU benchmark, whose state is 1.5 MB);
* ``in-flight rate``: loop iterations per second while a background write is in flight, relative to
  the rate without checkpoints (1.00 = the writer costs the stepping thread nothing);
* ``save ms``: how long ``save()`` blocked the loop; ``write s``: background write time;
  ``writer thread CPU``: CPU time of the thread that wrote the files of the last save (an upper
  bound of the GIL it held; system calls such as ``pwrite`` count but release the GIL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHUNK = 16 * 2**20
COLUMNS = 2048


def timed(comm, fn):
    comm.barrier()
    started = time.perf_counter()
    result = fn()
    comm.barrier()
    return comm.allreduce(time.perf_counter() - started, op="max"), result


def plain_write(path: Path, n_bytes: int) -> None:
    block = np.random.default_rng(0).integers(0, 255, size=CHUNK, dtype=np.uint8).tobytes()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = n_bytes
        while left > 0:
            left -= os.write(descriptor, block[:min(CHUNK, left)])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def make_fields(comm, arch, mib_per_rank: float, n_fields: int, names="huvwxyz"):
    """``n_fields`` float64 fields of ``COLUMNS`` columns holding ``mib_per_rank`` MiB per rank in all."""
    import hpcgpu

    rows = max(1, int(mib_per_rank * 2**20 / n_fields) // (8 * COLUMNS)) * comm.size
    grid = hpcgpu.Decomposition(comm, (rows, COLUMNS), dims=(comm.size, 1))
    fields = {}
    for number in range(n_fields):
        field = hpcgpu.Field(grid, arch, halo_width=1, name=names[number])
        field.set_from_global(lambda y, x, k=number: np.sin(0.001 * y + k) + 1e-3 * x)
        fields[names[number]] = field
    return grid, fields


# ---------------------------------------------------------------------- throughput
def throughput(comm, arch, options, directory: Path) -> dict:
    import hpcgpu
    from hpcgpu.checkpoint import CheckpointManager

    grid, fields = make_fields(comm, arch, options.mib_per_rank, 1)
    field = fields["h"]
    n_bytes = int(np.prod(grid.local_shape)) * 8
    total_bytes = comm.allreduce(n_bytes, op="sum")
    records = []
    for repeat in range(options.repeats):
        plain_seconds, _ = timed(comm, lambda: plain_write(directory / f"plain_{comm.rank:05d}.bin", n_bytes))
        manager = CheckpointManager(comm, directory / "ckpt", app="benchmarks.checkpoint_io", keep=1)
        save_seconds, _ = timed(comm, lambda: manager.save(repeat, fields={"h": field}, replicated={"repeat": repeat}))
        restored = hpcgpu.Field(grid, arch, halo_width=1, name="h")
        load_seconds, _ = timed(comm, lambda: manager.load("latest", fields={"h": restored}))
        assert bool((restored.interior == field.interior).all())
        record = {"repeat": repeat, "plain_seconds": plain_seconds, "save_seconds": save_seconds,
                  "load_seconds": load_seconds, "plain_gbps": total_bytes / plain_seconds / 1e9,
                  "save_gbps": total_bytes / save_seconds / 1e9, "load_gbps": total_bytes / load_seconds / 1e9}
        record["ratio"] = record["save_gbps"] / record["plain_gbps"]
        if options.asynchronous:
            background = CheckpointManager(comm, directory / "ckpt-async", app="benchmarks.checkpoint_io", keep=1,
                                           asynchronous=True)
            blocked, _ = timed(comm, lambda: background.save(repeat, fields={"h": field}))
            total, _ = timed(comm, background.wait)
            record.update(async_blocking_seconds=blocked, async_total_seconds=blocked + total)
            background.close()
        records.append(record)
        os.remove(directory / f"plain_{comm.rank:05d}.bin")
    comm.barrier()
    best = {key: (max if key.endswith("gbps") or key == "ratio" else min)(r[key] for r in records)
            for key in records[0] if key != "repeat"}
    # Disks are noisy: compare the best of each (a ratio of single repeats mixes good and bad moments).
    best["ratio"] = best["save_gbps"] / best["plain_gbps"]
    if comm.rank == 0:
        print(f"throughput: {comm.size} ranks, {n_bytes / 2**20:.0f} MiB per rank, {total_bytes / 1e9:.2f} GB "
              f"in total, directory {directory.resolve()}")
        print(f"{'repeat':>6} {'plain GB/s':>11} {'save GB/s':>10} {'ratio':>6} {'restart s':>10} {'load GB/s':>10}")
        for r in records:
            print(f"{r['repeat']:>6} {r['plain_gbps']:>11.3f} {r['save_gbps']:>10.3f} {r['ratio']:>6.2f} "
                  f"{r['load_seconds']:>10.3f} {r['load_gbps']:>10.3f}")
        print(f"{'best':>6} {best['plain_gbps']:>11.3f} {best['save_gbps']:>10.3f} {best['ratio']:>6.2f} "
              f"{best['load_seconds']:>10.3f} {best['load_gbps']:>10.3f}   (target ratio >= 0.70)")
        if options.asynchronous:
            print(f"asynchronous save blocks for {best['async_blocking_seconds']:.3f} s of "
                  f"{best['async_total_seconds']:.3f} s")
    return {"bytes_per_rank": n_bytes, "total_bytes": total_bytes, "records": records, "best": best}


# ---------------------------------------------------------------------- overhead
def in_flight(manager) -> bool:
    """True while a background write is in flight (also for managers older than ``in_flight``)."""
    return manager.in_flight if hasattr(manager, "in_flight") else manager._pending is not None


def busy_loop(arch, n_iterations: int, n_ops: int, manager=None, every: int = 0, state=None) -> dict:
    """Python-bound stepping: ``n_ops`` small array operations per iteration (kernel launches on a GPU).

    With ``manager``: ``poll()`` every iteration, an asynchronous save of ``state`` every ``every``
    iterations (once, before the first iteration, when ``every`` is 0), ``wait()`` at the end.
    Returns the loop time and the iterations and seconds spent while a write was in flight.
    """
    xp = arch.xp
    a, b = xp.ones(64), xp.full(64, 1e-9)
    in_flight_iterations, in_flight_seconds, save_seconds = 0, 0.0, []
    arch.synchronize()
    started = time.perf_counter()
    if manager is not None and every == 0:
        manager.save(0, fields=state)
        save_seconds.append(manager.last_save_seconds)
    for iteration in range(1, n_iterations + 1):
        iteration_started = time.perf_counter()
        busy = manager is not None and in_flight(manager)
        for _ in range(n_ops // 2):
            a = a * 0.999999
            a += b
        if manager is not None:
            manager.poll()
            if every and iteration % every == 0:
                manager.save(iteration, fields=state)
                save_seconds.append(manager.last_save_seconds)
        if busy:
            in_flight_iterations += 1
            in_flight_seconds += time.perf_counter() - iteration_started
    if manager is not None:
        manager.wait()
    arch.synchronize()
    return {"seconds": time.perf_counter() - started, "in_flight_iterations": in_flight_iterations,
            "in_flight_seconds": in_flight_seconds, "save_seconds": save_seconds,
            "write_seconds": manager.last_write_seconds if manager is not None else 0.0,
            "write_cpu_seconds": getattr(manager, "last_write_cpu_seconds", 0.0) if manager is not None else 0.0}


def overhead(comm, arch, options, directory: Path, mib: float, every: int) -> dict:
    from hpcgpu.checkpoint import CheckpointManager

    _, fields = make_fields(comm, arch, mib, 3)
    n_bytes = sum(int(np.prod(f.interior.shape)) * 8 for f in fields.values())
    busy_loop(arch, 50, options.loop_ops)  # warm-up (CuPy kernel compilation, caches)
    plain, checkpointed = [], []
    for repeat in range(options.overhead_repeats):
        comm.barrier()
        plain.append(busy_loop(arch, options.loop_iterations, options.loop_ops))
        manager = CheckpointManager(comm, directory / f"overhead-{mib}-{every}", app="benchmarks.checkpoint_io",
                                    keep=3, asynchronous=True)
        # One untimed save first: one-time costs of a run (host buffers, the layout process's start
        # and its import of h5py) are not the per-save overhead this measures.
        manager.save(0, fields=fields)
        manager.wait()
        comm.barrier()
        checkpointed.append(busy_loop(arch, options.loop_iterations, options.loop_ops, manager, every, fields))
        manager.close()
        comm.barrier()
    plain_seconds = statistics.median(r["seconds"] for r in plain)
    plain_rate = options.loop_iterations / plain_seconds
    rates = [r["in_flight_iterations"] / r["in_flight_seconds"] / plain_rate
             for r in checkpointed if r["in_flight_seconds"] > 0]
    result = {
        "state_mib_per_rank": n_bytes / 2**20, "every": every, "iterations": options.loop_iterations,
        "ops_per_iteration": options.loop_ops, "plain_seconds": [r["seconds"] for r in plain],
        "checkpointed_seconds": [r["seconds"] for r in checkpointed],
        "n_saves": len(checkpointed[0]["save_seconds"]),
        "slowdown": statistics.median(r["seconds"] for r in checkpointed) / plain_seconds - 1.0,
        "in_flight_rate": statistics.median(rates) if rates else float("nan"),
        "in_flight_fraction": statistics.median(r["in_flight_seconds"] / r["seconds"] for r in checkpointed),
        "save_ms": 1e3 * statistics.median(s for r in checkpointed for s in r["save_seconds"]),
        "write_seconds": statistics.median(r["write_seconds"] for r in checkpointed),
        "write_cpu_ms": 1e3 * statistics.median(r["write_cpu_seconds"] for r in checkpointed),
        "step_ms": 1e3 * plain_seconds / options.loop_iterations}
    if comm.rank == 0:
        print(f"overhead: {result['state_mib_per_rank']:.1f} MiB/rank every {every or 'start'}: "
              f"{result['n_saves']} saves, loop {plain_seconds:.3f} s ({result['step_ms']:.3f} ms/iteration) -> "
              f"slowdown {100 * result['slowdown']:+.1f}%, in-flight rate {result['in_flight_rate']:.2f} "
              f"(in flight {100 * result['in_flight_fraction']:.0f}% of the loop), save blocks "
              f"{result['save_ms']:.1f} ms, write {result['write_seconds']:.3f} s (writer thread CPU "
              f"{result['write_cpu_ms']:.1f} ms)", flush=True)
    return result


def parse_overhead(text: str) -> tuple[float, int]:
    mib, _, every = text.partition(":")
    return float(mib), int(every or 0)


def main(argv=None) -> int:
    import hpcgpu

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib-per-rank", type=int, default=64, help="throughput: MiB written per rank [64]")
    parser.add_argument("--repeats", type=int, default=3, help="throughput repeats [3]")
    parser.add_argument("--dir", default="checkpoint-bench", help="where files go (removed at the end)")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--async", dest="asynchronous", action="store_true", help="also time asynchronous saves")
    parser.add_argument("--backend", default="numpy", choices=("auto", "numpy", "cupy"))
    parser.add_argument("--skip-throughput", action="store_true", help="only run the --overhead measurements")
    parser.add_argument("--overhead", type=parse_overhead, action="append", default=[], metavar="MIB:EVERY",
                        help="measure the stepping slowdown with an asynchronous checkpoint of MIB MiB per rank "
                             "every EVERY loop iterations (0: once at the start); repeatable")
    parser.add_argument("--loop-iterations", type=int, default=2000, help="overhead: loop iterations [2000]")
    parser.add_argument("--loop-ops", type=int, default=200,
                        help="overhead: small array operations per iteration (kernel launches on a GPU) [200]")
    parser.add_argument("--overhead-repeats", type=int, default=3, help="overhead: repeats, median reported [3]")
    options = parser.parse_args(argv)

    comm = hpcgpu.Communicator()
    arch = hpcgpu.arch.auto(comm, backend=options.backend)
    directory = Path(options.dir)
    if comm.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    comm.barrier()
    results = {}
    if not options.skip_throughput:
        results["throughput"] = throughput(comm, arch, options, directory)
    results["overhead"] = [overhead(comm, arch, options, directory, mib, every) for mib, every in options.overhead]
    comm.barrier()
    if comm.rank == 0:
        if options.json:
            from hpcgpu.app.environment import git_commit

            Path(options.json).write_text(json.dumps({
                "benchmark": "checkpoint_io", "n_ranks": comm.size, "backend": arch.name,
                "directory": str(directory.resolve()), "git_commit": git_commit(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **results}, indent=2) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

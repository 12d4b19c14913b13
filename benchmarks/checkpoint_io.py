"""Checkpoint write throughput against a plain write of the same bytes, restart time, and the
slowdown that an asynchronous checkpoint inflicts on the stepping thread.

    mpiexec -n 4 python benchmarks/checkpoint_io.py --mib-per-rank 256 --dir /scratch/$USER/bench
    python benchmarks/checkpoint_io.py --mib-per-rank 512 --repeats 7 --phases --dir ./ckbench
    python benchmarks/checkpoint_io.py --mib-per-rank 1024 --json checkpoint_io.json --async
    python benchmarks/checkpoint_io.py --skip-throughput --overhead 1024:0 --overhead 1.5:100

*Throughput* (skipped with ``--skip-throughput``). Two timed operations, on every rank at once:

* *plain*: write ``--mib-per-rank`` MiB to the rank's own new file in 16 MiB ``os.write`` calls,
  then ``fsync`` (the best a program can do on this disk with this many writers);
* *checkpoint*: ``CheckpointManager.save`` of a float64 field with that many MiB per rank (a
  strided interior view, as in every app: tiles, CRC32, rank file, master file with Virtual
  Datasets, fsync, agreement, rename, pruning of the previous checkpoint). One manager for the
  whole run (``keep=1``), as an app holds one.

Method, so that both are measured under the same conditions:

1. *Warm-up*: one plain write and one save, untimed in the table (reported as ``warm-up``): they
   carry one-time costs (importing h5py, first-touching the pack buffers, a cold page cache).
2. ``--repeats`` rounds (at least 5 recommended); the order alternates (plain first in even rounds,
   checkpoint first in odd ones), so drifts of the disk hit both alike.
3. Before *each* timed operation: background work of earlier ones is finished (pruned checkpoints
   deleted), the page cache of every file in ``--dir`` is dropped (``posix_fadvise(DONTNEED)`` after
   they were fsync'd; as root also ``/proc/sys/vm/drop_caches``, unless ``--no-drop-caches``), the
   file system is synced and left idle for ``--settle`` seconds (discards of removed files), and
   (unless ``--cold-page-cache``) as much page cache as the write needs is filled by a scratch file
   that is removed without being written to the disk. The last step matters on virtual machines
   (the development VM's host reclaims free guest memory): there page-cache memory that was not
   in use for a few seconds is slow to take again, and a buffered write of 512 MiB measured
   0.36-0.5 GB/s instead of 1.8-2.2 GB/s right after such a warm-up, whatever else was done
   before (touching anonymous memory does not help). Warming gives *both* writes warm pages: the
   best case for the plain write, which needs page cache for every byte (a save needs only its
   write-behind window).
4. Every timed write ends with ``fsync``; times are the slowest rank's (barrier before and after).
5. *Restart*: ``CheckpointManager.load`` of the newest checkpoint into a fresh field (reads and
   verifies every byte), from a dropped page cache, after each round.

Reported: GB/s of each round; the median and the best of plain, checkpoint and restart. The
headline is the *ratio of the medians*, checkpoint / plain (the issue's target: >= 0.70); the ratio
of the bests is shown next to it. ``--phases`` adds an instrumented save after the rounds (not
timed in the table) with the time of each phase: snapshot, rank-file layout (h5py), packing,
CRC32, ``pwrite``, waiting for the disk (write-behind), fsyncs, master file, publish (rename,
pruning) and agreement, and the split of the plain write into ``write`` and ``fsync``. Pack and
CRC run on the saving thread while ``pwrite`` and the write-behind wait run on a second one, so
the phases overlap and do not add up to the save time. ``--async`` also reports how long an
asynchronous save blocks the caller and how long its write takes.

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
import threading
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


def plain_write(path: Path, n_bytes: int, phases: dict | None = None) -> None:
    block = np.random.default_rng(0).integers(0, 255, size=CHUNK, dtype=np.uint8).tobytes()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        left = n_bytes
        while left > 0:
            left -= os.write(descriptor, block[:min(CHUNK, left)])
        written = time.perf_counter()
        os.fsync(descriptor)
        if phases is not None:
            phases.update(write=written - started, fsync=time.perf_counter() - written)
    finally:
        os.close(descriptor)


def drop_file_cache(directory: Path) -> None:
    """Drop the cached pages of every file under ``directory`` (they are fsync'd: the pages are clean)."""
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                descriptor = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(descriptor)
        except OSError:
            pass  # removed meanwhile (pruning), or not ours


def drop_all_caches() -> bool:
    """``sync; echo 1 > /proc/sys/vm/drop_caches`` where allowed (root); False elsewhere."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("1\n")
        return True
    except OSError:
        return False


def warm_page_cache(directory: Path, n_bytes: int) -> None:
    """Fill ``n_bytes`` of page cache with a scratch file that is removed unwritten (no fsync: its dirty
    pages are discarded), so the next write gets page-cache memory that was in use a moment ago (see
    the module docstring: on the development VM, page-cache memory idle for seconds is slow to reuse)."""
    path = directory / f"warm-page-cache_{os.getpid()}.tmp"
    block = np.ones(CHUNK, dtype=np.uint8)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = n_bytes
        while left > 0:
            left -= os.write(descriptor, block[:min(CHUNK, left)])
    finally:
        os.close(descriptor)
        os.remove(path)


def prepare(comm, directory: Path, n_bytes: int, options) -> None:
    """Same starting conditions for every timed write (see the module docstring)."""
    try:
        from hpcgpu.checkpoint.filesystem import wait_for_removals
        wait_for_removals()
    except ImportError:  # an older checkpoint package (comparisons with earlier commits)
        pass
    comm.barrier()
    drop_file_cache(directory)
    if options.drop_caches and comm.rank == 0:
        drop_all_caches()
    os.sync()  # commit the file system's journal: the unlinks (and their discards) of earlier writes
    # Let the disk finish what earlier writes left behind (discards of removed files, the host's
    # own write-back on a virtual machine) before the page cache is warmed (warmth fades in ~1 s).
    time.sleep(options.settle)
    comm.barrier()
    if not options.cold_page_cache:
        warm_page_cache(directory, n_bytes + 64 * 2**20)
    comm.barrier()


class Phases:
    """Wall time spent in named functions during a save (monkeypatched timers, summed over calls and threads)."""

    def __init__(self):
        self.seconds, self._patched = {}, []

    def wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute, None)
        if original is None:
            return
        lock = threading.Lock()

        def timed_call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

        self._patched.append((owner, attribute, original))
        setattr(owner, attribute, timed_call)

    def __enter__(self):
        from hpcgpu.checkpoint import bulk, filesystem, manager, writer

        self.wrap(manager, "take_snapshot", "snapshot")
        self.wrap(writer, "lay_out_rank_file", "layout (h5py)")
        self.wrap(np, "copyto", "pack")
        self.wrap(bulk, "_checksum_tiles", "crc32")
        self.wrap(bulk, "pwrite_all", "pwrite")
        if hasattr(filesystem, "WriteBehind"):
            self.wrap(filesystem.WriteBehind, "_retire", "wait for disk")
        self.wrap(os, "fsync", "fsync (all files)")
        self.wrap(manager, "write_master_file", "master file")
        self.wrap(manager, "publish_checkpoint", "publish")
        self.wrap(manager.CheckpointManager, "_write_files", "write files (total)")
        return self

    def __exit__(self, *exc):
        for owner, attribute, original in reversed(self._patched):
            setattr(owner, attribute, original)


def timed_save(comm, manager, step, field):
    seconds, _ = timed(comm, lambda: manager.save(step, fields={"h": field}, replicated={"repeat": step}))
    return seconds


def summary(values, reduce):
    return {"median": statistics.median(values), "best": reduce(values)}


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
    plain_path = directory / f"plain_{comm.rank:05d}.bin"
    manager = CheckpointManager(comm, directory / "ckpt", app="benchmarks.checkpoint_io", keep=1)
    step = 0

    def plain():
        prepare(comm, directory, n_bytes, options)
        seconds, _ = timed(comm, lambda: plain_write(plain_path, n_bytes))
        drop_file_cache(directory)
        os.remove(plain_path)
        return seconds

    def checkpoint():
        nonlocal step
        step += 1
        prepare(comm, directory, n_bytes, options)
        return timed_save(comm, manager, step, field)

    def restart():
        prepare(comm, directory, n_bytes, options)
        restored = hpcgpu.Field(grid, arch, halo_width=1, name="h")
        seconds, _ = timed(comm, lambda: manager.load("latest", fields={"h": restored}))
        assert bool((restored.interior == field.interior).all())
        return seconds

    warmup = {"plain_seconds": plain(), "save_seconds": checkpoint()}
    records = []
    for repeat in range(options.repeats):
        record = {"repeat": repeat, "order": "plain first" if repeat % 2 == 0 else "checkpoint first"}
        if repeat % 2 == 0:
            record["plain_seconds"], record["save_seconds"] = plain(), checkpoint()
        else:
            record["save_seconds"], record["plain_seconds"] = checkpoint(), plain()
        record["load_seconds"] = restart()
        for kind in ("plain", "save", "load"):
            record[f"{kind}_gbps"] = total_bytes / record[f"{kind}_seconds"] / 1e9
        record["ratio"] = record["save_gbps"] / record["plain_gbps"]
        if options.asynchronous:
            background = CheckpointManager(comm, directory / "ckpt-async", app="benchmarks.checkpoint_io", keep=1,
                                           asynchronous=True)
            prepare(comm, directory, n_bytes, options)
            blocked, _ = timed(comm, lambda: background.save(repeat, fields={"h": field}))
            total, _ = timed(comm, background.wait)
            record.update(async_blocking_seconds=blocked, async_total_seconds=blocked + total)
            background.close()
        records.append(record)
    stats = {kind: summary([r[f"{kind}_gbps"] for r in records], max) for kind in ("plain", "save", "load")}
    stats["load_seconds"] = summary([r["load_seconds"] for r in records], min)
    headline = stats["save"]["median"] / stats["plain"]["median"]
    best_ratio = stats["save"]["best"] / stats["plain"]["best"]
    phases = measure_phases(comm, manager, field, directory, n_bytes, options, step + 1) if options.phases else None
    manager.close()
    if comm.rank == 0:
        print(f"throughput: {comm.size} ranks, {n_bytes / 2**20:.0f} MiB per rank, {total_bytes / 1e9:.2f} GB "
              f"in total, directory {directory.resolve()}, page cache dropped before each write"
              f"{' (+ drop_caches)' if options.drop_caches else ''}, page cache "
              f"{'cold' if options.cold_page_cache else 'warmed'}")
        print(f"warm-up (untimed in the table): plain {total_bytes / warmup['plain_seconds'] / 1e9:.3f} GB/s, "
              f"checkpoint {total_bytes / warmup['save_seconds'] / 1e9:.3f} GB/s")
        print(f"{'repeat':>6} {'order':>17} {'plain GB/s':>11} {'save GB/s':>10} {'ratio':>6} {'restart s':>10} "
              f"{'load GB/s':>10}")
        for r in records:
            print(f"{r['repeat']:>6} {r['order']:>17} {r['plain_gbps']:>11.3f} {r['save_gbps']:>10.3f} "
                  f"{r['ratio']:>6.2f} {r['load_seconds']:>10.3f} {r['load_gbps']:>10.3f}")
        for which, ratio in (("median", headline), ("best", best_ratio)):
            print(f"{which:>6} {'':>17} {stats['plain'][which]:>11.3f} {stats['save'][which]:>10.3f} {ratio:>6.2f} "
                  f"{stats['load_seconds'][which]:>10.3f} {stats['load'][which]:>10.3f}")
        print(f"checkpoint / plain, ratio of the medians: {headline:.2f} (target >= 0.70; ratio of the bests "
              f"{best_ratio:.2f}; per-round ratios {min(r['ratio'] for r in records):.2f}-"
              f"{max(r['ratio'] for r in records):.2f})")
        if options.asynchronous:
            blocked = statistics.median(r["async_blocking_seconds"] for r in records)
            total = statistics.median(r["async_total_seconds"] for r in records)
            print(f"asynchronous save blocks for {blocked:.3f} s of {total:.3f} s (medians)")
        if phases:
            print_phases(phases, total_bytes)
    return {"bytes_per_rank": n_bytes, "total_bytes": total_bytes, "warmup": warmup, "records": records,
            "median": {kind: stats[kind]["median"] for kind in stats}, "best": {kind: stats[kind]["best"] for kind in stats},
            "ratio_of_medians": headline, "ratio_of_bests": best_ratio, "phases": phases,
            "method": {"drop_caches": options.drop_caches, "cold_page_cache": options.cold_page_cache, "alternating": True}}


def measure_phases(comm, manager, field, directory: Path, n_bytes: int, options, step: int) -> dict:
    """One more plain write and one more save, instrumented (rank 0's view; see the module docstring)."""
    plain_phases = {}
    prepare(comm, directory, n_bytes, options)
    plain_seconds, _ = timed(comm, lambda: plain_write(directory / f"plain_{comm.rank:05d}.bin", n_bytes,
                                                       plain_phases))
    drop_file_cache(directory)
    os.remove(directory / f"plain_{comm.rank:05d}.bin")
    prepare(comm, directory, n_bytes, options)
    with Phases() as phases:
        save_seconds = timed_save(comm, manager, step, field)
    return {"plain_seconds": plain_seconds, "plain": plain_phases, "save_seconds": save_seconds,
            "save": dict(phases.seconds)}


def print_phases(phases: dict, total_bytes: int) -> None:
    print("phases (rank 0; one more instrumented plain write and save; threads overlap):")
    print(f"  plain {phases['plain_seconds']:.3f} s ({total_bytes / phases['plain_seconds'] / 1e9:.3f} GB/s): "
          + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in phases["plain"].items()))
    print(f"  save  {phases['save_seconds']:.3f} s ({total_bytes / phases['save_seconds'] / 1e9:.3f} GB/s): "
          + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in phases["save"].items()))


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
    parser.add_argument("--repeats", type=int, default=5, help="throughput rounds, after one warm-up [5]")
    parser.add_argument("--phases", action="store_true", help="throughput: also time the phases of one save")
    parser.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                        help="throughput: never write /proc/sys/vm/drop_caches (done as root by default)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="throughput: seconds of idle disk before each timed write [1.0]")
    parser.add_argument("--cold-page-cache", action="store_true",
                        help="throughput: do not warm the page cache before each write (see the docstring)")
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

    # Only root may drop the whole page cache; elsewhere posix_fadvise on our own files has to do.
    options.drop_caches = options.drop_caches and os.access("/proc/sys/vm/drop_caches", os.W_OK)
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
            from hpcgpu.provenance import git_commit

            Path(options.json).write_text(json.dumps({
                "benchmark": "checkpoint_io", "n_ranks": comm.size, "backend": arch.name,
                "directory": str(directory.resolve()), "git_commit": git_commit(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **results}, indent=2) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Step-time overhead of asynchronous checkpoints on the real apps.stencil model, measured in one process.

Separate runs of a host-bound model (~1.4 ms per step on a GPU) differ by 10-30% in wall time on a
shared machine, far more than the effect measured. Here ONE model steps through alternating blocks
of ``--block`` steps: plain blocks, and blocks with an asynchronous save every ``--every`` steps (at
steps every/2, 3*every/2, ... of the block, so each write has time to finish inside its own block).
Slow drifts of the machine hit both kinds alike; the overhead is the ratio of the median block times.

    python benchmarks/checkpoint_overhead_app.py --backend cupy              # default SWE run, 1 GPU
    python benchmarks/checkpoint_overhead_app.py --backend numpy --blocks 6  # quick CPU check

Prints one line per block pair and a summary; ``--json FILE`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="auto", help="auto, cupy or numpy [auto]")
    parser.add_argument("--blocks", type=int, default=20, help="blocks in all, half of them with saves [20]")
    parser.add_argument("--block", type=int, default=500, help="steps per block [500]")
    parser.add_argument("--every", type=int, default=100, help="steps between saves in a checkpointed block [100]")
    parser.add_argument("--directory", default=None, help="checkpoint directory [a temporary one]")
    parser.add_argument("--json", default=None, help="write the results here (rank 0)")
    parser.add_argument("app_args", nargs="*", help="extra apps.stencil options after --, e.g. -- --nx 720")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    options = parse_arguments(argv)
    if options.block % options.every or options.every % 2:
        raise SystemExit("--block must be a multiple of --every, and --every even")
    import hpcgpu
    from apps.stencil.app import build_parser, make_model, parse_dims
    from hpcgpu.app.graph import NullTimers
    from hpcgpu.checkpoint import CheckpointManager

    comm = hpcgpu.Communicator()
    app_options = build_parser(comm.rank).parse_args(
        ["--model", "swe", "--backend", options.backend, "--quiet", "--no-plot", *options.app_args])
    app_options.dims = parse_dims(app_options.dims)
    arch = hpcgpu.arch.auto(comm, backend=app_options.backend)
    model = make_model(comm, arch, app_options)
    if hasattr(model, "prepare"):
        model.prepare()
    timers = NullTimers()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(options.directory or scratch) / "overhead"
        manager = CheckpointManager(comm, directory, app="apps.stencil", keep=2, asynchronous=True)
        # One untimed save and some steps first: one-time costs (host buffers, the layout process,
        # kernel compilation) are not the per-save overhead.
        for _ in range(options.every):
            model.step(timers)
        manager.save(model.step_index, **model.checkpoint_state())
        manager.wait()
        plain, saving = [], []
        for block in range(options.blocks):
            with_saves = block % 2 == 1
            comm.barrier()
            arch.synchronize()
            started = time.perf_counter()
            for i in range(1, options.block + 1):
                model.step(timers)
                manager.poll()
                if with_saves and i % options.every == options.every // 2:
                    manager.save(model.step_index, **model.checkpoint_state())
            arch.synchronize()
            seconds = time.perf_counter() - started
            (saving if with_saves else plain).append(seconds)
            manager.wait()   # normally already done: the last save was every/2 steps ago
            if comm.rank == 0 and with_saves:
                print(f"block pair {block // 2 + 1}: plain {plain[-1]:.4f} s, with saves {seconds:.4f} s "
                      f"({100 * (seconds / plain[-1] - 1):+.1f}%)", flush=True)
        manager.close()
    step_ms = 1e3 * statistics.median(plain) / options.block
    result = {"backend": arch.name, "grid": list(model.grid.global_shape), "ranks": comm.size,
              "block_steps": options.block, "every": options.every, "plain_seconds": plain,
              "saving_seconds": saving, "step_ms": step_ms,
              "overhead_median": statistics.median(saving) / statistics.median(plain) - 1,
              "overhead_of_pairs": statistics.median(s / p - 1 for p, s in zip(plain, saving))}
    if comm.rank == 0:
        print(f"{arch.name}, {comm.size} rank(s), grid {result['grid']}, {step_ms:.3f} ms/step, a save every "
              f"{options.every} steps: overhead {100 * result['overhead_median']:+.1f}% (median block times), "
              f"{100 * result['overhead_of_pairs']:+.1f}% (median of block pairs); target <= 5%")
        if options.json:
            Path(options.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

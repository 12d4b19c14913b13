"""What a skipped part of a CUDA graph costs: flagged kernels that return at once vs one IF node.

A graph of ``--steps`` steps, each: one real kernel (a row update over ``--rows`` rows), then ``--kernels``
kernels over the same rows that return at once unless a device flag is set. Variant "flagged": those
kernels as plain graph nodes; variant "if-node": one kernel sets a condition from the flag
(:mod:`hpcgpu.runtime.graph_conditional`) and an IF node holds the kernels. Both replayed with the flag
clear (the common step) and set (every kernel runs: each adds 1 to a counter, checked).

Run on one GPU::

    python3 benchmarks/graph_conditional_probe.py [--kernels 12 --steps 25 --rows 2048000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SOURCE = r"""
extern "C" __global__ void update(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 0.999f + 1.0f;
}
extern "C" __global__ void flagged(const int* flag, int* counter, float* x, int n) {
    if (*flag == 0) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
    if (i == 0) atomicAdd(counter, 1);
}
extern "C" __global__ void set_condition(cudaGraphConditionalHandle handle, const int* flag) {
    cudaGraphSetConditional(handle, *flag != 0);
}
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=12, help="flagged kernels per step [12]")
    parser.add_argument("--steps", type=int, default=25, help="steps per graph [25]")
    parser.add_argument("--rows", type=int, default=2_048_000, help="rows of every kernel's grid [2048000]")
    parser.add_argument("--replays", type=int, default=40, help="timed replays [40]")
    options = parser.parse_args(argv)

    import cupy
    import numpy as np

    from hpcgpu.arch import on_stream
    from hpcgpu.runtime.graph_conditional import CONDITION_SOURCE, GraphConditions, available, load_module

    print(f"driver entry points for conditional nodes: {available()}")
    try:   # CuPy's own compilation (to a cubin)
        module = cupy.RawModule(code=CONDITION_SOURCE + SOURCE, options=("-std=c++17",))
        module.get_function("set_condition")
        print("cupy.RawModule(code=...): compiled and loaded")
    except Exception as error:   # noqa: BLE001
        print(f"cupy.RawModule(code=...) failed ({type(error).__name__}: {str(error)[:200]}); through PTX")
        module = load_module(CONDITION_SOURCE + SOURCE)
    update, flagged, set_condition = (module.get_function(n) for n in ("update", "flagged", "set_condition"))
    rows = options.rows
    grid = ((rows + 255) // 256,)
    x = cupy.zeros(rows, dtype=cupy.float32)
    flag = cupy.zeros(1, dtype=cupy.int32)
    counter = cupy.zeros(1, dtype=cupy.int32)
    stream = cupy.cuda.Stream(non_blocking=True)

    def capture(use_if: bool):
        with on_stream(stream):
            stream.begin_capture()
            try:
                conditions = GraphConditions(stream) if use_if else None
                for _ in range(options.steps):
                    update(grid, (256,), (x, np.int32(rows)))
                    if use_if:
                        handle = conditions.new_handle()   # one per IF node
                        set_condition((1,), (1,), (np.uint64(handle), flag))
                        with conditions.if_node(handle):
                            for _ in range(options.kernels):
                                flagged(grid, (256,), (flag, counter, x, np.int32(rows)))
                    else:
                        for _ in range(options.kernels):
                            flagged(grid, (256,), (flag, counter, x, np.int32(rows)))
            finally:
                graph = stream.end_capture()
        return graph

    rows_out = []
    for name, use_if in (("flagged", False), ("if-node", True), ("flagged", False), ("if-node", True)):
        graph = capture(use_if)
        for flag_value in (0, 1):
            flag.fill(flag_value)
            counter.fill(0)
            with on_stream(stream):
                graph.launch()
            stream.synchronize()
            ran = int(counter.get()[0])
            expected = options.steps * options.kernels * flag_value
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            with on_stream(stream):
                start.record(stream)
                for _ in range(options.replays):
                    graph.launch()
                stop.record(stream)
            stop.synchronize()
            per_step = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / (options.replays * options.steps)
            rows_out.append((name, flag_value, per_step, ran, expected))
    print(f"{'variant':<10} {'flag':>4} {'us/step':>9} {'kernels ran':>12} {'expected':>9}")
    for name, flag_value, per_step, ran, expected in rows_out:
        print(f"{name:<10} {flag_value:>4} {per_step:>9.2f} {ran:>12} {expected:>9}")
    bad = [row for row in rows_out if row[3] != row[4]]
    print("counts " + ("WRONG" if bad else "as expected"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""What activation recomputation (``apps.train --recompute``) saves: memory held between forward and backward.

For each model (``large-mlp``: the benchmark MLP of ``benchmarks/train_ddp.py``, one recomputation
block per Linear; ``residual-mlp``: the split model's residual blocks, one block each) and each
setting of ``recompute``, one training step's forward and backward run on the CPU (NumPy, the
default) or with ``--backend gpu`` on the current GPU (CuPy), and the program reports:

* ``held``: the bytes the model holds for backward after the forward pass
  (:meth:`apps.train.nn.sequential.Sequential.saved_activation_bytes`: saved activations, or with
  recomputation the block inputs);
* ``peak``: the peak of memory allocated during forward + backward above what was allocated before,
  parameters, gradients and the input excluded. CPU: ``tracemalloc``, which NumPy reports its buffers
  to. GPU: the bytes handed out by CuPy's memory pool (a ``cupy.cuda.MemoryHook`` counting each
  allocation's rounded size until it is freed), so cuBLAS workspaces and the pool's cached free
  blocks are not counted;
* ``time``: forward + backward, seconds (the price: one more forward per block): the median of
  ``--repeats`` passes after the measured one, without the memory hook; on the GPU after one untimed
  warm-up step (kernel compilation), synchronised;

and checks that the gradients with and without recomputation are bitwise equal.

Usage::

    python3 benchmarks/train_recompute_memory.py                       # both models, width 1024, depth 8, batch 1024
    python3 benchmarks/train_recompute_memory.py --model residual-mlp --width 512 --hidden 2048 --batch 256
    python3 benchmarks/train_recompute_memory.py --backend gpu --batch 8192           # on one GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.train.kernels.backend import to_numpy  # noqa: E402 - after the path
from apps.train.nn.layers import ForwardContext  # noqa: E402
from apps.train.nn.models import large_mlp  # noqa: E402
from apps.train.nn.params import init_flat_parameters  # noqa: E402
from apps.train.nn.sequential import Sequential  # noqa: E402
from apps.train.parallel.tensor_parallel import MLPSpec, mlp_layers  # noqa: E402


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("large-mlp", "residual-mlp", "both"), default="both")
    parser.add_argument("--inputs", type=int, default=1024, help="input features [1024]")
    parser.add_argument("--classes", type=int, default=1000, help="classes [1000]")
    parser.add_argument("--width", type=int, default=1024, help="hidden width [1024]")
    parser.add_argument("--hidden", type=int, default=None, help="residual-mlp inner width [4 x width]")
    parser.add_argument("--depth", type=int, default=8, help="hidden layers / residual blocks [8]")
    parser.add_argument("--batch", type=int, default=1024, help="samples per step [1024]")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--backend", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: NumPy [default]; gpu: CuPy on the current device")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed forward + backward passes after the measured one; time is their median [5]")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    return parser.parse_args(argv)


def build(kind: str, args, recompute: bool) -> Sequential:
    if kind == "large-mlp":
        return large_mlp(args.inputs, args.classes, args.depth, args.width, recompute=recompute)
    spec = MLPSpec(n_inputs=args.inputs, n_classes=args.classes, width=args.width,
                   hidden=args.hidden or 4 * args.width, depth=args.depth)
    return Sequential(mlp_layers(spec), recompute=recompute)


class _PeakTracker:
    """Peak of bytes allocated inside :meth:`tracking` above the level when it began: ``tracemalloc`` on
    the CPU, a CuPy memory hook on the GPU (each pool allocation's rounded size, from malloc until free)."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.current = self.peak = 0

    @contextlib.contextmanager
    def tracking(self):
        if not self.gpu:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            try:
                yield self
            finally:
                self.peak = tracemalloc.get_traced_memory()[1] - before
                tracemalloc.stop()
            return
        import cupy

        tracker = self

        class Hook(cupy.cuda.MemoryHook):
            name = "recompute_peak"

            def malloc_postprocess(self, **kwargs):
                tracker.current += kwargs["mem_size"]
                tracker.peak = max(tracker.peak, tracker.current)

            def free_postprocess(self, **kwargs):
                tracker.current -= kwargs["mem_size"]

        with Hook():
            yield self


def measure(kind: str, args, recompute: bool, x) -> dict:
    """Forward + backward of a fresh model: the first pass measures memory and gradients (as NumPy, under
    ``"grads"``), then ``args.repeats`` more are timed without the memory hook (``"seconds"``: their median)."""
    gpu = args.backend == "gpu"
    if gpu:
        import cupy as xp
    else:
        xp = np
    model = build(kind, args, recompute)
    params = xp.asarray(np.asarray(init_flat_parameters(model.layout, seed=0), dtype=args.dtype))
    grads = xp.zeros_like(params)
    model.bind(params, grads)
    context = ForwardContext(training=True, sample_index=np.arange(x.shape[0]))
    grad_out = xp.full((x.shape[0], args.classes), 1.0 / x.size, dtype=args.dtype)
    synchronize = xp.cuda.Device().synchronize if gpu else (lambda: None)
    synchronize()
    tracker = _PeakTracker(gpu)
    with tracker.tracking():
        model.forward(x, context)
        held = model.saved_activation_bytes()
        model.backward(grad_out, need_input_grad=False)
        synchronize()
    measured_grads = to_numpy(grads)
    samples = []
    for _ in range(max(1, args.repeats)):
        started = time.perf_counter()
        model.forward(x, context)
        model.backward(grad_out, need_input_grad=False)
        synchronize()
        samples.append(time.perf_counter() - started)
    return {"model": kind, "recompute": recompute, "params": int(model.n_params), "held_bytes": held,
            "peak_bytes": tracker.peak, "seconds": statistics.median(samples), "grads": measured_grads}


def main(argv=None) -> int:
    args = parse_arguments(argv)
    kinds = ("large-mlp", "residual-mlp") if args.model == "both" else (args.model,)
    x = np.random.default_rng(1).standard_normal((args.batch, args.inputs)).astype(args.dtype)
    if args.backend == "gpu":
        import cupy

        x = cupy.asarray(x)
    rows = []
    for kind in kinds:
        if args.backend == "gpu":   # compile the kernels and fill the memory pool before the measured passes
            for recompute in (False, True):
                measure(kind, args, recompute, x)
        pair = [measure(kind, args, recompute, x) for recompute in (False, True)]
        equal = bool(np.array_equal(pair[0]["grads"], pair[1]["grads"]))
        for row in pair:
            row.pop("grads")
            row["grads_equal"] = equal
        rows += pair
    hidden = args.hidden or 4 * args.width
    print(f"recomputation memory, {args.backend.upper()}, {args.dtype}, batch {args.batch}, width {args.width}, depth {args.depth}"
          f" (residual-mlp hidden {hidden}), {args.inputs} inputs, {args.classes} classes")
    print(f"{'model':14s} {'recompute':>9s} {'params':>11s} {'held MB':>9s} {'peak MB':>9s} {'time ms':>9s}  gradients")
    for row in rows:
        print(f"{row['model']:14s} {str(row['recompute']):>9s} {row['params']:11,d} {row['held_bytes'] / 1e6:9.1f} "
              f"{row['peak_bytes'] / 1e6:9.1f} {row['seconds'] * 1e3:9.1f}  "
              f"{'bitwise equal' if row['grads_equal'] else 'DIFFERENT'}")
    for kind in kinds:
        without, with_ = (row for row in rows if row["model"] == kind)
        print(f"{kind}: recomputation holds {with_['held_bytes'] / without['held_bytes']:.2f}x the activations "
              f"({without['held_bytes'] / 1e6:.1f} -> {with_['held_bytes'] / 1e6:.1f} MB), peak "
              f"{with_['peak_bytes'] / without['peak_bytes']:.2f}x, time {with_['seconds'] / without['seconds']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"arguments": vars(args), "rows": rows}, indent=1))
    return 0 if all(row["grads_equal"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What activation recomputation (``apps.train --recompute``) saves: memory held between forward and backward.

For each model (``large-mlp``: the benchmark MLP of ``benchmarks/train_ddp.py``, one recomputation
block per Linear; ``residual-mlp``: the split model's residual blocks, one block each) and each
setting of ``recompute``, one training step's forward and backward run on the CPU (NumPy) and the
program reports:

* ``held``: the bytes the model holds for backward after the forward pass
  (:meth:`apps.train.sequential.Sequential.saved_activation_bytes`: saved activations, or with
  recomputation the block inputs; the same count on a GPU, where these arrays live in device memory);
* ``peak``: the peak of memory allocated during forward + backward above what was allocated before
  (``tracemalloc``, which NumPy reports its buffers to), parameters and gradients excluded;
* ``time``: forward + backward, seconds (the price: one more forward per block);

and checks that the gradients with and without recomputation are bitwise equal.

Usage::

    python3 benchmarks/train_recompute_memory.py                       # both models, width 1024, depth 8, batch 1024
    python3 benchmarks/train_recompute_memory.py --model residual-mlp --width 512 --hidden 2048 --batch 256
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.train.layers import ForwardContext  # noqa: E402 - after the path
from apps.train.models import large_mlp  # noqa: E402
from apps.train.params import init_flat_parameters  # noqa: E402
from apps.train.sequential import Sequential  # noqa: E402
from apps.train.tensor_parallel import MLPSpec, mlp_layers  # noqa: E402


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
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    return parser.parse_args(argv)


def build(kind: str, args, recompute: bool) -> Sequential:
    if kind == "large-mlp":
        return large_mlp(args.inputs, args.classes, args.depth, args.width, recompute=recompute)
    spec = MLPSpec(n_inputs=args.inputs, n_classes=args.classes, width=args.width,
                   hidden=args.hidden or 4 * args.width, depth=args.depth)
    return Sequential(mlp_layers(spec), recompute=recompute)


def measure(kind: str, args, recompute: bool, x: np.ndarray) -> dict:
    """One forward + backward of a fresh model; returns the row (gradients under ``"grads"``)."""
    model = build(kind, args, recompute)
    params = np.asarray(init_flat_parameters(model.layout, seed=0), dtype=args.dtype)
    grads = np.zeros_like(params)
    model.bind(params, grads)
    context = ForwardContext(training=True, sample_index=np.arange(x.shape[0]))
    grad_out = np.full((x.shape[0], args.classes), 1.0 / x.size, dtype=args.dtype)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    model.forward(x, context)
    held = model.saved_activation_bytes()
    model.backward(grad_out, need_input_grad=False)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return {"model": kind, "recompute": recompute, "params": int(model.n_params), "held_bytes": held,
            "peak_bytes": peak, "seconds": seconds, "grads": grads}


def main(argv=None) -> int:
    args = parse_arguments(argv)
    kinds = ("large-mlp", "residual-mlp") if args.model == "both" else (args.model,)
    x = np.random.default_rng(1).standard_normal((args.batch, args.inputs)).astype(args.dtype)
    rows = []
    for kind in kinds:
        pair = [measure(kind, args, recompute, x) for recompute in (False, True)]
        equal = bool(np.array_equal(pair[0]["grads"], pair[1]["grads"]))
        for row in pair:
            row.pop("grads")
            row["grads_equal"] = equal
        rows += pair
    hidden = args.hidden or 4 * args.width
    print(f"recomputation memory, CPU, {args.dtype}, batch {args.batch}, width {args.width}, depth {args.depth}"
          f" (residual-mlp hidden {hidden}), {args.inputs} inputs, {args.classes} classes")
    print(f"{'model':14s} {'recompute':>9s} {'params':>11s} {'held MB':>9s} {'peak MB':>9s} {'time s':>8s}  gradients")
    for row in rows:
        print(f"{row['model']:14s} {str(row['recompute']):>9s} {row['params']:11,d} {row['held_bytes'] / 1e6:9.1f} "
              f"{row['peak_bytes'] / 1e6:9.1f} {row['seconds']:8.2f}  "
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

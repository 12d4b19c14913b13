"""Where does a training step go? Per-op GPU times of apps.train next to the same PyTorch ops.

For the benchmark MLP of ``benchmarks/train_ddp.py`` (batch 2048, width 4096, 1024 inputs, 1000
classes, depth 8: 143M parameters) and each precision (fp32, fp16), this times with CUDA events:

* one hidden layer's forward and backward: Linear 4096 -> 4096 (and its weight-gradient GEMM alone,
  accumulating in place vs. the former temporary + add), LayerNorm, GELU(tanh), and LayerNorm with
  GELU fused into its kernels (as the model runs them) -- ours and, as "before", the former CuPy
  array expressions;
* the loss (softmax cross-entropy), the whole-model forward and forward + backward;
* the optimiser side over the whole 143M buffer: zeroing the gradients, the fp16 -> fp32 unscale,
  the sum of squares of the gradient norm (ours vs. the former ``float(g @ g)``), AdamW, the fp16
  copy refresh;
* one full ``train_step`` (one GPU, no communication);

and the PyTorch equivalents at the same shapes and dtypes (``nn.Linear``, ``F.layer_norm``,
``F.gelu(approximate="tanh")``, ``F.cross_entropy``, fused ``AdamW``, the GradScaler's
``_amp_foreach_non_finite_check_and_unscale_``, the whole model with autocast + GradScaler as in
``train_ddp.py``). It prints one compact table (ms per call, ours / torch) plus the settings that
decide GEMM speed (PyTorch's TF32 default, CuPy's compute types, CuPy's reduction accelerators).

Run on one GPU: ``python3 benchmarks/train_profile.py`` (about 30 s). ``--no-torch`` skips PyTorch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--inputs", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per op [10]")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--no-torch", action="store_true")
    return parser.parse_args(argv)


def cupy_ms(fn, repeats, warmup=2):
    """GPU milliseconds per call of ``fn`` (CUDA events on the current CuPy stream)."""
    import cupy

    for _ in range(warmup):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats


def torch_ms(fn, repeats, warmup=2):
    import torch

    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / repeats


# ------------------------------------------------------------------ "before" --
# The CuPy array expressions apps.train used before the fused kernels (for the record).

def gelu_forward_expressions(xp, x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return (0.5 * x * (1.0 + xp.tanh(inner))).astype(x.dtype, copy=False)


def gelu_backward_expressions(xp, x, grad_out):
    t = xp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
    d = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    return (grad_out * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d)).astype(grad_out.dtype, copy=False)


def layer_norm_expressions(xp, x, weight, bias, grad_out, grad_weight, grad_bias):
    work = x.astype(xp.float32) if x.dtype == xp.float16 else x
    mean = work.mean(axis=-1, keepdims=True)
    centred = work - mean
    inverse_std = 1.0 / xp.sqrt((centred * centred).mean(axis=-1, keepdims=True) + 1e-5)
    normalised = centred * inverse_std
    y = (normalised * weight.astype(work.dtype) + bias.astype(work.dtype)).astype(x.dtype)
    if grad_out is None:
        return y
    g = grad_out.astype(normalised.dtype)
    grad_weight += (g * normalised).sum(axis=0).astype(grad_weight.dtype)
    grad_bias += g.sum(axis=0).astype(grad_bias.dtype)
    gn = g * weight.astype(normalised.dtype)
    return (inverse_std * (gn - gn.mean(-1, keepdims=True)
                           - normalised * (gn * normalised).mean(-1, keepdims=True))).astype(x.dtype)


# ---------------------------------------------------------------------- ours --

def profile_ours(options, precision):
    import cupy

    from apps.train.kernels.gemm import gemm
    from apps.train.nn.layers import GELU, ForwardContext, LayerNorm, Linear
    from apps.train.nn.loss import softmax_cross_entropy
    from apps.train.nn.models import large_mlp
    from apps.train.training.optim import grad_sum_of_squares
    from apps.train.nn.params import init_flat_parameters
    from apps.train.nn.sequential import Sequential
    from apps.train.training.trainer import TrainConfig, Trainer, init_train_state, train_step

    dtype = cupy.float16 if precision == "fp16" else cupy.float32
    batch, width, repeats = options.batch, options.width, options.repeats
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((batch, width), dtype=cupy.float32).astype(dtype)
    grad = (1e-3 * rng.standard_normal((batch, width), dtype=cupy.float32)).astype(dtype)
    ctx = ForwardContext(training=True)
    rows = {}

    block = Sequential([LayerNorm(width), GELU(), Linear(width, width)])
    params = cupy.asarray(init_flat_parameters(block.layout, 0, "float32")).astype(dtype)
    block.bind(params, cupy.zeros_like(params))
    norm, gelu, linear = block.layers
    # the block fuses LayerNorm -> GELU; the single-op rows time the layers on their own
    norm.activation, gelu.fused_into = None, None
    rows["linear fwd"] = cupy_ms(lambda: linear.forward(x, ctx), repeats)
    linear.defer_bias = True     # as in the model, where a LayerNorm/GELU adds the bias
    rows["  linear fwd, bias folded"] = cupy_ms(lambda: linear.forward(x, ctx), repeats)
    linear.defer_bias = False
    rows["linear bwd"] = cupy_ms(lambda: linear.backward(grad), repeats)
    weight_grad = linear.grads["weight"]
    rows["  wgrad gemm beta=1"] = cupy_ms(
        lambda: gemm(grad, x, weight_grad, transpose_a=True, accumulate=True), repeats)

    def wgrad_before():
        weight_grad[...] += grad.T @ x
    rows["  wgrad tmp+add (before)"] = cupy_ms(wgrad_before, repeats)
    rows["layernorm fwd"] = cupy_ms(lambda: norm.forward(x, ctx), repeats)
    rows["layernorm bwd"] = cupy_ms(lambda: norm.backward(grad), repeats)
    from apps.train.kernels.layernorm import layer_norm_forward
    rows["  layernorm fwd +linear bias"] = cupy_ms(lambda: layer_norm_forward(
        x, norm.params["weight"], norm.params["bias"], 1e-5, linear.params["bias"]), repeats)
    w, b = norm.params["weight"], norm.params["bias"]
    gw, gb = norm.grads["weight"], norm.grads["bias"]
    rows["  layernorm fwd (before)"] = cupy_ms(
        lambda: layer_norm_expressions(cupy, x, w, b, None, gw, gb), repeats)
    rows["  layernorm fwd+bwd (before)"] = cupy_ms(
        lambda: layer_norm_expressions(cupy, x, w, b, grad, gw, gb), repeats)
    rows["gelu fwd"] = cupy_ms(lambda: gelu.forward(x, ctx), repeats)
    rows["gelu bwd"] = cupy_ms(lambda: gelu.backward(grad), repeats)
    norm.activation = "gelu"         # as in the model
    rows["layernorm+gelu fwd"] = cupy_ms(lambda: norm.forward(x, ctx), repeats)
    rows["layernorm+gelu bwd"] = cupy_ms(lambda: norm.backward(grad), repeats)
    rows["  gelu fwd (before)"] = cupy_ms(lambda: gelu_forward_expressions(cupy, x), repeats)
    rows["  gelu bwd (before)"] = cupy_ms(lambda: gelu_backward_expressions(cupy, x, grad), repeats)
    logits = rng.standard_normal((batch, options.classes), dtype=cupy.float32).astype(dtype)
    labels = cupy.asarray(np.random.default_rng(0).integers(0, options.classes, batch))
    rows["softmax xent fwd+bwd"] = cupy_ms(
        lambda: softmax_cross_entropy(logits, labels, batch, grad_scale=1024.0), repeats)

    model = large_mlp(options.inputs, options.classes, options.depth, width)
    config = TrainConfig(optimizer="adamw", lr=1e-4, weight_decay=0.01, precision=precision,
                         global_batch_size=batch, init_loss_scale=2.0**12, seed=0)
    trainer = Trainer(model, config)
    state = init_train_state(trainer, cupy)
    data = rng.standard_normal((batch, options.inputs), dtype=cupy.float32)
    index = cupy.arange(batch, dtype=cupy.int64)
    precision_policy = state.precision
    data_c = data.astype(dtype)
    grad_logits = (1e-4 * rng.standard_normal((batch, options.classes), dtype=cupy.float32)).astype(dtype)

    def forward_backward():
        model.forward(data_c, ctx)
        model.backward(grad_logits, need_input_grad=False)
    rows["model fwd"] = cupy_ms(lambda: [model.forward(data_c, ctx)] + [layer.release() for layer in model.layers], repeats)
    rows["model fwd+bwd"] = cupy_ms(forward_backward, repeats)
    cupy.cuda.get_current_stream().synchronize()
    started = time.perf_counter()
    forward_backward()
    rows["  host enqueue fwd+bwd"] = 1e3 * (time.perf_counter() - started)   # host time, not GPU
    cupy.cuda.get_current_stream().synchronize()
    rows["zero grads"] = cupy_ms(lambda: precision_policy.compute_grads.fill(0), repeats)
    if precision == "fp16":
        # the fused path: sum of squares over the fp16 gradients + one AdamW pass that unscales
        # and writes the fp16 copy (the three separate passes are the "before" rows)
        compute_grads = precision_policy.compute_grads
        compute_grads[...] = 1.0
        rows["sum of squares fp16 (sync)"] = cupy_ms(lambda: grad_sum_of_squares(compute_grads), repeats)
        rows["adamw fused mixed step"] = cupy_ms(
            lambda: trainer.optimizer.step_mixed(precision_policy.master_params, compute_grads,
                                                 state.optimizer_state, 1e-6, 2.0**-12,
                                                 precision_policy.compute_params), repeats)
        rows["  unscale fp16->fp32 (before)"] = cupy_ms(precision_policy.grads_to_master, repeats)
        rows["  refresh fp16 copy (before)"] = cupy_ms(precision_policy.refresh_compute_params, repeats)
    master_grads = precision_policy.master_grads
    master_grads[...] = 1e-3
    rows["sum of squares (sync)"] = cupy_ms(lambda: grad_sum_of_squares(master_grads), repeats)
    rows["  sum of squares (before)"] = cupy_ms(lambda: float(master_grads @ master_grads), 3, 1)
    rows["adamw step"] = cupy_ms(
        lambda: trainer.optimizer.step(precision_policy.master_params, master_grads,
                                       state.optimizer_state, 1e-6), repeats)
    rows["train_step (1 GPU)"] = cupy_ms(
        lambda: train_step(trainer, state, data, cupy.asarray(labels), index), repeats)
    return rows, model.n_params


# --------------------------------------------------------------------- torch --

def profile_torch(options, precision):
    import torch
    import torch.nn.functional as F
    from torch import nn

    device = torch.device("cuda", 0)
    dtype = torch.float16 if precision == "fp16" else torch.float32
    batch, width, repeats = options.batch, options.width, options.repeats
    torch.manual_seed(0)
    x = torch.randn(batch, width, device=device, dtype=dtype, requires_grad=True)
    grad = 1e-3 * torch.randn(batch, width, device=device, dtype=dtype)
    rows = {}
    linear = nn.Linear(width, width, device=device, dtype=dtype)
    norm = nn.LayerNorm(width, device=device, dtype=dtype)
    with torch.no_grad():
        rows["linear fwd"] = torch_ms(lambda: linear(x), repeats)
        rows["layernorm fwd"] = torch_ms(lambda: norm(x), repeats)
        rows["gelu fwd"] = torch_ms(lambda: F.gelu(x, approximate="tanh"), repeats)
    y = linear(x)
    rows["linear bwd"] = torch_ms(lambda: torch.autograd.grad(
        y, [x, linear.weight, linear.bias], grad, retain_graph=True), repeats)
    weight_grad = torch.zeros_like(linear.weight)
    rows["  wgrad gemm beta=1"] = torch_ms(lambda: weight_grad.addmm_(grad.t(), x.detach()), repeats)
    y = norm(x)
    rows["layernorm bwd"] = torch_ms(lambda: torch.autograd.grad(
        y, [x, norm.weight, norm.bias], grad, retain_graph=True), repeats)
    y = F.gelu(x, approximate="tanh")
    rows["gelu bwd"] = torch_ms(lambda: torch.autograd.grad(y, [x], grad, retain_graph=True), repeats)
    with torch.no_grad():
        rows["layernorm+gelu fwd"] = torch_ms(lambda: F.gelu(norm(x), approximate="tanh"), repeats)
    y = F.gelu(norm(x), approximate="tanh")
    rows["layernorm+gelu bwd"] = torch_ms(lambda: torch.autograd.grad(
        y, [x, norm.weight, norm.bias], grad, retain_graph=True), repeats)
    logits = torch.randn(batch, options.classes, device=device, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, options.classes, (batch,), device=device)

    def cross_entropy():
        loss = F.cross_entropy(logits.float(), labels)
        torch.autograd.grad(loss, [logits])
    rows["softmax xent fwd+bwd"] = torch_ms(cross_entropy, repeats)
    layers = [nn.Linear(options.inputs, width)]
    for _ in range(options.depth):
        layers += [nn.LayerNorm(width), nn.GELU(approximate="tanh"), nn.Linear(width, width)]
    layers += [nn.GELU(approximate="tanh"), nn.Linear(width, options.classes)]
    model = nn.Sequential(*layers).to(device)                   # fp32 weights, as in train_ddp.py
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    mixed = precision == "fp16"
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12, enabled=mixed)
    data = torch.randn(batch, options.inputs, device=device)

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=mixed):
            model(data)

    def forward_backward():
        with torch.autocast("cuda", dtype=torch.float16, enabled=mixed):
            loss = F.cross_entropy(model(data), labels)
        scaler.scale(loss).backward()

    def step():   # as train_ddp.py without DDP: the loss is read on the host every step
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=mixed):
            loss = F.cross_entropy(model(data), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()
    rows["model fwd"] = torch_ms(forward, repeats)
    rows["model fwd+bwd"] = torch_ms(forward_backward, repeats)
    rows["zero grads"] = torch_ms(lambda: [p.grad.zero_() for p in model.parameters()], repeats)
    grads = [p.grad for p in model.parameters()]
    if mixed:
        found_inf = torch.zeros(1, device=device)
        inv_scale = torch.full((1,), 1 / 4096.0, device=device)
        try:
            rows["unscale fp16->fp32"] = torch_ms(
                lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale),
                repeats)
        except Exception as exc:   # noqa: BLE001 - private op; report and go on
            print(f"  (torch unscale not timed: {exc})")
    rows["sum of squares (sync)"] = torch_ms(
        lambda: float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))),
        repeats)
    rows["adamw step"] = torch_ms(optimizer.step, repeats)
    rows["train_step (1 GPU)"] = torch_ms(step, repeats)
    return rows


# -------------------------------------------------------------------- driver --

def settings_report():
    lines = []
    try:
        import cupy

        lines.append(f"cupy {cupy.__version__}, device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
        try:
            from cupy._core import _accelerator, _routines_linalg

            names = {1: "DEFAULT", 2: "PEDANTIC", 3: "FP16", 4: "FP32", 5: "FP64", 6: "BF16", 7: "TF32"}
            types = {d: names.get(_routines_linalg.get_compute_type(np.dtype(d)), "?") for d in ("float16", "float32")}
            lines.append(f"cupy matmul compute types {types} (CUPY_TF32={os.environ.get('CUPY_TF32', 'unset')}); "
                         f"reduction accelerators {_accelerator.get_reduction_accelerators()} "
                         f"(CUPY_ACCELERATORS={os.environ.get('CUPY_ACCELERATORS', 'unset')})")
        except Exception as exc:   # noqa: BLE001
            lines.append(f"cupy settings unavailable: {exc}")
    except ImportError:
        lines.append("cupy missing")
    try:
        import torch

        lines.append(f"torch {torch.__version__}: matmul.allow_tf32 default = {torch.backends.cuda.matmul.allow_tf32}, "
                     f"float32_matmul_precision = {torch.get_float32_matmul_precision()!r}")
    except ImportError:
        lines.append("torch missing")
    return lines


def release_memory():
    """Return cached GPU memory of both frameworks between the parts."""
    import gc

    gc.collect()
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


def main(argv=None):
    options = parse_arguments(argv)
    for line in settings_report():    # read the defaults before anything changes them
        print(line)
    results = {}
    n_params = None
    for precision in options.precisions.split(","):
        try:
            ours, n_params = profile_ours(options, precision)
        except Exception as exc:   # noqa: BLE001 - keep going, say why
            import traceback

            traceback.print_exc(limit=4)
            ours = {"FAILED": float("nan")}
            print(f"ours {precision} failed: {type(exc).__name__}: {exc}")
        theirs = {}
        if not options.no_torch:
            try:
                theirs = profile_torch(options, precision)
            except Exception as exc:   # noqa: BLE001
                print(f"torch {precision} failed: {type(exc).__name__}: {exc}")
        results[precision] = (ours, theirs)
        release_memory()
    print(f"\nper-op GPU time, ms per call (batch {options.batch}, width {options.width}, "
          f"{n_params} parameters; 'before' = the former CuPy expressions; lines starting "
          f"with two spaces are sub-measurements)")
    precisions = list(results)
    header = f"{'op':<30}" + "".join(f" {p + ' ours':>10} {p + ' torch':>10} {'ratio':>6}" for p in precisions)
    print(header)
    print("-" * len(header))
    names = []
    for ours, theirs in results.values():
        names += [n for n in list(ours) + list(theirs) if n not in names]
    for name in names:
        line = f"{name:<30}"
        for precision in precisions:
            ours, theirs = results[precision]
            a, b = ours.get(name), theirs.get(name)
            ratio = f"{a / b:6.2f}" if a is not None and b else "     -"
            line += (f" {a:10.3f}" if a is not None else f" {'-':>10}") + \
                    (f" {b:10.3f}" if b is not None else f" {'-':>10}") + f" {ratio}"
        print(line)
    gemm_flops = 2.0 * options.batch * options.width * options.width
    for precision in precisions:
        ours, theirs = results[precision]
        if ours.get("linear fwd"):
            print(f"{precision}: linear fwd {gemm_flops / ours['linear fwd'] / 1e9:.0f} TFLOP/s ours"
                  + (f", {gemm_flops / theirs['linear fwd'] / 1e9:.0f} TFLOP/s torch" if theirs.get("linear fwd") else ""))
        step = ours.get("train_step (1 GPU)")
        if step:
            print(f"{precision}: ours {options.batch / step * 1e3:,.0f} samples/s"
                  + (f", torch {options.batch / theirs['train_step (1 GPU)'] * 1e3:,.0f} samples/s"
                     if theirs.get("train_step (1 GPU)") else "") + " (1 GPU, no DDP)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

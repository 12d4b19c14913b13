"""Session 10, device call 4: is there headroom in the fp32 GEMM algorithm choice?

The train benchmark's 143M MLP spends most of its fp32 step in three SGEMM shapes per hidden layer
(batch 16384, width 4096): forward x @ W^T, input gradient dy @ W, weight gradient dy^T @ x (accumulated).
Times each with hpcgpu's gemm() (cuBLAS gemmEx, CUBLAS_GEMM_DEFAULT, IEEE fp32), PyTorch's torch.mm
(TF32 off, its default) and PyTorch with TunableOp (tries cuBLAS / cuBLASLt algorithms, keeps the
fastest). If a tuned algorithm is clearly faster than cuBLAS's heuristic choice, autotuning is a lever
for the fp32 throughput target. One H200.
"""
import time

import cupy
import torch

from apps.train.gemm import gemm
from benchmarks.train_profile import cupy_ms, torch_ms

M, N = 16384, 4096
FLOPS = 2.0 * M * N * N
REPS = 40


def time_cupy(fn):
    return cupy_ms(fn, REPS, warmup=3)


def time_torch(fn):
    return torch_ms(fn, REPS, warmup=3)


rng = cupy.random.default_rng(0)
x = rng.standard_normal((M, N), dtype=cupy.float32)
w = rng.standard_normal((N, N), dtype=cupy.float32) * 0.01
dy = rng.standard_normal((M, N), dtype=cupy.float32)
y = cupy.empty((M, N), cupy.float32)
dw = cupy.zeros((N, N), cupy.float32)
ours = {
    "fwd x@W^T": time_cupy(lambda: gemm(x, w, y, transpose_b=True)),
    "dgrad dy@W": time_cupy(lambda: gemm(dy, w, y)),
    "wgrad dW+=dy^T@x": time_cupy(lambda: gemm(dy, x, dw, transpose_a=True, accumulate=True)),
}
torch.backends.cuda.matmul.allow_tf32 = False
tx, tw, tdy = (torch.as_tensor(a, device="cuda") for a in (x, w, dy))
tdw = torch.zeros((N, N), device="cuda")
torch_ops = {
    "fwd x@W^T": lambda: torch.mm(tx, tw.t()),
    "dgrad dy@W": lambda: torch.mm(tdy, tw),
    "wgrad dW+=dy^T@x": lambda: tdw.addmm_(tdy.t(), tx),
}
plain = {name: time_torch(fn) for name, fn in torch_ops.items()}
tuned = {}
try:
    torch.cuda.tunable.enable(True)
    torch.cuda.tunable.tuning_enable(True)
    torch.cuda.tunable.set_max_tuning_duration(3000)
    torch.cuda.tunable.set_filename("/tmp/tunableop_results.csv")
    for name, fn in torch_ops.items():
        t0 = time.time(); fn(); torch.cuda.synchronize()
        print(f"tuned {name} in {time.time() - t0:.1f} s", flush=True)
        tuned[name] = time_torch(fn)
    for line in torch.cuda.tunable.get_results():
        print("tunableop:", line)
except Exception as error:   # report, do not hide
    print("TunableOp failed:", repr(error))
print(f"\n{'shape':20} {'hpcgpu ms':>10} {'TFLOP/s':>8} {'torch ms':>9} {'tuned ms':>9} {'tuned TFLOP/s':>13}")
for name in ours:
    t = tuned.get(name, float("nan"))
    print(f"{name:20} {ours[name]:10.3f} {FLOPS / ours[name] / 1e9:8.1f} {plain[name]:9.3f} {t:9.3f} "
          f"{FLOPS / t / 1e9:13.1f}")
print("clocks:", cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrClockRate, 0) / 1e3, "MHz max")

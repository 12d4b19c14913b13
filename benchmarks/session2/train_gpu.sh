#!/usr/bin/env bash
# Session-2 GPU batch for apps.train (issue 6, throughput against PyTorch DDP): the new kernels'
# GPU parity tests, the existing train GPU tests, the per-op profile (ours vs torch), then
# benchmarks/train_ddp.py on 1 and 2 GPUs. Short table last. About 4 minutes on 2 H200.
set -u; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HPCGPU_GIT_COMMIT=$(cat .hpcgpu-commit 2>/dev/null || echo unknown) TRAIN_DDP_TRACEBACK=1
LOG=${LOG:-/tmp/train_gpu}; mkdir -p "$LOG"
T0=$SECONDS
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)

echo "== 1. new kernel parity tests (GELU, LayerNorm, GEMM, sum of squares, Linear) [gpu]"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/apps/train/test_train_layer_kernels.py -m gpu \
  > "$LOG/pytest_kernels.txt" 2>&1; echo "rc=$? [$((SECONDS-T0)) s]"
tail -3 "$LOG/pytest_kernels.txt"
grep -E "^(FAILED|ERROR)|Error|error:|max error" "$LOG/pytest_kernels.txt" | head -12

echo "== 2. existing train GPU tests (step parity, NCCL DDP, ZeRO-1, fp16, app)"
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/apps/train/test_train_gpu.py \
  tests/apps/train/test_train_distributed_gpu.py -m gpu > "$LOG/pytest_train.txt" 2>&1; echo "rc=$? [$((SECONDS-T0)) s]"
tail -3 "$LOG/pytest_train.txt"
grep -E "^(FAILED|ERROR)|Error|assert" "$LOG/pytest_train.txt" | head -12

echo "== 3. per-op profile, 1 GPU (ms per call; ours vs torch)"
timeout 150 python3 benchmarks/train_profile.py > "$LOG/profile.txt" 2>&1; echo "rc=$? [$((SECONDS-T0)) s]"
grep -vE "^\s*$" "$LOG/profile.txt" | tail -48

for n in 1 2; do
  [ "$n" -le "$NGPU" ] || { echo "skip $n GPUs (found $NGPU)"; continue; }
  echo "== 4.$n train_ddp.py on $n GPU(s)"
  timeout 120 mpirun -np $n --bind-to none python3 benchmarks/train_ddp.py --json "$LOG/train_${n}gpu.json" \
    > "$LOG/train_${n}gpu.txt" 2>&1; echo "rc=$? [$((SECONDS-T0)) s]"
  tail -9 "$LOG/train_${n}gpu.txt"
  grep -E "Traceback|Error" "$LOG/train_${n}gpu.txt" | head -4
done
[ -n "${OUT:-}" ] && cp "$LOG"/*.json "$LOG"/*.txt "$OUT"/ 2>/dev/null

echo "== summary (samples/s, global; target hpcgpu/torch >= 1.0, scaling >= 95%) [$((SECONDS-T0)) s]"
python3 - "$LOG" <<'PY'
import json, os, sys
log = sys.argv[1]
runs = {}
for n in (1, 2):
    try:
        for r in json.load(open(os.path.join(log, f"train_{n}gpu.json")))["results"]:
            runs[(r["framework"], r["precision"], n)] = r
    except Exception as exc:
        print(f"train_{n}gpu.json: {exc}")
print(f"{'prec':<5} {'GPUs':>4} {'hpcgpu':>10} {'torch':>10} {'ratio':>6} {'hpcgpu step ms':>14} {'scaling':>8} {'hidden':>7}")
for precision in ("fp32", "fp16"):
    for n in (1, 2):
        ours, theirs = runs.get(("hpcgpu", precision, n), {}), runs.get(("torch", precision, n), {})
        a, b = ours.get("samples_per_second"), theirs.get("samples_per_second")
        one = runs.get(("hpcgpu", precision, 1), {}).get("samples_per_second")
        scaling = f"{a / (n * one):.1%}" if a and one and n > 1 else "-"
        hidden = ours.get("hidden_fraction")
        print(f"{precision:<5} {n:>4} {a or 0:>10,.0f} {b or 0:>10,.0f} {(a / b if a and b else 0):>6.2f} "
              f"{ours.get('step_ms', 0):>14.2f} {scaling:>8} {'-' if hidden is None else f'{hidden:.0%}':>7}"
              + (f"  ERROR {ours.get('error') or theirs.get('error')}" if ours.get("error") or theirs.get("error") else ""))
PY

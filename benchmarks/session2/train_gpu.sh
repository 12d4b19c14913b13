#!/usr/bin/env bash
# Session-2 GPU batch for apps.train (issue 6, throughput against PyTorch DDP), round 2:
# GPU parity tests of the fused kernels (mixed-precision AdamW, softmax cross-entropy, bias folded
# into GELU/LayerNorm, vectorised GELU) and the single-GPU step tests; a short per-op profile;
# a sweep of hpcgpu's NCCL channel limit on 2 GPUs (fp32 + fp16, hpcgpu only); the 1-GPU comparison
# with PyTorch and the 2-GPU comparison (hpcgpu at the best channel count from the sweep, PyTorch in
# its own process so NCCL's process-wide parameter cache cannot carry our limit over). Short table
# last. Budget: under 5 minutes on 2 H200 (optional steps are skipped when time runs short).
set -u; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HPCGPU_GIT_COMMIT=$(cat .hpcgpu-commit 2>/dev/null || echo unknown) TRAIN_DDP_TRACEBACK=1
LOG=${LOG:-/tmp/train_gpu}; mkdir -p "$LOG"; rm -f "$LOG"/*.json
T0=$SECONDS
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
elapsed() { echo $((SECONDS-T0)); }

echo "== 1. fused-kernel + layer-kernel parity tests, single-GPU step tests [gpu]"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/apps/train/test_train_fused_kernels.py \
  tests/apps/train/test_train_layer_kernels.py tests/apps/train/test_train_gpu.py -m gpu \
  > "$LOG/pytest_kernels.txt" 2>&1; echo "rc=$? [$(elapsed) s]"
tail -2 "$LOG/pytest_kernels.txt"
grep -E "^(FAILED|ERROR)|Error|error:|max error|assert" "$LOG/pytest_kernels.txt" | head -14

echo "== 2. per-op profile, 1 GPU (short; ms per call, ours vs torch)"
[ -z "${SKIP_PROFILE:-}" ] && { timeout 100 python3 benchmarks/train_profile.py --repeats 5 > "$LOG/profile.txt" 2>&1; echo "rc=$? [$(elapsed) s]"; }
[ -z "${SKIP_PROFILE:-}" ] && grep -vE "^\s*$" "$LOG/profile.txt" | grep -vE "^(cupy|torch) " | tail -44

SWEEP=${TRAIN_SWEEP:-"0 2 4 8"}
if [ "$NGPU" -ge 2 ]; then
  echo "== 3. NCCL channel sweep, hpcgpu only, 2 GPUs (0 = NCCL default)"
  for n in $SWEEP; do
    timeout 75 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu \
      --nccl-channels $n --warmup 2 --json "$LOG/sweep_$n.json" > "$LOG/sweep_$n.txt" 2>&1
    echo "channels $n: rc=$? [$(elapsed) s] $(grep -E '^  hpcgpu' "$LOG/sweep_$n.txt" | tr -s ' ' | tr '\n' ' ')"
    grep -E "Traceback|Error" "$LOG/sweep_$n.txt" | head -3
  done
fi
BEST=$(python3 - "$LOG" $SWEEP <<'PY'
import json, os, sys
log, best, best_score = sys.argv[1], "0", None
base = {}
for n in sys.argv[2:]:
    try:
        results = {r["precision"]: r.get("samples_per_second") for r in
                   json.load(open(os.path.join(log, f"sweep_{n}.json")))["results"]}
    except Exception:
        continue
    if not all(results.get(p) for p in ("fp32", "fp16")):
        continue
    base = base or results
    score = sum(results[p] / base[p] for p in ("fp32", "fp16"))   # both precisions count
    if best_score is None or score > best_score * 1.002:            # ties keep the earlier (default first)
        best, best_score = n, score
print(best)
PY
)
echo "best channel setting: $BEST (0 = NCCL default)"

echo "== 4.1 train_ddp.py on 1 GPU (hpcgpu and torch)"
timeout 110 mpirun -np 1 --bind-to none python3 benchmarks/train_ddp.py --json "$LOG/train_1gpu.json" \
  > "$LOG/train_1gpu.txt" 2>&1; echo "rc=$? [$(elapsed) s]"
grep -E "^(hpcgpu|torch) " "$LOG/train_1gpu.txt"; grep -E "Traceback|Error" "$LOG/train_1gpu.txt" | head -4
if [ "$NGPU" -ge 2 ]; then
  echo "== 4.2 train_ddp.py on 2 GPUs: torch in its own process (hpcgpu: sweep_$BEST.json)"
  timeout 90 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks torch \
    --json "$LOG/train_2gpu_torch.json" > "$LOG/train_2gpu_torch.txt" 2>&1; echo "rc=$? [$(elapsed) s]"
  grep -E "^(hpcgpu|torch) " "$LOG/sweep_$BEST.txt" "$LOG/train_2gpu_torch.txt" | sed 's|.*/||'
  grep -E "Traceback|Error" "$LOG/train_2gpu_torch.txt" | head -4
fi
if [ -z "${SKIP_DIST:-}" ] && [ $(elapsed) -lt 200 ]; then
  echo "== 5. (time left) NCCL data-parallel GPU tests"
  timeout $((280 - $(elapsed))) python3 -m pytest -q -x -p no:cacheprovider tests/apps/train/test_train_distributed_gpu.py \
    -m gpu > "$LOG/pytest_dist.txt" 2>&1; echo "rc=$? [$(elapsed) s]"
  tail -2 "$LOG/pytest_dist.txt"; grep -E "^(FAILED|ERROR)|assert" "$LOG/pytest_dist.txt" | head -6
else
  echo "== 5. skipped (NCCL data-parallel GPU tests): $(elapsed) s used"
fi
[ -n "${OUT:-}" ] && cp "$LOG"/*.json "$LOG"/*.txt "$OUT"/ 2>/dev/null

echo "== summary (samples/s, global; target hpcgpu/torch >= 1.0, scaling >= 95%) [$(elapsed) s]"
python3 - "$LOG" "$BEST" $SWEEP <<'PY'
import json, os, sys
log, best, sweep = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(name):
    try:
        return json.load(open(os.path.join(log, name)))["results"]
    except Exception as exc:
        print(f"{name}: {exc}")
        return []
print("channel sweep, hpcgpu 2 GPUs (samples/s; step ms; events: exposed wait / backward ms):")
for n in sweep:
    cells = []
    for r in load(f"sweep_{n}.json"):
        if r.get("error"):
            cells.append(f"{r['precision']} ERROR {r['error'][:60]}")
        else:
            cells.append(f"{r['precision']} {r['samples_per_second']:>9,.0f} {r['step_ms']:6.2f} ms "
                         f"({r.get('events_exposed_wait_ms', 0):.2f}/{r.get('events_backward_ms') or 0:.2f})")
    print(f"  N={n:<3}{'*' if n == best else ' '} " + " | ".join(cells))
runs = {}
for r in load("train_1gpu.json") + load(f"sweep_{best}.json") + load("train_2gpu_torch.json"):
    runs[(r["framework"], r["precision"], r["n_ranks"])] = r
print(f"{'prec':<5} {'GPUs':>4} {'hpcgpu':>10} {'torch':>10} {'ratio':>6} {'hpcgpu step ms':>14} {'scaling':>8} "
      f"{'torch scal':>10} {'hidden':>7}")
for precision in ("fp32", "fp16"):
    for n in (1, 2):
        ours, theirs = runs.get(("hpcgpu", precision, n), {}), runs.get(("torch", precision, n), {})
        a, b = ours.get("samples_per_second"), theirs.get("samples_per_second")
        one = runs.get(("hpcgpu", precision, 1), {}).get("samples_per_second")
        one_t = runs.get(("torch", precision, 1), {}).get("samples_per_second")
        scaling = f"{a / (n * one):.1%}" if a and one and n > 1 else "-"
        scaling_t = f"{b / (n * one_t):.1%}" if b and one_t and n > 1 else "-"
        hidden = ours.get("hidden_fraction")
        error = ours.get("error") or theirs.get("error")
        print(f"{precision:<5} {n:>4} {a or 0:>10,.0f} {b or 0:>10,.0f} {(a / b if a and b else 0):>6.2f} "
              f"{ours.get('step_ms', 0):>14.2f} {scaling:>8} {scaling_t:>10} "
              f"{'-' if hidden is None else f'{hidden:.0%}':>7}" + (f"  ERROR {error[:80]}" if error else ""))
print(f"hpcgpu 2-GPU rows: NCCL channels {best} (0 = default); torch 2-GPU: default NCCL, own process")
PY

#!/usr/bin/env bash
# Final GPU batch: every GPU test (1 and 2 GPUs), halo benchmark, Jacobi and SWE through the app with the
# shipped defaults, asynchronous-checkpoint overhead, and the training benchmark against PyTorch DDP.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HPCGPU_GIT_COMMIT=$(cat .hpcgpu-commit 2>/dev/null)
R="mpirun --bind-to none"
T0=$SECONDS
timeout 190 python3 -m pytest tests -m gpu -q -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1; echo "pytest: $(tail -1 "$OUT/pytest_gpu.txt") [$((SECONDS-T0)) s]"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.txt" | head -5
if [ -f benchmarks/train_ddp.py ]; then
  for n in 1 2; do timeout 100 $R -np $n python3 benchmarks/train_ddp.py --json "$OUT/train_${n}gpu.json" > "$OUT/train_${n}gpu.txt" 2>&1; tail -12 "$OUT/train_${n}gpu.txt"; done
fi
$R -np 2 python3 -m hpcgpu.bench halo --transports nccl,mpi-staged --sizes 16384,4194304 --layouts rows,columns --seconds 0.2 > "$OUT/halo.txt" 2>&1
grep -E "^nccl|^mpi" "$OUT/halo.txt"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 --nan-check-every 0 --quiet"
$R -np 1 python3 $J --summary "$OUT/jacobi1.json" > /dev/null 2>&1
$R -np 2 python3 $J --summary "$OUT/jacobi2.json" > /dev/null 2>&1
S="-m apps.stencil --model swe --days 2 --quiet --no-plot --snapshot-every 0 --nan-check-every 0"
$R -np 1 python3 $S --summary "$OUT/swe_plain.json" --output /tmp/swe_a > /dev/null 2>&1
$R -np 1 python3 $S --checkpoint-every 100 --async-checkpoint --checkpoint-dir /tmp/ck_async --summary "$OUT/swe_async.json" --output /tmp/swe_b > "$OUT/swe_async.txt" 2>&1
python3 - "$OUT" <<'PY'
import json, sys, os
for name in ("jacobi1", "jacobi2", "swe_plain", "swe_async"):
    try:
        s = json.load(open(os.path.join(sys.argv[1], name + ".json")))
        print(f"{name:<10} wall {s['wall_seconds']:.3f} s  {s['throughput']/1e9:.2f} G{s['unit']}  steps {s['steps']}  checksum {s['checksum'][7:19]}  timers { {k: round(v['max'], 3) for k, v in s['timers'].items()} }")
    except Exception as exc:
        print(name, "failed:", exc)
PY
echo "total $((SECONDS-T0)) s"

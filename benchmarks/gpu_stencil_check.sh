#!/usr/bin/env bash
# One batched GPU call for apps.stencil: kernel variants (bitwise checks + timings), GPU tests,
# the Jacobi benchmark of the app on 1 and 2 GPUs. Logs and JSON under ${OUT:-./gpu-out}.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NGPU=$(nvidia-smi -L | wc -l)
[ -n "${SKIP_KERNELS:-}" ] || timeout 200 python3 benchmarks/stencil_kernels.py --json "$OUT/kernels.json" --quick > "$OUT/kernels.txt" 2>&1
tail -25 "$OUT/kernels.txt"
[ -n "${SKIP_TESTS:-}" ] || timeout 300 python3 -m pytest tests/core tests/apps/stencil/jacobi tests/apps/stencil/heat3d tests/apps/md -m gpu -q -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1; tail -4 "$OUT/pytest_gpu.txt"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --nan-check-every 0 --quiet"
for n in 1 2; do
  [ "$n" -le "$NGPU" ] || continue
  for norm in 1000 1; do
    mpirun -np $n --bind-to none python3 $J --norm-every $norm --summary "$OUT/jacobi_${n}gpu_norm${norm}.json" > "$OUT/jacobi_${n}_${norm}.txt" 2>&1
  done
  mpirun -np $n --bind-to none python3 $J --norm-every 1000 --graph --summary "$OUT/jacobi_${n}gpu_graph.json" > "$OUT/jacobi_${n}_graph.txt" 2>&1
  mpirun -np $n --bind-to none python3 $J --norm-every 1000 --no-overlap --summary "$OUT/jacobi_${n}gpu_nooverlap.json" > "$OUT/jacobi_${n}_nooverlap.txt" 2>&1
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os
print(f"{'run':<28} {'wall s':>8} {'GLUPS':>8} {'compute':>8} {'comm':>8} checksum")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "jacobi_*.json"))):
    s = json.load(open(path)); t = s["timers"]
    print(f"{os.path.basename(path)[:-5]:<28} {s['wall_seconds']:>8.3f} {s['throughput']/1e9:>8.1f} "
          f"{t.get('compute',{}).get('max',0):>8.3f} {t.get('communication',{}).get('max',0):>8.3f} {s['checksum'][7:19]}")
PY

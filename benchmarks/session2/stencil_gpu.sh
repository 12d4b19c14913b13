#!/usr/bin/env bash
# Session-2 GPU batch for apps.stencil (issue 3) and the scaling tool (issue 8): GPU tests, the Jacobi
# 16384^2 schedules on 1 and 2 GPUs, scaling series, an nsys NVTX check. Short table last.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HPCGPU_GIT_COMMIT=$(cat .hpcgpu-commit 2>/dev/null || echo unknown)
LOG=${LOG:-/tmp/stencil_gpu}; mkdir -p "$LOG"
NGPU=$(nvidia-smi -L | wc -l)
echo "== stencil GPU tests"
[ -n "${SKIP_TESTS:-}" ] || timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/stencil/jacobi tests/apps/stencil/heat3d \
  tests/apps/stencil/swe tests/core/test_halo_gpu.py > "$LOG/pytest.txt" 2>&1; echo "rc=$?"; tail -4 "$LOG/pytest.txt"
grep -E "^(FAILED|ERROR)|Error" "$LOG/pytest.txt" | head -10
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 --nan-check-every 0 --quiet"
for n in 1 2; do
  [ "$n" -le "$NGPU" ] || continue
  for schedule in overlap graph no-overlap no-overlap+graph; do
    flags=""; case $schedule in graph) flags="--graph";; no-overlap) flags="--no-overlap";; no-overlap+graph) flags="--no-overlap --graph";; esac
    timeout 120 mpirun -np $n --bind-to none python3 $J $flags --output "$LOG/j" --summary "$LOG/jacobi_${n}gpu_${schedule}.json" > "$LOG/j_${n}_${schedule}.txt" 2>&1 || { echo "jacobi $n $schedule failed"; tail -5 "$LOG/j_${n}_${schedule}.txt"; }
  done
done
# Fixed vs per-step cost: the same 2-GPU run with 3x the iterations.
[ "$NGPU" -ge 2 ] && timeout 120 mpirun -np 2 --bind-to none python3 ${J/--steps 1000/--steps 3000} --output "$LOG/j" --summary "$LOG/jacobi_2gpu_overlap_3000steps.json" > "$LOG/j3000.txt" 2>&1
if command -v nsys >/dev/null; then
  echo "== nsys NVTX check (jacobi 4096^2, 50 steps, 1 GPU)"
  timeout 120 nsys profile -t cuda,nvtx -o "$LOG/nvtx" --force-overwrite true python3 -m apps.stencil --model jacobi --nx 4096 --ny 4096 --steps 50 --quiet --output "$LOG/n" > "$LOG/nsys.txt" 2>&1
  timeout 60 nsys stats --report nvtx_sum --format csv "$LOG/nvtx.nsys-rep" 2>/dev/null | head -12
else
  echo "nsys: not installed"
fi
if [ -z "${SKIP_SCALING:-}" ]; then
echo "== scaling (issue 8)"
timeout 200 python3 -m hpcgpu.bench scaling --app stencil --strong --ranks 1,2 --backend cupy --output "$LOG/scale_jacobi" --timeout 90 -- --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 --nan-check-every 0 > "$LOG/scale_jacobi.txt" 2>&1; echo "rc=$?"; tail -8 "$LOG/scale_jacobi.txt"
timeout 200 python3 -m hpcgpu.bench scaling --app stencil --weak --ranks 1,2 --backend cupy --output "$LOG/scale_swe" --timeout 90 -- --model swe --nx 8192 --ny 4096 --steps 200 --snapshot-every 0 --no-plot > "$LOG/scale_swe.txt" 2>&1; echo "rc=$?"; tail -8 "$LOG/scale_swe.txt"
fi
[ -n "${OUT:-}" ] && cp "$LOG"/scale_*/scaling.png "$OUT"/ 2>/dev/null; [ -n "${OUT:-}" ] && for d in "$LOG"/scale_*; do cp "$d/scaling.json" "$OUT/$(basename $d).json" 2>/dev/null; done
echo "== Jacobi 16384^2 fp32, 1000 iterations"
python3 - "$LOG" <<'PY'
import json, sys, glob, os
print(f"{'run':<26} {'wall s':>7} {'GLUPS':>6} {'compute':>8} {'comm':>7} checksum")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "jacobi_*.json"))):
    s = json.load(open(path)); t = s["timers"]
    print(f"{os.path.basename(path)[7:-5]:<26} {s['wall_seconds']:>7.3f} {s['throughput']/1e9:>6.1f} "
          f"{t.get('compute',{}).get('max',0):>8.3f} {t.get('communication',{}).get('max',0):>7.3f} {s['checksum'][7:19]}")
PY

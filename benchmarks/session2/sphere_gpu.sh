#!/usr/bin/env bash
# Session-2 GPU batch for the shallow-water model on the sphere (issue 9, apps.stencil --grid latlon):
# the sphere GPU tests (1 and 2 GPUs), Williamson 6 at 0.25 deg (1440 x 720) on 1 GPU, weak scaling to
# 2 GPUs, the case-2 convergence table on the GPU. Short table last. Run from the repository root.
#
# Weak scaling keeps the cells per GPU constant: 1 GPU runs 1440 x 720 (0.25 x 0.25 deg); 2 GPUs run
# 1440 x 1440 (0.25 deg in longitude x 0.125 deg in latitude) split into two latitude bands of
# 1440 x 720 each (--dims 2,1: whole latitude circles per GPU, so the polar filter stays on the
# device; each band holds the same 240 filtered rows as the 1-GPU grid). Efficiency = per-GPU
# throughput on 2 GPUs / throughput on 1 GPU. Extra rows: 1440 x 720 on 2 GPUs (strong scaling) and
# with --dims 1,2 (rows split in longitude: the host-staged polar filter, expected slow).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export HPCGPU_GIT_COMMIT=$(cat .hpcgpu-commit 2>/dev/null || echo unknown)
LOG=${LOG:-/tmp/sphere_gpu}; mkdir -p "$LOG"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== GPUs: $NGPU; python $(python3 -c 'import sys; print(sys.version.split()[0])'); $(python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1)"

echo "== sphere GPU tests (1 and 2 ranks)"
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/apps/stencil/sphere/test_sphere_gpu.py -m gpu \
  > "$LOG/pytest.txt" 2>&1; echo "pytest rc=$?"; tail -4 "$LOG/pytest.txt"
grep -E "^(FAILED|ERROR)|Error|assert" "$LOG/pytest.txt" | head -12

APP="-m apps.stencil --grid latlon --init williamson6 --backend cupy --snapshot-every 0 --no-plot --nan-check-every 0 --quiet"
run() {  # run NAME NRANKS STEPS ARGS...
  local name=$1 n=$2 steps=$3; shift 3
  if [ "$n" -gt "$NGPU" ]; then echo "$name: skipped ($n GPUs needed, $NGPU present)"; return; fi
  timeout 120 mpirun -np "$n" --bind-to none python3 $APP --steps "$steps" --output "$LOG/out_$name" \
    --summary "$LOG/sphere_$name.json" "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?; echo "$name rc=$rc"
  [ $rc -eq 0 ] || tail -15 "$LOG/$name.txt"
}
echo "== warm-up (NVRTC compile of the kernels, kernel cache)"
run warmup 1 10 --nx 144 --ny 72
echo "== Williamson 6 timings"
run 1gpu_1440x720 1 1000 --nx 1440 --ny 720
run 2gpu_1440x1440_weak 2 1000 --nx 1440 --ny 1440 --dims 2,1
run 2gpu_1440x720_strong 2 1000 --nx 1440 --ny 720 --dims 2,1
run 2gpu_1440x720_lonsplit 2 200 --nx 1440 --ny 720 --dims 1,2

echo "== case 2 convergence and case 6 drift on the GPU (day 5)"
timeout 150 python3 benchmarks/sphere_convergence.py --backend cupy --json "$LOG/convergence.json" \
  > "$LOG/convergence.txt" 2>&1; echo "convergence rc=$?"; tail -22 "$LOG/convergence.txt"

[ -n "${OUT:-}" ] && cp "$LOG"/sphere_*.json "$LOG"/convergence.json "$LOG"/pytest.txt "$OUT"/ 2>/dev/null
echo "== summary: Williamson 6, fp64, cell-updates per second (one update = h, u, v of one cell, one RK3 step)"
python3 - "$LOG" <<'PY'
import glob, json, os, sys
log = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(log, "sphere_*.json"))):
    name = os.path.basename(path)[7:-5]
    if name != "warmup":
        rows[name] = json.load(open(path))
base = rows.get("1gpu_1440x720")
base_rate = base["throughput"] if base else None
print(f"{'run':<24} {'grid':>10} {'GPUs':>4} {'steps':>5} {'wall s':>7} {'Gcell/s':>8} {'per GPU':>8} {'eff':>5} "
      f"{'comp max':>8} {'comm max':>8} {'mass drift':>10}")
for name, s in rows.items():
    shape = "x".join(str(v) for v in reversed(s["decomposition"]["global_shape"]))
    n = s["n_ranks"]; rate = s["throughput"]; per = rate / n
    eff = f"{per / base_rate:.2f}" if base_rate and "strong" not in name else "-"
    t = s["timers"]
    print(f"{name:<24} {shape:>10} {n:>4} {s['steps']:>5} {s['wall_seconds']:>7.2f} {rate / 1e9:>8.3f} {per / 1e9:>8.3f} "
          f"{eff:>5} {t.get('compute', {}).get('max', 0):>8.2f} {t.get('communication', {}).get('max', 0):>8.2f} "
          f"{s['diagnostics'].get('mass_relative_change', float('nan')):>10.1e}")
if not rows:
    print("no timing summaries were written (see the tails above)")
PY

#!/usr/bin/env bash
# GPU batch: SWE/checkpoint/core GPU tests, halo diagnosis at the Jacobi app's message shape, SWE speed.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R="mpirun --bind-to none"
timeout 300 python3 -m pytest tests/apps/stencil/swe tests/checkpoint tests/core -m gpu -q -p no:cacheprovider > "$OUT/pytest.txt" 2>&1; tail -3 "$OUT/pytest.txt"
{
$R -np 2 python3 -m hpcgpu.bench halo --sizes 16384 --layouts rows --seconds 0.2
$R -np 2 python3 -m hpcgpu.bench halo --sizes 16384 --layouts rows --seconds 0.2 --periodic --local-rows 8192 --side-halo 1
} > "$OUT/halo.txt" 2>&1; grep -E "^nccl|^mpi" "$OUT/halo.txt"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 --nan-check-every 0 --quiet"
$R -np 2 python3 $J --summary "$OUT/j2_nccl.json" > "$OUT/j2.txt" 2>&1
HPCGPU_TRANSPORT=mpi-staged $R -np 2 python3 $J --summary "$OUT/j2_staged.json" >> "$OUT/j2.txt" 2>&1
$R -np 2 python3 $J --dims 1,2 --summary "$OUT/j2_cols.json" >> "$OUT/j2.txt" 2>&1
S="-m apps.stencil --model swe --nan-check-every 0 --quiet --snapshot-every 0 --no-plot"
$R -np 1 python3 $S --nx 512 --ny 256 --steps 3000 --summary "$OUT/swe_small.json" > "$OUT/swe.txt" 2>&1
$R -np 1 python3 $S --nx 512 --ny 256 --steps 3000 --graph --summary "$OUT/swe_small_graph.json" >> "$OUT/swe.txt" 2>&1
$R -np 1 python3 $S --nx 8192 --ny 4096 --steps 200 --summary "$OUT/swe_1gpu.json" >> "$OUT/swe.txt" 2>&1
$R -np 2 python3 $S --nx 16384 --ny 4096 --steps 200 --summary "$OUT/swe_2gpu.json" >> "$OUT/swe.txt" 2>&1
tail -5 "$OUT/swe.txt"; tail -5 "$OUT/j2.txt"
python3 - "$OUT" <<'PY'
import json, sys, glob, os
print(f"{'run':<18} {'steps':>6} {'wall s':>8} {'steps/s':>9} {'Gupd/s':>8} {'compute':>8} {'comm':>8}  transport")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    s = json.load(open(path)); t = s["timers"]
    print(f"{os.path.basename(path)[:-5]:<18} {s['steps']:>6} {s['wall_seconds']:>8.3f} {s['steps']/s['wall_seconds']:>9.1f} "
          f"{s['throughput']/1e9:>8.2f} {t.get('compute',{}).get('max',0):>8.3f} {t.get('communication',{}).get('max',0):>8.3f}  {s.get('transport')} {s['decomposition']['dims']}")
PY

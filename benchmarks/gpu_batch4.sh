#!/usr/bin/env bash
# GPU batch: Jacobi 2-GPU overlap experiments (NCCL channels, stream priority, graphs), MD GPU tests and speed.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R="mpirun --bind-to none"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 --nan-check-every 0 --quiet"
run() { name=$1; shift; env "$@" $R -np 2 python3 $J $EXTRA --summary "$OUT/j_$name.json" > "$OUT/j_$name.txt" 2>&1 || tail -3 "$OUT/j_$name.txt"; }
EXTRA=""; run default X=1; run ch1 NCCL_MAX_NCHANNELS=1; run prio_normal HPCGPU_COMM_STREAM_PRIORITY=normal
run ch1_normal NCCL_MAX_NCHANNELS=1 HPCGPU_COMM_STREAM_PRIORITY=normal
EXTRA="--graph"; run graph_ch1 NCCL_MAX_NCHANNELS=1; run graph_ch1_normal NCCL_MAX_NCHANNELS=1 HPCGPU_COMM_STREAM_PRIORITY=normal
EXTRA="--graph --no-overlap"; run graph_nooverlap_ch1 NCCL_MAX_NCHANNELS=1
EXTRA=""; run staged HPCGPU_TRANSPORT=mpi-staged
python3 - "$OUT" <<'PY'
import json, sys, glob, os
print(f"{'run':<22} {'wall s':>7} {'GLUPS':>7} {'compute':>8} {'comm':>7}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "j_*.json"))):
    s = json.load(open(path)); t = s["timers"]
    print(f"{os.path.basename(path)[2:-5]:<22} {s['wall_seconds']:>7.3f} {s['throughput']/1e9:>7.1f} {t['compute']['max']:>8.3f} {t.get('communication',{}).get('max',0):>7.3f}")
PY
timeout 240 python3 -m pytest tests/apps/md -m gpu -q -p no:cacheprovider > "$OUT/md_pytest.txt" 2>&1; tail -3 "$OUT/md_pytest.txt"
for cells in 20 80; do python3 -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --quiet --summary "$OUT/md_${cells}.json" > "$OUT/md_$cells.txt" 2>&1 || tail -5 "$OUT/md_$cells.txt"; done
python3 -c "
import json,sys
for c in (20, 80):
    try: s=json.load(open('$OUT/md_%d.json'%c)); print('md cells',c,'atoms',s.get('n_atoms'),'atom-steps/s %.3g'%s['throughput'], {k: round(v['max'],3) for k,v in s['timers'].items()})
    except Exception as e: print('md', c, 'failed', e)
"

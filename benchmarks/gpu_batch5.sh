#!/usr/bin/env bash
# GPU batch: NCCL p2p channel count vs. overlap (Jacobi 2 GPUs) and vs. halo bandwidth.
set -u
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R="mpirun --bind-to none"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 --nan-check-every 0 --quiet"
for setting in "NCCL_MAX_P2P_NCHANNELS=1" "NCCL_MAX_P2P_NCHANNELS=2" "NCCL_MAX_P2P_NCHANNELS=4" "NCCL_MAX_NCHANNELS=1"; do
  name=${setting//=/_}
  env $setting $R -np 2 python3 $J --summary "$OUT/j_$name.json" > "$OUT/j_$name.txt" 2>&1
  env $setting $R -np 2 python3 -m hpcgpu.bench halo --transports nccl --sizes 16384,4194304 --layouts rows --seconds 0.2 > "$OUT/h_$name.txt" 2>&1
  python3 -c "
import json; s=json.load(open('$OUT/j_$name.json')); t=s['timers']
print('$setting', 'jacobi wall %.3f s  GLUPS %.0f  compute %.3f comm %.3f' % (s['wall_seconds'], s['throughput']/1e9, t['compute']['max'], t['communication']['max']))"
  grep -E "^nccl" "$OUT/h_$name.txt"
done

#!/usr/bin/env bash
# Session 10, device call 3 (2 H200): fp32 at 16384 per GPU, the communication stream's priority
# (HPCGPU_COMM_STREAM_PRIORITY high = default / low = compute above communication), alternated, then
# PyTorch once in the same call. Session 6 tried this in fp16 at 8192 only (no difference).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1 priority=$2; shift 2
  timeout 120 mpirun -np 2 --bind-to none -x HPCGPU_COMM_STREAM_PRIORITY=$priority python3 benchmarks/train_ddp.py \
    --batch-per-gpu 16384 --warmup 3 --steps 20 --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $priority $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-150; }
train low1 low --frameworks hpcgpu
train high1 high --frameworks hpcgpu
train low2 low --frameworks hpcgpu
train high2 high --frameworks hpcgpu
train torch high --frameworks torch
echo "done [$(el) s]"

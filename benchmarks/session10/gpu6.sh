#!/usr/bin/env bash
# Session 10, device call 6 (2 H200, the last ~4 minutes): fp32 at 16384 per GPU, one bucket
# (--bucket-mb 1000) against PyTorch DDP again, alternated, to see whether call 5's 1.001-1.003x holds.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  timeout 75 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py \
    --batch-per-gpu 16384 --warmup 3 --steps 20 --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-150; }
train torch1 --frameworks torch
train b1000 --frameworks hpcgpu --bucket-mb 1000
train torch2 --frameworks torch
echo "done [$(el) s]"

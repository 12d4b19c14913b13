#!/usr/bin/env bash
# Pending (written in session 9): fp32 throughput against PyTorch DDP by batch per GPU. At 16384 per GPU
# hpcgpu is 0.993-0.998x PyTorch on 2 H200 (its step alone is ~1% faster, but loses 4-5 ms beside the
# 570 MB allreduce); session 2 measured 1.00x at 2048 (older code), session 6 0.998x at 8192. The same job
# order for each batch: hpcgpu, then PyTorch, in-process pairs (3 rounds). 2 H200, about 5 minutes.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1 batch=$2 steps=$3; shift 3
  timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu $batch --warmup 3 \
    --steps $steps --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $batch $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-160; }
train b2048 2048 120 --frameworks hpcgpu,torch
train b8192 8192 40 --frameworks hpcgpu,torch
train b16384 16384 20 --frameworks hpcgpu,torch
echo "done [$(el) s]"

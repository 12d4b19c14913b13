#!/usr/bin/env bash
# Pending (written in session 8): train fp16 scaling with twice the batch per GPU (16384: the allreduce
# moves the same 285 MB per step beside twice the compute) against 8192 in the same call, and PyTorch DDP at
# 16384; 60-step phases alternately first (the method of sessions 6-7). The first job warms the GPUs.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  timeout 140 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --steps 60 --warmup 5 --precisions fp16 \
    "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-200; }
train warm-up --batch-per-gpu 8192 --rounds 2 --frameworks hpcgpu
train hpcgpu_16384 --batch-per-gpu 16384 --rounds 5 --frameworks hpcgpu
train hpcgpu_8192 --batch-per-gpu 8192 --rounds 7 --frameworks hpcgpu
train torch_16384 --batch-per-gpu 16384 --rounds 3 --frameworks torch
echo "done [$(el) s]"

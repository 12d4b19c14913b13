#!/usr/bin/env bash
# Session 9: train scaling at 16384 samples per GPU, the batch at which session 9's first call measured fp16
# 96.1% by median (5 rounds): confirm with more rounds, add fp32 and PyTorch at the same batch, and the
# separate 1-GPU / 2-GPU jobs. 2 H200.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1 np=$2; shift 2
  timeout 200 mpirun -np $np --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 16384 --warmup 5 \
    "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name np=$np $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-160; }
train warm-up 2 --steps 30 --precisions fp16 --rounds 1 --frameworks hpcgpu
train fp16_hpcgpu 2 --steps 60 --precisions fp16 --rounds 9 --frameworks hpcgpu
train fp16_torch 2 --steps 60 --precisions fp16 --rounds 5 --frameworks torch
train fp32_both 2 --steps 20 --precisions fp32 --rounds 3 --frameworks hpcgpu,torch
train sep_1gpu 1 --steps 60 --precisions fp16 --frameworks hpcgpu,torch
train sep_2gpu 2 --steps 60 --precisions fp16 --frameworks hpcgpu,torch
echo "done [$(el) s]"

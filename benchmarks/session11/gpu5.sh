#!/usr/bin/env bash
# Session 11, call 5: repeat of call 4's finding (8 NCCL channels give fp16 the best scaling at 16384
# per GPU), default first this time; then fp32 with 8 channels and PyTorch DDP fp32 / fp16 in the
# same call for the throughput ratios. 2 H200; no carry needed.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  timeout 170 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 16384 "$@" \
    > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-140; }
F16="--warmup 5 --steps 60 --precisions fp16"
F32="--warmup 3 --steps 20 --precisions fp32"
train fp16_default $F16 --rounds 9 --frameworks hpcgpu
train fp16_ch8 $F16 --rounds 9 --frameworks hpcgpu --nccl-channels 8
train fp16_torch $F16 --rounds 3 --frameworks torch
train fp32_ch8 $F32 --rounds 3 --frameworks hpcgpu --nccl-channels 8
train fp32_torch $F32 --rounds 3 --frameworks torch
echo "done [$(el) s]"

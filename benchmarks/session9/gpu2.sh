#!/usr/bin/env bash
# Session 9: fp32 at 16384 per GPU is 0.99x PyTorch DDP (gpu1.sh): hpcgpu alone is faster (284.6 vs 288.0 ms)
# but loses 4.5 ms beside its allreduce, PyTorch none. fp32 backward (195 ms) hides 19 ms of allreduce with
# room to spare, so fewer NCCL channels (fewer SMs taken from compute) may cost nothing: channels 2/4/8 vs
# NCCL's default, then PyTorch again. 2 H200.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 16384 --warmup 3 \
    --steps 20 --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-160; }
train ch_default --frameworks hpcgpu
train ch4 --frameworks hpcgpu --nccl-channels 4
train ch2 --frameworks hpcgpu --nccl-channels 2
train ch8 --frameworks hpcgpu --nccl-channels 8
train torch --frameworks torch
echo "done [$(el) s]"

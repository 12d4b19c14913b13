#!/usr/bin/env bash
# Session 11, call 4: fp16 at 16384 per GPU with fewer NCCL channels (fewer SMs taken from the
# backward's GEMMs while the buckets reduce), session 9's protocol (--warmup 5 --steps 60, 9 rounds).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1 np=$2; shift 2
  timeout 170 mpirun -np "$np" --bind-to none python3 benchmarks/train_ddp.py \
    --warmup 5 --steps 60 --precisions fp16 --frameworks hpcgpu "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name np=$np $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-140; }
train ch4 2 --batch-per-gpu 16384 --rounds 9 --nccl-channels 4
train ch8 2 --batch-per-gpu 16384 --rounds 9 --nccl-channels 8
train ch2 2 --batch-per-gpu 16384 --rounds 9 --nccl-channels 2
train default 2 --batch-per-gpu 16384 --rounds 9
echo "done [$(el) s]"

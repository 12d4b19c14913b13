#!/usr/bin/env bash
# Session 11, call 3 (tree of 7c5694d + scripts): fp16 scaling after the fused LayerNorm + GELU made the
# fp16 step ~13% shorter, with session 9's protocol (--warmup 5 --steps 60, 9 in-process rounds) at
# 16384 per GPU (25 and 50 MB buckets), separate 1- and 2-GPU jobs at 16384, and 32768 per GPU.
# 2 H200; no carry needed.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1 np=$2; shift 2
  timeout 170 mpirun -np "$np" --bind-to none python3 benchmarks/train_ddp.py \
    --warmup 5 --steps 60 --precisions fp16 --frameworks hpcgpu "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name np=$np $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-140; }
train b25_r9 2 --batch-per-gpu 16384 --rounds 9
train b50_r9 2 --batch-per-gpu 16384 --rounds 9 --bucket-mb 50
train job1 1 --batch-per-gpu 16384
train job2 2 --batch-per-gpu 16384
train b25_32768 2 --batch-per-gpu 32768 --rounds 7
train job1_32768 1 --batch-per-gpu 32768
echo "done [$(el) s]"

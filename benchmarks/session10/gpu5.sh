#!/usr/bin/env bash
# Session 10, device call 5 (2 H200): fp32 at 16384 per GPU by allreduce bucket size. The 570 MB gradient
# allreduce costs hpcgpu ~5 ms per step when it overlaps the backward (compute slows beside it), while the
# allreduce alone takes ~2.6 ms: one bucket after the backward (no overlap) may cost less. 1000 MB = one
# bucket, 300 MB = two, 25 MB = the default; PyTorch DDP (25 MB buckets) in the same call.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  timeout 100 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py \
    --batch-per-gpu 16384 --warmup 3 --steps 20 --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-150; }
train b1000a --frameworks hpcgpu --bucket-mb 1000
train b25 --frameworks hpcgpu
train b300 --frameworks hpcgpu --bucket-mb 300
train b1000b --frameworks hpcgpu --bucket-mb 1000
train torch --frameworks torch
echo "done [$(el) s]"

#!/usr/bin/env bash
# Session 4, GPU call 8 (2 H200): train fp16 on 1 and 2 GPUs, NCCL vs the copy-engine allreduce, interleaved,
# after an untimed run that brings the GPU clocks up (the first process after a start ran ~1.5x slower).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d)
B="benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 --steps 50 --warmup 10"
timeout 60 mpirun -np 2 --bind-to none python3 $B > /dev/null 2>&1
for r in 1 2 3; do
  timeout 60 mpirun -np 1 --bind-to none python3 $B > $W/b.txt 2>&1; grep -E "^hpcgpu" $W/b.txt || tail -3 $W/b.txt
  for mode in nccl peer; do
    timeout 60 mpirun -np 2 --bind-to none python3 $B --allreduce $mode > $W/b.txt 2>&1; grep -E "^hpcgpu" $W/b.txt || tail -3 $W/b.txt
  done
done
nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
rm -rf $W

#!/usr/bin/env bash
# Session 6, GPU call 7 (2 H200): fp16 train scaling at 8192 per GPU with the communication stream's priority
# high (default) / normal / low (HPCGPU_COMM_STREAM_PRIORITY), alternated, 9 in-process rounds each.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for priority in high normal low high normal low; do
  timeout 150 mpirun -np 2 --bind-to none -x HPCGPU_COMM_STREAM_PRIORITY=$priority python3 benchmarks/train_ddp.py \
    --frameworks hpcgpu --precisions fp16 --batch-per-gpu 8192 --steps 20 --warmup 5 --rounds 9 > $W/b.txt 2>&1
  echo "[$priority, $(el) s]:"; grep -E "^hpcgpu |in-process" $W/b.txt | cut -c1-250 || tail -5 $W/b.txt
done
echo "done [$(el) s]"
rm -rf $W

#!/usr/bin/env bash
# Session 9: fp32 with the copy-engine allreduce (--allreduce peer): no NCCL kernels on the SMs during
# backward (gpu2.sh: NCCL's loss is the same with 2, 4, 8 channels or the default -- the SM time the
# allreduce takes is fixed by its bytes). 2 H200, 16384/GPU, then PyTorch again in the same call.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 16384 \
    --warmup 3 --steps 20 --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-200; }
train peer --frameworks hpcgpu --allreduce peer
train peer_torch --frameworks hpcgpu,torch --allreduce peer
echo "done [$(el) s]"

#!/usr/bin/env bash
# Session 11, call 2 (fused LayerNorm + GELU, commit 7c5694d): 1) every GPU test of apps.train (1 and
# 2 GPUs; mnist1d from .whl for the app end-to-end test); 2) 1-GPU jobs, fp32 and fp16, ours and
# PyTorch; 3) 2-GPU fp32 against PyTorch DDP again (a second call), and fp16 scaling over 7 rounds.
# 2 H200; carry [".whl"].
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/mnist1d-*.whl
PYTHONPATH=/tmp/extra:$PYTHONPATH timeout 360 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/apps/train \
  > "$OUT/tests.log" 2>&1
echo "[train GPU tests rc=$? $(el) s]"; tail -6 "$OUT/tests.log"
train() { local name=$1 np=$2; shift 2
  timeout 170 mpirun -np "$np" --bind-to none python3 benchmarks/train_ddp.py \
    --batch-per-gpu 16384 --warmup 3 --steps 20 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name np=$np $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-170; }
train 1gpu 1 --precisions fp32,fp16 --frameworks hpcgpu,torch
train fp32_torch 2 --precisions fp32 --frameworks torch --rounds 3
train fp32_b25 2 --precisions fp32 --frameworks hpcgpu --rounds 3
train fp16_b25 2 --precisions fp16 --frameworks hpcgpu --rounds 7
echo "done [$(el) s]"

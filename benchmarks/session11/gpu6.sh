#!/usr/bin/env bash
# Session 11, call 6 (AdamW moving 4 elements per access; train_ddp.py closes PyTorch's process group):
# 1) every GPU test of apps.train (1 and 2 GPUs); 2) the profile's optimiser rows (no PyTorch);
# 3) fp16 scaling from separate jobs with --nccl-channels 8 at 16384 per GPU; 4) fp32 ours and
# PyTorch in one 2-GPU job. 2 H200; carry [".whl"].
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/mnist1d-*.whl
PYTHONPATH=/tmp/extra:$PYTHONPATH timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/apps/train \
  > "$OUT/tests.log" 2>&1
echo "[train GPU tests rc=$? $(el) s]"; tail -4 "$OUT/tests.log"
timeout 90 python3 benchmarks/train_profile.py --batch 16384 --precisions fp32,fp16 --repeats 5 --no-torch > "$OUT/profile.log" 2>&1
echo "[profile rc=$? $(el) s]"; grep -E "^(adamw|train_step|model fwd\+bwd|layernorm\+gelu)|samples/s" "$OUT/profile.log" | head -12
train() { local name=$1 np=$2; shift 2
  timeout 150 mpirun -np "$np" --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 16384 "$@" \
    > "$OUT/train_$name.log" 2>&1
  echo "[$name np=$np $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error|hpcgpu /" "$OUT/train_$name.log" | cut -c1-140; }
train fp16_ch8_1 1 --warmup 5 --steps 60 --precisions fp16 --frameworks hpcgpu
train fp16_ch8_2 2 --warmup 5 --steps 60 --precisions fp16 --frameworks hpcgpu --nccl-channels 8
train fp32_both 2 --warmup 3 --steps 20 --precisions fp32 --frameworks hpcgpu,torch
grep -c "destroy_process_group" "$OUT/train_fp32_both.log"
echo "done [$(el) s]"

#!/usr/bin/env bash
# Session 11, call 1 of the fused LayerNorm + GELU kernels (rows held in registers, one pass over
# memory per direction). 1) the kernel GPU tests (bitwise against the separate kernels, float64
# references, every kernel path); 2) the op-by-op profile at 16384 per GPU, fp32 and fp16, ours next
# to PyTorch's; 3) 2-GPU data-parallel jobs against PyTorch DDP at 16384 per GPU (fp32 with the
# default 25 MB buckets and with one bucket, fp16 default). 2 H200; no carry needed.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
git log -1 --format='commit %h %s' 2>/dev/null | cut -c1-100
timeout 300 python3 -m pytest -q -m gpu -x -p no:cacheprovider tests/apps/train/test_train_fused_kernels.py \
  tests/apps/train/test_train_layer_kernels.py > "$OUT/tests.log" 2>&1
rc=$?; echo "[kernel tests rc=$rc $(el) s]"; tail -4 "$OUT/tests.log"
if [ $rc -ne 0 ]; then grep -E "Error|error|assert" "$OUT/tests.log" | head -30; exit 1; fi
python3 -c "
import cupy
from apps.train import layernorm_kernels as k
for dtype, width in (('float32', 4), ('float16', 8)):
    for gelu in ('false', 'true'):
        kernel = k._kernel('hpcgpu_train_layer_norm_backward_rows', dtype, width, gelu)
        print(dtype, 'gelu', gelu, 'regs', kernel.num_regs, 'resident blocks',
              k._resident_blocks('hpcgpu_train_layer_norm_backward_rows', dtype, width, gelu, 256, 0))
"
timeout 200 python3 benchmarks/train_profile.py --batch 16384 --precisions fp32,fp16 --repeats 5 > "$OUT/profile.log" 2>&1
echo "[profile rc=$? $(el) s]"; sed -n '/^per-op/,$p' "$OUT/profile.log" | head -60
train() { local name=$1; shift
  timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py \
    --batch-per-gpu 16384 --warmup 3 --steps 20 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error" "$OUT/train_$name.log" | cut -c1-170; }
train fp32_b25 --precisions fp32 --frameworks hpcgpu
train fp32_torch --precisions fp32 --frameworks torch
train fp32_b1000 --precisions fp32 --frameworks hpcgpu --bucket-mb 1000
train fp16_b25 --precisions fp16 --frameworks hpcgpu
train fp16_torch --precisions fp16 --frameworks torch
echo "done [$(el) s]"

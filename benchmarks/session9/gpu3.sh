#!/usr/bin/env bash
# Session 9: where fp32's 4.5 ms per data-parallel step goes (the NCCL channel count does not change it,
# gpu2.sh): SM clock and power with and without communication for hpcgpu and PyTorch (--clocks), and
# 100 MB buckets (6 allreduces per step instead of 23). 2 H200, 16384 per GPU.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/nvidia_ml_py-*.whl
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  PYTHONPATH=/tmp/extra:$PWD timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 16384 \
    --warmup 3 --steps 20 --precisions fp32 --rounds 3 "$@" > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error|clock|MHz" "$OUT/train_$name.log" | cut -c1-220; }
train clocks_hpcgpu --frameworks hpcgpu --clocks
train clocks_torch --frameworks torch --clocks
train bucket100 --frameworks hpcgpu --bucket-mb 100
echo "done [$(el) s]"

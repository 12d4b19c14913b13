#!/usr/bin/env bash
# Session 9: hpcgpu's fp32 allreduce costs 16-21 MHz of SM clock (gpu3.sh), PyTorch's none. Which NCCL each
# framework loads, and hpcgpu with NCCL_PROTO=Simple (no LL/LL128 flag polling on the SMs). 2 H200, 16384/GPU.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/nvidia_ml_py-*.whl 2>/dev/null
python3 -c "import cupy.cuda.nccl as n; print('cupy NCCL', n.get_version())"
python3 -c "import torch; print('torch NCCL', torch.cuda.nccl.version(), torch.__version__)"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local name=$1; shift
  PYTHONPATH=/tmp/extra:$PWD timeout 150 mpirun -np 2 --bind-to none "$@" python3 benchmarks/train_ddp.py --batch-per-gpu 16384 \
    --warmup 3 --steps 20 --precisions fp32 --rounds 3 --frameworks hpcgpu --clocks > "$OUT/train_$name.log" 2>&1
  echo "[$name $*] rc=$? [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error|clocks" "$OUT/train_$name.log" | cut -c1-200; }
train simple -x NCCL_PROTO=Simple
train ll128 -x NCCL_PROTO=LL128
echo "done [$(el) s]"

#!/usr/bin/env bash
# Ran at tree b2e55bd; the --gemm-sm-margin option it measures was withdrawn afterwards (4ce9b42).
# Session 7, GPU call 2 (2 H200): (a) why the IF node was refused (variants of the driver calls); (b) train
# fp16 at 8192/GPU: cuBLAS planning for fewer SMs during backward (--gemm-sm-margin) with NCCL channel
# limits; (c) if IF nodes work: their GPU tests and the MD app with and without them.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "== conditional node diagnosis [$(el) s]"
timeout 60 python3 benchmarks/session7/conditional_diagnose.py 2>&1 | tail -25
echo "== train fp16 8192/GPU: NCCL channels / GEMM SM margin [$(el) s]"
train() { timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 20 \
   --warmup 5 --frameworks hpcgpu --precisions fp16 --rounds 7 --nccl-channels $1 --gemm-sm-margin $2 > $W/b.txt 2>&1
   echo "[channels $1, margin $2]"; grep -E "^hpcgpu |in-process|Error" $W/b.txt | cut -c1-260 || tail -4 $W/b.txt; }
train 0 0; train 8 8; train 16 16; train 0 16; train 0 32
if python3 -c "import sys; from hpcgpu.runtime import graph_conditional as g; sys.exit(0 if g.works(0) else 1)"; then
  echo "== IF nodes work: GPU tests [$(el) s]"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_graph_conditional.py \
    tests/apps/md/test_md_resident.py -k "if_node or conditional" > $W/t.txt 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|assert" $W/t.txt | head -20; tail -2 $W/t.txt
  md1() { timeout 90 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot \
          --output $W/o1 --summary $W/s1.json 2>&1 | grep -E "atom-steps|Error|error" | cut -c1-120; }
  md2() { timeout 120 mpirun -np 2 --bind-to none -x HPCGPU_GRAPH_CONDITIONALS=${HPCGPU_GRAPH_CONDITIONALS:-1} python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 \
          --steps 100 --precision fp32 --no-plot --output $W/o2 --summary $W/s2.json 2>&1 \
          | grep -E "atom-steps|Error|error" | cut -c1-120; }
  echo "== MD 2.05M/GPU with IF nodes / without (HPCGPU_GRAPH_CONDITIONALS=0) [$(el) s]"
  for round in 1 2; do
    md1; HPCGPU_GRAPH_CONDITIONALS=0 md1; md2; HPCGPU_GRAPH_CONDITIONALS=0 md2
  done
fi
echo "done [$(el) s]"
rm -rf $W

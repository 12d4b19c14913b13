#!/usr/bin/env bash
# Session 7, GPU call 4 (2 H200): IF nodes with one condition handle per node (call 3: a second node on one
# handle was refused); their GPU tests; the MD app with and without them at 2.05M and 16.4M atoms per GPU;
# the slab graph variants; train fp16 pairs with longer phases, alternately first, with clocks.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -c "import pynvml" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nvml .whl/nvidia_ml_py-*.whl
export PYTHONPATH=/tmp/nvml:$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "== IF node variants [$(el) s]"
timeout 60 python3 benchmarks/session7/conditional_diagnose2.py 2>&1 | tail -30
echo "== probe [$(el) s]"
timeout 60 python3 benchmarks/graph_conditional_probe.py 2>&1 | tail -8
timeout 60 python3 benchmarks/graph_conditional_probe.py --kernels 3 2>&1 | tail -6
if python3 -c "import sys; from hpcgpu.runtime import graph_conditional as g; sys.exit(0 if g.works(0) else 1)"; then
  echo "== GPU tests: IF nodes, resident, slab [$(el) s]"
  timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_graph_conditional.py \
    tests/apps/md/test_md_resident.py tests/apps/md/test_md_resident_slab.py > $W/t.txt 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|assert" $W/t.txt | head -20; tail -2 $W/t.txt
  md1() { timeout 90 python3 -m apps.md --backend cupy --cells $1 --steps 100 --precision fp32 --no-plot \
          --output $W/o1 --summary $W/s1.json 2>&1 | grep -E "atom-steps|neighbor_builds|Error|error" | cut -c1-120 | tr '\n' ' '; echo; }
  md2() { timeout 150 mpirun -np 2 --bind-to none -x HPCGPU_GRAPH_CONDITIONALS=${HPCGPU_GRAPH_CONDITIONALS:-1} \
          python3 -m apps.md --backend cupy --cells $((2*$1)),$1,$1 --dims 2,1,1 --steps 100 --precision fp32 \
          --no-plot --output $W/o2 --summary $W/s2.json 2>&1 | grep -E "atom-steps|neighbor_builds|Error|error" \
          | cut -c1-120 | tr '\n' ' '; echo; }
  echo "== MD 2.05M/GPU with IF nodes / without (HPCGPU_GRAPH_CONDITIONALS=0), alternated [$(el) s]"
  md1 80; HPCGPU_GRAPH_CONDITIONALS=0 md1 80; md2 80; HPCGPU_GRAPH_CONDITIONALS=0 md2 80; md1 80; md2 80
  echo "== slab graph variants [$(el) s]"
  timeout 120 mpirun -np 2 --bind-to none python3 benchmarks/md_slab_variants.py --cells 80 --reps 3 2>&1 | tail -10
  echo "== MD 16.4M/GPU with IF nodes [$(el) s]"
  md1 160; md2 160
fi
echo "== train fp16 8192/GPU, 60-step phases, alternately first, clocks [$(el) s]"
timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 60 --warmup 5 \
  --frameworks hpcgpu --precisions fp16 --rounds 7 --clocks > $W/b.txt 2>&1
grep -E "^hpcgpu |in-process|clocks rank|Error" $W/b.txt | cut -c1-300 || tail -4 $W/b.txt
echo "done [$(el) s]"
rm -rf $W

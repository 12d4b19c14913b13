#!/usr/bin/env bash
# Session 7, GPU call 1 (2 H200): (a) conditional graph nodes work here and what an IF node saves against
# 12 flagged kernels; (b) MD weak scaling 1 -> 2 GPUs at 8.2M and 16.4M atoms per GPU (peer exchange),
# alternated; (c) train fp16 in-process pairs at 8192/GPU with NVML clocks/power per phase (is the
# data-parallel backward slower because the power cap lowers the SM clock?).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -c "import pynvml" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nvml .whl/nvidia_ml_py-*.whl
export PYTHONPATH=/tmp/nvml:$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader
echo "== conditional-node probe [$(el) s]"
timeout 100 python3 benchmarks/graph_conditional_probe.py 2>&1 | tail -14
timeout 60 python3 benchmarks/graph_conditional_probe.py --kernels 3 2>&1 | tail -6
echo "== train fp16 8192/GPU with clocks [$(el) s]"
timeout 240 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 20 --warmup 5 \
  --frameworks hpcgpu --precisions fp16 --rounds 7 --clocks > $W/b.txt 2>&1
grep -E "^(hpcgpu|torch) |in-process|clocks rank|Error" $W/b.txt | cut -c1-400 || tail -5 $W/b.txt
timeout 200 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 20 --warmup 5 \
  --frameworks torch --precisions fp16 --rounds 3 --clocks > $W/b.txt 2>&1
grep -E "^(hpcgpu|torch) |in-process|clocks rank|Error" $W/b.txt | cut -c1-400 || tail -5 $W/b.txt
md1() { timeout 150 python3 -m apps.md --backend cupy --cells $1 --steps 100 --precision fp32 --no-plot \
          --output $W/o1 --summary $W/s1.json 2>&1 | grep -E "atom-steps|neighbor_builds|Error|error" | cut -c1-160; }
md2() { timeout 200 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells $((2*$1)),$1,$1 --dims 2,1,1 \
          --steps 100 --precision fp32 --no-plot --output $W/o2 --summary $W/s2.json 2>&1 \
          | grep -E "atom-steps|neighbor_builds|resident_steps|Error|error" | cut -c1-200; }
echo "== MD weak scaling at 8.2M / 16.4M atoms per GPU [$(el) s]"
for n in 127 160; do md1 $n; md2 $n; md1 $n; done
echo "done [$(el) s]"
rm -rf $W

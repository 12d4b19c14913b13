#!/usr/bin/env bash
# Session 6, GPU call 2 (2 H200): where the slab driver's extra time per step goes (graph variants with one
# part left out), the app's host-side phases on 2 GPUs against one, and the fp16 train scaling in-process
# at two batch sizes, hpcgpu and PyTorch DDP. Run from the repository root.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "== slab graph variants [$(el) s]"
timeout 200 mpirun -np 2 --bind-to none python3 benchmarks/md_slab_variants.py --cells 80 --reps 3 2>&1 | tail -12
echo "== app, 2 GPUs then 1 GPU [$(el) s]"
timeout 150 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 --steps 100 \
  --precision fp32 --no-plot --output $W/o2 --summary $W/s2.json 2>&1 | grep -A30 "steps of"
timeout 90 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot --output $W/o1 \
  --summary $W/s1.json 2>&1 | grep -A30 "steps of"
echo "== train fp16 in-process scaling [$(el) s]"
for batch in 2048 8192; do for fw in hpcgpu torch; do
  timeout 200 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks $fw --precisions fp16 \
    --batch-per-gpu $batch --steps 20 --warmup 5 --rounds 5 > $W/b.txt 2>&1
  echo "batch $batch $fw:"; grep -E "^(hpcgpu|torch) |in-process" $W/b.txt || tail -5 $W/b.txt
done; done
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "done [$(el) s]"
rm -rf $W

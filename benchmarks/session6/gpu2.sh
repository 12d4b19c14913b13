#!/usr/bin/env bash
# Session 6, GPU call 3 (2 H200): the slab step's NCCL costs inside graphs (parts done twice), MD weak scaling
# 1 -> 2 GPUs with the migrant messages sized from the atoms on the slab faces (no chunk redone in the timed
# loop), and the fp16 train scaling in-process at 8192 samples per GPU: NCCL default / 8 / 4 channels, peer.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "== slab graph variants [$(el) s]"
timeout 200 mpirun -np 2 --bind-to none python3 benchmarks/md_slab_variants.py --cells 80 --reps 3 2>&1 | tail -10
md1() { timeout 90 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot \
          --output $W/o1 --summary $W/s1.json 2>&1 | grep -E "atom-steps"; }
md2() { timeout 150 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 \
          --steps 100 --precision fp32 --no-plot --output $W/o2 --summary $W/s2.json 2>&1 | grep -E "atom-steps|resident_steps"; }
echo "== MD weak scaling, alternated [$(el) s]"
for round in 1 2 3; do md2; md1; done
echo "== train fp16 8192/GPU in-process scaling [$(el) s]"
for extra in "" "--nccl-channels 8" "--nccl-channels 4" "--allreduce peer"; do
  timeout 200 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 \
    --batch-per-gpu 8192 --steps 20 --warmup 5 --rounds 7 $extra > $W/b.txt 2>&1
  echo "[$extra]:"; grep -E "^hpcgpu |in-process" $W/b.txt | cut -c1-400 || tail -5 $W/b.txt
done
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "done [$(el) s]"
rm -rf $W

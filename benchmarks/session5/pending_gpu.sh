#!/usr/bin/env bash
# What session 5 could not run for lack of device time (2 H200, ~8 minutes): the per-part profile of the
# MD slab step (the ~1 ms per step that 2 GPUs lose against one), the 2-rank MD GPU tests that now run the
# slab driver, and the fp16 train scaling measured inside one job (--rounds). Run from the repository root.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "== slab step profile [$(el) s]"
timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/md_slab_profile.py --cells 80 --steps 100 2>&1 | tail -24
echo "== one-GPU step profile [$(el) s]"
timeout 120 python3 benchmarks/md_resident_profile.py --cells 80 --steps 100 2>&1 | tail -20
echo "== MD GPU tests on 2 ranks (slab driver) [$(el) s]"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -k ranks2 tests/apps/md > $W/t.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/t.txt | head; tail -1 $W/t.txt
echo "== train fp16, in-process scaling [$(el) s]"
for mode in nccl peer; do
  timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 \
    --allreduce $mode --steps 30 --warmup 10 --rounds 5 > $W/b.txt 2>&1; grep -E "^hpcgpu|in-process" $W/b.txt || tail -3 $W/b.txt
done
echo "done [$(el) s]"
rm -rf $W

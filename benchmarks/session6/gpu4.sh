#!/usr/bin/env bash
# Session 6, GPU call 5 (2 H200): the peer exchange of the MD slab driver (CUDA IPC stores) -- its GPU tests
# with the resident tests, graph variants under both exchanges, weak scaling 1 -> 2 GPUs alternated.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "== MD GPU tests: slab + resident [$(el) s]"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident_slab.py \
  tests/apps/md/test_md_resident.py > $W/t.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|error:|assert" $W/t.txt | head -30; tail -2 $W/t.txt
md1() { timeout 90 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot \
          --output $W/o1 --summary $W/s1.json 2>&1 | grep -E "atom-steps"; }
md2() { timeout 150 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 \
          --steps 100 --precision fp32 --no-plot --exchange $1 --output $W/o2 --summary $W/s2.json 2>&1 \
          | grep -E "atom-steps|resident_steps|Error|error" | cut -c1-200; }
echo "== MD weak scaling, alternated [$(el) s]"
md1
for round in 1 2 3; do md2 peer; md1; done
md2 nccl
echo "== slab graph variants [$(el) s]"
for exchange in peer nccl; do
  timeout 150 mpirun -np 2 --bind-to none python3 benchmarks/md_slab_variants.py --cells 80 --reps 3 --exchange $exchange 2>&1 | tail -9
done
echo "done [$(el) s]"
rm -rf $W

#!/usr/bin/env bash
# Session 6, GPU call 4 (2 H200): MD GPU tests (slab + resident, after the migrant-capacity change); MD 2-GPU
# app runs under NCCL p2p chunk sizes (the slab step's NCCL sends are ~0.7-1.3 MB); fp16 train scaling
# in-process at 8192 samples per GPU with other bucket sizes.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
md1() { timeout 90 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot \
          --output $W/o1 --summary $W/s1.json 2>&1 | grep -E "atom-steps"; }
md2() { timeout 150 mpirun -np 2 --bind-to none $1 python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 \
          --steps 100 --precision fp32 --no-plot --output $W/o2 --summary $W/s2.json 2>&1 | grep -E "atom-steps"; }
echo "== MD: NCCL p2p chunk size [$(el) s]"
md1
for chunk in 524288 131072 65536 524288 131072 65536; do echo "chunk $chunk:"; md2 "-x NCCL_P2P_NVL_CHUNKSIZE=$chunk"; done
md1
echo "== train fp16 8192/GPU in-process scaling, bucket sizes [$(el) s]"
for extra in "--bucket-mb 10" "--bucket-mb 50" "--allreduce peer --bucket-mb 50"; do
  timeout 200 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 \
    --batch-per-gpu 8192 --steps 20 --warmup 5 --rounds 9 $extra > $W/b.txt 2>&1
  echo "[$extra]:"; grep -E "^hpcgpu |in-process" $W/b.txt | cut -c1-260 || tail -5 $W/b.txt
done
echo "== MD GPU tests: slab + resident [$(el) s]"
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident_slab.py \
  tests/apps/md/test_md_resident.py > $W/t.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|error:" $W/t.txt | head -20; tail -2 $W/t.txt
echo "done [$(el) s]"
rm -rf $W

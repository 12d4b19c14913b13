#!/usr/bin/env bash
# Session 6, GPU call 6 (2 H200): train scaling and PyTorch comparison at 8192 samples per GPU (fp16 with 11
# in-process rounds, PyTorch fp16, fp32 both), then the MD GPU tests on 2 ranks that now run the slab driver
# with the peer exchange (test_md_distributed_gpu, test_md_gpu_fast) and a 32k-atom fp64 slab run.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
train() { timeout 220 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 20 \
         --warmup 5 "$@" > $W/b.txt 2>&1; echo "[$*]:"; grep -E "^(hpcgpu|torch) |in-process|PyTorch" $W/b.txt | cut -c1-300 || tail -5 $W/b.txt; }
echo "== train 8192/GPU [$(el) s]"
train --frameworks hpcgpu --precisions fp16 --rounds 11
train --frameworks torch --precisions fp16 --rounds 5
train --frameworks hpcgpu,torch --precisions fp32 --steps 8 --warmup 2 --rounds 3
echo "== MD GPU tests on 2 ranks (slab, peer) [$(el) s]"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -k ranks2 tests/apps/md/test_md_distributed_gpu.py \
  tests/apps/md/test_md_gpu_fast.py > $W/t.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|error:|assert" $W/t.txt | head -20; tail -2 $W/t.txt
echo "== MD 32k fp64, 2 GPUs slab peer / nccl / default driver [$(el) s]"
for mode in "--exchange peer" "--exchange nccl" "--resident off"; do
  timeout 90 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 20 --dims 2,1,1 --steps 100 \
    --precision fp64 --no-plot $mode --output $W/o --summary $W/s.json 2>&1 | grep -E "^ +100 |atom-steps" | tr -s ' '
done
echo "done [$(el) s]"
rm -rf $W

#!/usr/bin/env bash
# Session 7, GPU call 7 (2 H200, last): (a) every MD GPU test in suite order (call 5's whole suite failed
# test_resident_runs_are_reproducible_and_fp32_tracks_fp64[ranks2] once; alone it passed 3 of 3 in call 6),
# printing any failure in full; (b) train fp16 at 8192/GPU: 50 MB against 25 MB buckets once more, and
# PyTorch DDP with 50 MB buckets (60-step phases, alternately first).
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
train() { local label=$1; shift
  timeout 80 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 60 \
    --warmup 5 --precisions fp16 "$@" > $W/b.txt 2>&1
  echo "[$label] [$(el) s]"; grep -E "^(hpcgpu|torch) |in-process|Error|x$" $W/b.txt | cut -c1-200 || tail -3 $W/b.txt; }
echo "== train fp16 [$(el) s]"
train "hpcgpu NCCL 50 MB" --rounds 7 --frameworks hpcgpu --bucket-mb 50
train "hpcgpu NCCL 25 MB" --rounds 7 --frameworks hpcgpu
train "hpcgpu NCCL 50 MB" --rounds 7 --frameworks hpcgpu --bucket-mb 50
train "PyTorch DDP 50 MB" --rounds 5 --frameworks torch --bucket-mb 50
echo "== MD GPU tests [$(el) s]"
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md > $W/t.txt 2>&1
echo "rc=$? [$(el) s]"; grep -E "^(FAILED|ERROR)" $W/t.txt | head; tail -1 $W/t.txt
grep -E "^\[rank|^E |Error|assert" $W/t.txt | head -40
echo "done [$(el) s]"
rm -rf $W

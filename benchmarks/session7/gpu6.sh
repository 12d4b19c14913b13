#!/usr/bin/env bash
# Session 7, GPU call 6 (2 H200): (a) the test that failed in the whole suite (call 5),
# test_resident_runs_are_reproducible_and_fp32_tracks_fp64[ranks2], twice with IF nodes and once without,
# with its assertion message; (b) train fp16 at 8192/GPU, 60-step phases alternately first (the method of
# call 4): bucket size, NCCL protocol, copy-engine allreduce.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
t() { timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident.py \
        -k "reproducible and ranks2" > $W/t.txt 2>&1; echo "rc=$? [$(el) s]"
      grep -E "^E |Error|assert|mismatch|Max" $W/t.txt | head -14; tail -1 $W/t.txt; }
echo "== reproducible test, 2 ranks, IF nodes [$(el) s]"; t; t
echo "== the same without IF nodes"; HPCGPU_GRAPH_CONDITIONALS=0 t
train() { local label=$1; shift
  timeout 100 mpirun -np 2 --bind-to none "$@" python3 benchmarks/train_ddp.py --batch-per-gpu 8192 --steps 60 \
    --warmup 5 --precisions fp16 --rounds 7 --frameworks hpcgpu $TRAIN_ARGS > $W/b.txt 2>&1
  echo "[$label] [$(el) s]"; grep -E "^hpcgpu |in-process|Error" $W/b.txt | cut -c1-200 || tail -3 $W/b.txt; }
echo "== train fp16 [$(el) s]"
TRAIN_ARGS="" train "NCCL 25 MB"
TRAIN_ARGS="--bucket-mb 50" train "NCCL 50 MB"
TRAIN_ARGS="" train "NCCL 25 MB, NCCL_PROTO=Simple" -x NCCL_PROTO=Simple
TRAIN_ARGS="--allreduce peer --bucket-mb 50" train "peer 50 MB"
echo "done [$(el) s]"
rm -rf $W

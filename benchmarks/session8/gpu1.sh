#!/usr/bin/env bash
# Session 8, GPU call 1 (2 H200; ~100 s of device time were left): the first GPU run of 6a2c5a6 (chunk graph
# capture moved into ChunkedGraphSteps): the resident reproducibility test on 2 GPUs (slab driver; the one
# that failed once in session 7) and on 1 GPU (one-GPU driver), full logs under $OUT.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s)
for k in "reproducible and ranks2" "reproducible and ranks1" "if_nodes and ranks2"; do
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident.py -k "$k" >> $OUT/tests.log 2>&1
  echo "[$k] rc=$? [$(( $(date +%s) - T0 )) s]" | tee -a $OUT/summary.txt
done

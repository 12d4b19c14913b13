#!/usr/bin/env bash
# Session 4, last GPU call (2 H200): the final tree's train data-parallel GPU tests (test helper moved into
# distributed_cases.py) and resident MD tests, and the in.lj 32k app run once more.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/train/test_train_peer_reduce_gpu.py \
  tests/apps/train/test_train_distributed_gpu.py tests/apps/md/test_md_resident.py > $W/t.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/t.txt | head; tail -1 $W/t.txt
for r in 1 2; do
  timeout 60 python3 -m apps.md --backend cupy --cells 20 --steps 100 --precision fp32 --no-plot --output $W/md > $W/md.txt 2>&1
  grep -E "atom-steps" $W/md.txt
done
rm -rf $W

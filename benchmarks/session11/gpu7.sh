#!/usr/bin/env bash
# Session 11, call 7: the kernel GPU tests after the LayerNorm parameter-gradient tile sum moved into
# one device function (sum_row_lanes); the same additions in the same order. 2 H200.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/apps/train/test_train_fused_kernels.py \
  tests/apps/train/test_train_layer_kernels.py tests/apps/train/test_train_gpu.py 2>&1 | tail -5

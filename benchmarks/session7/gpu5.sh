#!/usr/bin/env bash
# Session 7, GPU call 5 (2 H200): the whole GPU test suite at this tree (IF nodes in the MD graphs, the
# ChunkedGraphSteps base class, train_ddp changes), with the mnist1d wheel carried for the train app test.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/mnist1d-*.whl .whl/nvidia_ml_py-*.whl
export PYTHONPATH=/tmp/extra:$PWD
T0=$(date +%s)
timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu tests > /tmp/suite.txt 2>&1
echo "rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)" /tmp/suite.txt | head -30
tail -3 /tmp/suite.txt

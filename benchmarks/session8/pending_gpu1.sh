#!/usr/bin/env bash
# Pending (written in session 8, which had no device time): the first GPU call of the next session, 2 H200.
# The whole GPU suite at this tree -- first GPU run of 6a2c5a6 (chunk graph capture in ChunkedGraphSteps)
# and 5586457 (hpcgpu.runtime.capture; the slab driver's finaliser waits for a capture it lands in; new
# test_a_driver_collected_during_the_next_ones_capture_changes_nothing) -- with the whole log under $OUT.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/mnist1d-*.whl .whl/nvidia_ml_py-*.whl
export PYTHONPATH=/tmp/extra:$PWD
T0=$(date +%s)
timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests > $OUT/suite.log 2>&1
echo "rc=$? after $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -30
tail -3 $OUT/suite.log

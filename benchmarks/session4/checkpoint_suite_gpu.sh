#!/usr/bin/env bash
# Session 4, GPU call 5 (1 H200): checkpoint write throughput on the GPU machine's disk (write-behind),
# the async-checkpoint step-time overhead on the default SWE run, and the one-GPU part of the GPU suite.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
df -h /tmp | tail -1
echo "== 1. checkpoint throughput, 1 GiB per rank, 5 rounds [$(el) s]"
timeout 200 python3 benchmarks/checkpoint_io.py --mib-per-rank 1024 --repeats 5 --phases --async --dir $W/ck 2>&1 | tail -22
echo "== 2. async checkpoint overhead, default SWE run on 1 GPU, layout process [$(el) s]"
timeout 110 python3 benchmarks/checkpoint_overhead_app.py --backend cupy --blocks 20 2>&1 | tail -4
echo "== 3. GPU suite, one-GPU parametrisations [$(el) s]"
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests -k "not ranks2" > $W/suite.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/suite.txt | head -10; tail -1 $W/suite.txt
echo "done [$(el) s]"
rm -rf $W

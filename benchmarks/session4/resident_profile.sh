#!/usr/bin/env bash
# Session 4, GPU calls 3-4 (1 H200): resident MD tests, per-kernel device time of the resident step, and
# the app at 32k / 2.05M atoms (resident auto vs off, 2 repeats).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d)
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident.py tests/apps/md/test_md_graph.py \
  tests/apps/md/test_md_gpu.py > $W/t.txt 2>&1; echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|Error" $W/t.txt | head; tail -1 $W/t.txt
timeout 200 python3 benchmarks/md_resident_profile.py --cells 20 80 --steps 100 2>&1 | tail -30
for r in 1 2; do for cells in 20 80; do for mode in auto off; do
  timeout 120 python3 -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --no-plot --resident $mode \
    --output $W/md > $W/md.txt 2>&1 || tail -5 $W/md.txt
  printf "cells %s resident %-4s | " $cells $mode; grep -E "atom-steps|^compute" $W/md.txt | tr -s ' ' | tr '\n' '|'; echo
done; done; done
grep -E "^ *(0|50|100) " $W/md.txt | head -3
rm -rf $W

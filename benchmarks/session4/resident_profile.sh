#!/usr/bin/env bash
# Session 4, GPU call 3 (1 H200): per-kernel device time of the resident MD step, and the app at 32k / 2.05M.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d)
timeout 200 python3 benchmarks/md_resident_profile.py --cells 20 80 --steps 100 2>&1 | tail -30
for cells in 20 80; do for mode in auto off; do
  timeout 120 python3 -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --no-plot --resident $mode \
    --output $W/md > $W/md.txt 2>&1 || tail -5 $W/md.txt
  printf "cells %s resident %-4s | " $cells $mode; grep -E "atom-steps|^compute" $W/md.txt | tr -s ' ' | tr '\n' '|'; echo
done; done
rm -rf $W

#!/usr/bin/env bash
# Session 4, GPU calls 1-2 (1 H200 lent; the 2-GPU parts skip or fail on one GPU): the device-resident MD driver (tests and 32k / 2.05M benchmarks,
# resident vs the default driver), then the session-3 tree's unvalidated GPU paths (MD graph / distributed /
# fast tests, halo tests, Jacobi app schedules incl. --peer-halo) and Jacobi --peer-halo --graph x 3.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
echo "== 1. resident MD tests [$(el) s]"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident.py -s > $W/t1.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)|Error|builds" $W/t1.txt | head -12; tail -1 $W/t1.txt
echo "== 2. MD in.lj 32k and 2.05M atoms, 1 GPU, resident auto vs off, 2 repeats [$(el) s]"
timeout 120 python3 -m apps.md --backend cupy --cells 8 --steps 40 --precision fp32 --quiet --no-plot --output $W/warm > /dev/null 2>&1
for r in 1 2; do for cells in 20 80; do for mode in auto off; do
  timeout 120 python3 -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --no-plot --resident $mode \
    --output $W/md --summary $W/md_${cells}_${mode}_$r.json > $W/md.txt 2>&1 || tail -5 $W/md.txt
  printf "cells %s resident %-4s | " $cells $mode
  grep -E "atom-steps|^compute|neighbor_builds|resident_steps" $W/md.txt | tr -s ' ' | tr '\n' '|'; echo
done; done; done
grep -E "^ *(0|50|100) " $W/md.txt | head -3
echo "== 3. MD GPU tests of the default driver and the halo tests [$(el) s]"
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md tests/core/test_halo_gpu.py \
  --deselect tests/apps/md/test_md_resident.py > $W/t3.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)|Error|error:" $W/t3.txt | sort | uniq -c | sort -rn | head -12; tail -1 $W/t3.txt
echo "== 4. Jacobi app GPU tests (schedules incl. --peer-halo) [$(el) s]"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/stencil/jacobi tests/apps/stencil/test_stencil_app.py > $W/t4.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/t4.txt | head -8; tail -1 $W/t4.txt
echo "== 5. jacobi 16384^2 x 1000, 2 GPUs, --peer-halo --graph, 3 repeats [$(el) s]"
NGPU=$(nvidia-smi -L | wc -l)
for r in 1 2 3; do
  [ "$NGPU" -lt 2 ] && { echo "skipped: $NGPU GPU(s)"; break; }
  timeout 90 mpirun -np 2 --bind-to none python3 -m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 \
    --nan-check-every 0 --quiet --no-plot --peer-halo --graph --output $W/j --summary $W/j$r.json > $W/j.txt 2>&1 \
    && python3 -c "import json;s=json.load(open('$W/j$r.json'));print('jacobi peer-halo graph 2 GPUs wall', round(s['wall_seconds'],4), s['checksum'][:20])" || tail -3 $W/j.txt
done
echo "== summary [$(el) s]"
python3 - $W <<'PY'
import json, sys, glob
w = sys.argv[1]
print(f"{'atoms':>9} {'resident':>8} {'repeat':>6} {'atom-steps/s':>13} {'builds':>6}")
for f in sorted(glob.glob(f"{w}/md_*.json")):
    s = json.load(open(f)); _, cells, mode, r = f.rsplit("/", 1)[1][:-5].split("_")
    print(f"{s['n_atoms']:>9} {mode:>8} {r:>6} {s['throughput']:>13.4g} {s['diagnostics']['neighbor_builds']!s:>6}")
PY
rm -rf $W

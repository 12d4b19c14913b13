#!/usr/bin/env bash
# Session 3, GPU call 4 (2 H200): jacobi --peer-halo (rows stored into the neighbours' ghost rows over
# CUDA IPC, device-side counters) against the CPU checksum and timed; the MD graph test after the
# stream fix and one 2.05M-atom run for its phase split.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
echo "== 1. jacobi 16384^2 on 2 GPUs [$(el) s]"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --norm-every 1000 --nan-check-every 0 --quiet --no-plot"
for flags in "--steps 1000 --peer-halo" "--steps 1000 --peer-halo" "--steps 1000 --peer-halo --graph" "--steps 3000 --peer-halo" "--steps 1000"; do
  timeout 40 mpirun -np 2 --bind-to none python3 $J $flags --output $W/j --summary $W/j.json > $W/j.txt 2>&1 \
    && python3 -c "import json;s=json.load(open('$W/j.json'));t=s['timers'];print('$flags'.ljust(34), 'wall', round(s['wall_seconds'],4), 'compute', round(t.get('compute',{}).get('max',0),4), 'comm', round(t.get('communication',{}).get('max',0),4), 'graph', s['extra']['graph'] if 'extra' in s else '', s['checksum'][:20])" \
    || { echo "$flags failed"; tail -4 $W/j.txt; }
done
echo "== 2. jacobi app GPU tests (peer-halo, peer-halo-graph, overlap) and the MD graph test [$(el) s]"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/stencil/jacobi/test_jacobi_gpu.py -k "app_schedules and (peer or graph)" \
  > $W/t.txt 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error" $W/t.txt | head -8; tail -1 $W/t.txt
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_graph.py > $W/t2.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)|Error" $W/t2.txt | head -6; tail -1 $W/t2.txt
echo "== 3. MD 2.05M atoms, 1 GPU, phases [$(el) s]"
timeout 60 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot --output $W/md > $W/md.txt 2>&1 || tail -4 $W/md.txt
grep -E "atom-steps|^communication|^compute|^neighbor |^thermo" $W/md.txt
echo "done [$(el) s]"
rm -rf $W

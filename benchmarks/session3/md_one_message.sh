#!/usr/bin/env bash
# Session 3: MD ghost refresh with one NCCL message per peer (instead of one per direction): the GPU
# ghost test and distributed thermo test, then 2.05M atoms per GPU on 1 and 2 GPUs.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d)
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_distributed_gpu.py \
  "tests/apps/md/test_md_gpu_fast.py::test_device_ghost_exchange_matches_host" > $W/t.txt 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)|Error:" $W/t.txt | head -6; tail -1 $W/t.txt
timeout 60 python3 -m apps.md --backend cupy --cells 8 --steps 40 --precision fp32 --quiet --no-plot --output $W/warm > /dev/null 2>&1
for n in 1 2; do
  cells=80; [ $n = 2 ] && cells="160,80,80 --dims 2,1,1"
  timeout 60 mpirun -np $n --bind-to none python3 -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --no-plot \
    --output $W/md$n --summary $W/md$n.json > $W/md$n.txt 2>&1 || tail -5 $W/md$n.txt
  grep -E "atom-steps|^communication|^compute|^neighbor " $W/md$n.txt | tr -s ' ' | tr '\n' '|'; echo
done
python3 -c "
import json
one, two = (json.load(open(f'$W/md{n}.json')) for n in (1, 2))
print(f'1 GPU {one[\"throughput\"]:.3e}, 2 GPUs {two[\"throughput\"]:.3e}: weak efficiency {100 * two[\"throughput\"] / (2 * one[\"throughput\"]):.1f}%')"
rm -rf $W

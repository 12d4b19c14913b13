#!/usr/bin/env bash
# Session 3, last GPU call (2 H200): MD ghost builds over NCCL (tests + 1 -> 2 GPU weak scaling), the NCCL
# in-flight halo test, Jacobi 2-GPU repeats, and the in-process async-checkpoint overhead benchmark.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
echo "== 1. MD distributed + fast GPU tests, halo in-flight test [$(el) s]"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_distributed_gpu.py tests/apps/md/test_md_gpu_fast.py \
  tests/core/test_halo_gpu.py > $W/t.txt 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error:" $W/t.txt | head -8; tail -1 $W/t.txt
echo "== 2. MD 2.05M atoms per GPU, 1 and 2 GPUs [$(el) s]"
timeout 120 python3 -m apps.md --backend cupy --cells 8 --steps 40 --precision fp32 --quiet --no-plot --output $W/warm > /dev/null 2>&1
for r in 1 2; do for n in 1 2; do
  cells=80; [ $n = 2 ] && cells="160,80,80 --dims 2,1,1"
  timeout 150 mpirun -np $n --bind-to none python3 -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --no-plot \
    --output $W/md$n --summary $W/md$n$r.json > $W/md$n.txt 2>&1 || tail -5 $W/md$n.txt
  grep -E "atom-steps|^communication|^compute|^neighbor|neighbor_builds" $W/md$n.txt | tr -s ' ' | tr '\n' '|'; echo
done; done
python3 - $W <<'PY'
import json, sys
w = sys.argv[1]
for r in (1, 2):
    try:
        one, two = (json.load(open(f"{w}/md{n}{r}.json")) for n in (1, 2))
        print(f"repeat {r}: 1 GPU {one['throughput']:.3e}, 2 GPUs {two['throughput']:.3e} atom-steps/s -> weak efficiency "
              f"{100 * two['throughput'] / (2 * one['throughput']):.1f}% (target >= 95%)")
    except (OSError, KeyError, ValueError) as error:
        print("MD runs incomplete:", error)
PY
echo "== 3. jacobi 16384^2 x 1000, 2 GPUs, NCCL overlap, 3 repeats [$(el) s]"
for r in 1 2 3; do
  timeout 90 mpirun -np 2 --bind-to none python3 -m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 \
    --nan-check-every 0 --quiet --no-plot --output $W/j --summary $W/j$r.json > $W/j.txt 2>&1 \
    && python3 -c "import json;s=json.load(open('$W/j$r.json'));print('jacobi 2 GPUs wall', round(s['wall_seconds'],4), s['checksum'][:20])" || tail -3 $W/j.txt
done
echo "== 4. async checkpoint overhead, in one process, default SWE run on 1 GPU [$(el) s]"
for layout in 1 0; do
  echo "layout process $layout:"
  HPCGPU_CHECKPOINT_LAYOUT_PROCESS=$layout timeout 100 python3 benchmarks/checkpoint_overhead_app.py --backend cupy --blocks 20 2>&1 | tail -4
done
echo "done [$(el) s]"
rm -rf $W

#!/usr/bin/env bash
# Session 5, GPU call 1 (2 H200): the slab driver (apps.md.resident_slab) -- its GPU tests on 2 ranks and the
# one-GPU resident tests, then MD weak scaling 1 -> 2 GPUs at 2.05M atoms per GPU, runs alternated.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
show() {  # $1 = label, $2 = output text, $3 = summary json
  printf "%-28s | " "$1"; grep -E "atom-steps|^communication|^compute|^neighbor " $2 | tr -s ' ' | tr '\n' '|'
  python3 - "$3" <<'PY' 2>/dev/null || tail -4 $2
import json, sys
s = json.load(open(sys.argv[1]))
t = s.get("timers", {}) or s.get("phases", {})
r = s.get("resident_steps") or {}
print("| builds", s.get("diagnostics", {}).get("neighbor_builds"), "| redone", r.get("chunks_redone"),
      "| phases", {k: round(v, 4) if isinstance(v, float) else v for k, v in (t.items() if isinstance(t, dict) else [])})
PY
}
md1() { timeout 90 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot --resident ${1:-auto} \
          --output $W/o1 --summary $W/s1.json > $W/m1.txt 2>&1; show "1 GPU 2.05M ${1:-auto}" $W/m1.txt $W/s1.json; }
md2() { timeout 150 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 --steps 100 \
          --precision fp32 --no-plot --resident ${1:-auto} --output $W/o2 --summary $W/s2.json > $W/m2.txt 2>&1
        show "2 GPUs 4.1M ${1:-auto}" $W/m2.txt $W/s2.json; }
echo "== tests [$(el) s]"
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_resident_slab.py \
  tests/apps/md/test_md_resident.py tests/apps/md/test_md_distributed_gpu.py tests/apps/md/test_md_gpu_fast.py > $W/t.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|error:|\[rank" $W/t.txt | head -30; tail -2 $W/t.txt
echo "== MD weak scaling [$(el) s]"
md1 auto   # discarded (clocks)
for round in 1 2 3; do md2 auto; md1 auto; done
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
echo "done [$(el) s]"
rm -rf $W

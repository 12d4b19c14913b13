#!/usr/bin/env bash
# Last GPU call of session 2: the train and MD GPU tests of the last round, and the async-checkpoint
# overhead on the small default SWE run and on the GPU-bound SWE benchmark size.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d)
echo "== train GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/train/test_train_fused_kernels.py \
  tests/apps/train/test_train_layer_kernels.py tests/apps/train/test_train_gpu.py > $W/t.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/t.txt | head -10; tail -1 $W/t.txt
echo "== md GPU tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/md/test_md_graph.py tests/apps/md/test_md_gpu_fast.py > $W/m.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/m.txt | head -10; tail -1 $W/m.txt
echo "== async checkpoint overhead (wall s; plain vs --checkpoint-every 100 --async-checkpoint)"
run() {  # label repeats args...
  local label=$1 repeats=$2; shift 2
  local plain="" async=""
  for r in $(seq $repeats); do
    timeout 60 python3 -m apps.stencil --model swe --quiet --no-plot --snapshot-every 0 --nan-check-every 0 "$@" \
      --output $W/p --summary $W/p.json > /dev/null 2>&1 && plain="$plain $(python3 -c "import json;print(round(json.load(open('$W/p.json'))['wall_seconds'],3))")"
    timeout 60 python3 -m apps.stencil --model swe --quiet --no-plot --snapshot-every 0 --nan-check-every 0 "$@" \
      --checkpoint-every 100 --async-checkpoint --checkpoint-dir $W/c$r --output $W/a --summary $W/a.json > /dev/null 2>&1 \
      && async="$async $(python3 -c "import json;print(round(json.load(open('$W/a.json'))['wall_seconds'],3))")"
  done
  python3 - "$label" "$plain" "$async" <<'PY'
import statistics, sys
label, plain, ckpt = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
if plain and ckpt:
    print(f"{label}: plain {plain} async {ckpt}: median {100*(statistics.median(ckpt)/statistics.median(plain)-1):+.1f}%, best-of {100*(min(ckpt)/min(plain)-1):+.1f}%")
else:
    print(label, "failed", plain, ckpt)
PY
}
run "swe 360x180 (default), 2 days" 3 --days 2
run "swe 8192x4096, 300 steps" 2 --nx 8192 --ny 4096 --steps 300
rm -rf $W

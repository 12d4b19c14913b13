#!/usr/bin/env bash
# Session 10, device call 1: the MNIST-1D quality runs on H200 with the new default recipes
# (mlp: lr 2e-2, weight decay 0.3; cnn: lr 3e-2, weight decay 0.1, warm-up 100 + cosine).
# 1) each default command alone, timed (the README states these wall times);
# 2) seed sweeps: 16 seeds on 1 GPU (8 runs at a time over both GPUs), 8 seeds on 2 GPUs (4 at a time).
# Carry the mnist1d wheel: carry [".whl"].
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/mnist1d-*.whl
export PYTHONPATH=/tmp/extra:$PWD
REPO=$PWD; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
mkdir -p /tmp/quality && cd /tmp/quality
timeout 120 python3 -m apps.train --steps 1 --quiet --no-plot   # generate and cache MNIST-1D once
quality() { local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 200 "$@" --summary "$name.json" > "$name.log" 2>&1; local rc=$?
  local t1=$(date +%s.%N)
  printf '%-12s rc=%s wall %6.1f s  %s\n' "$name" "$rc" "$(python3 -c "print($t1 - $t0)")" \
    "$(grep -oE '^[0-9]+ steps in [0-9.]+ s|^test_accuracy.*' "$name.log" | tr -s ' ' | tr '\n' ' ')"; }
quality mlp_1gpu python3 -m apps.train
quality cnn_1gpu python3 -m apps.train --model cnn
quality mlp_2gpu mpirun -np 2 --bind-to none python3 -m apps.train
quality cnn_2gpu mpirun -np 2 --bind-to none python3 -m apps.train --model cnn
echo "[timed runs done $(el) s]"
sweep() { local name=$1; shift
  timeout 280 python3 $REPO/benchmarks/train_quality_seeds.py --backend cupy --json $OUT/sweep_$name.json "$@" \
    > sweep_$name.log 2>&1; echo "[$name rc=$? $(el) s]"; tail -3 sweep_$name.log; }
sweep mlp_1gpu --model mlp --seeds 0-15 --jobs 8 --gpus 2
sweep cnn_1gpu --model cnn --seeds 0-15 --jobs 8 --gpus 2
sweep mlp_2gpu --model mlp --seeds 0-7 --jobs 4 --ranks 2 --mpiexec mpirun --mpiexec-flags="--bind-to none"
sweep cnn_2gpu --model cnn --seeds 0-7 --jobs 4 --ranks 2 --mpiexec mpirun --mpiexec-flags="--bind-to none"
tar czf "$OUT/quality_logs.tgz" *.log *.json
echo "done [$(el) s]"

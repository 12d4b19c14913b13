#!/usr/bin/env bash
# Pending (written in session 9, after its device time was spent): issue 6 asks the README to say how long
# the MNIST-1D quality runs take on the GPU as well as on the CPU (docs/train.md has the CPU table).
# The default MLP and the CNN, 1 and 2 H200, each run twice (the first may generate the dataset);
# prints wall time and test accuracy per run. Carry the mnist1d wheel: carry [".whl"].
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/extra .whl/mnist1d-*.whl
export PYTHONPATH=/tmp/extra:$PWD
mkdir -p /tmp/quality && cd /tmp/quality   # the runs write data/ and output/ here; one tar comes back
quality() { local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 200 "$@" --summary "$name.json" > "$name.log" 2>&1; local rc=$?
  local t1=$(date +%s.%N)
  printf '%-12s rc=%s wall %6.1f s  %s\n' "$name" "$rc" "$(python3 -c "print($t1 - $t0)")" \
    "$(grep -oE '^backend: [a-z]+|^test_accuracy.*' "$name.log" | tr -s ' ' | tr '\n' ' ')"; }
for round in 1 2; do
  quality mlp_1gpu_$round python3 -m apps.train
  quality cnn_1gpu_$round python3 -m apps.train --model cnn
  quality mlp_2gpu_$round mpirun -np 2 --bind-to none python3 -m apps.train
  quality cnn_2gpu_$round mpirun -np 2 --bind-to none python3 -m apps.train --model cnn
done
grep -h -E "^backend" mlp_1gpu_2.log mlp_2gpu_2.log
tar czf "$OUT/quality_logs.tgz" *.log *.json

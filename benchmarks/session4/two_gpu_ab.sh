#!/usr/bin/env bash
# Session 4, GPU call 7 (2 H200): clocks; MD 2-GPU run at HEAD and at e903148 (session 3's measured tree)
# on the same machine, the 1-GPU 2.05M baselines; train fp16 1 GPU and 2 GPUs nccl / peer, longer runs.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
HERE=$PWD; W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
mkdir -p $W/old && tar -xf $HERE/.snap_old.tar -C $W/old
md2() {  # $1 = tree
  (cd $1 && PYTHONPATH=$1 timeout 100 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 \
    --steps 100 --precision fp32 --no-plot --output $W/md > $W/md.txt 2>&1 || tail -5 $W/md.txt)
  grep -E "atom-steps|^communication|^compute|^neighbor " $W/md.txt | tr -s ' ' | tr '\n' '|'; echo
}
echo "== MD 2 GPUs, HEAD [$(el) s]"; md2 $HERE
echo "== MD 2 GPUs, e903148 [$(el) s]"; md2 $W/old
echo "== MD 2 GPUs, HEAD again [$(el) s]"; md2 $HERE
export PYTHONPATH=$HERE
for mode in off auto; do
  timeout 60 python3 -m apps.md --backend cupy --cells 80 --steps 100 --precision fp32 --no-plot --resident $mode --output $W/md1 > $W/md1.txt 2>&1
  printf "MD 1 GPU 2.05M resident %s | " $mode; grep -E "atom-steps|^compute" $W/md1.txt | tr -s ' ' | tr '\n' '|'; echo
done
echo "== train fp16 [$(el) s]"
timeout 90 mpirun -np 1 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 --steps 30 --warmup 10 > $W/b1.txt 2>&1; grep -E "^hpcgpu" $W/b1.txt || tail -3 $W/b1.txt
for mode in nccl peer nccl; do
  timeout 100 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 --allreduce $mode \
    --steps 30 --warmup 10 > $W/b2.txt 2>&1; grep -E "^hpcgpu" $W/b2.txt || tail -3 $W/b2.txt
done
nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
echo "done [$(el) s]"
rm -rf $W

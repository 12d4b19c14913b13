#!/usr/bin/env bash
# Session 4, GPU call 6 (2 H200): the copy-engine allreduce of apps.train (tests, fp16 benchmark against
# NCCL), the peer-halo Jacobi tests and timing, MD on 2 GPUs, and the suite's 2-rank parametrisations.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
echo "== 1. train peer + NCCL data-parallel GPU tests, Jacobi peer tests [$(el) s]"
ls .whl/mnist1d-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/mn .whl/mnist1d-*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/mn
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/train/test_train_peer_reduce_gpu.py \
  tests/apps/train/test_train_distributed_gpu.py > $W/t1.txt 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)|Error|differ" $W/t1.txt | head -12; tail -1 $W/t1.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/stencil/jacobi/test_jacobi_gpu.py -k peer > $W/t1b.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)" $W/t1b.txt | head; tail -1 $W/t1b.txt
echo "== 2. train fp16, 1 GPU and 2 GPUs with nccl / peer [$(el) s]"
timeout 90 mpirun -np 1 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 --json $W/t1g.json > $W/b1.txt 2>&1 || tail -5 $W/b1.txt
for mode in nccl peer; do
  timeout 100 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 --allreduce $mode \
    --json $W/t2g_$mode.json > $W/b2_$mode.txt 2>&1 || tail -8 $W/b2_$mode.txt
done
tail -4 $W/b1.txt; tail -4 $W/b2_nccl.txt; tail -4 $W/b2_peer.txt
echo "== 3. jacobi 16384^2 x 1000, 2 GPUs, --peer-halo --graph x 3 [$(el) s]"
for r in 1 2 3; do
  timeout 60 mpirun -np 2 --bind-to none python3 -m apps.stencil --model jacobi --nx 16384 --ny 16384 --steps 1000 --norm-every 1000 \
    --nan-check-every 0 --quiet --no-plot --peer-halo --graph --output $W/j --summary $W/j$r.json > $W/j.txt 2>&1 \
    && python3 -c "import json;s=json.load(open('$W/j$r.json'));print('jacobi peer-halo graph 2 GPUs wall', round(s['wall_seconds'],4), s['checksum'][:20])" || tail -3 $W/j.txt
done
echo "== 4. MD 2.05M atoms per GPU on 2 GPUs [$(el) s]"
timeout 100 mpirun -np 2 --bind-to none python3 -m apps.md --backend cupy --cells 160,80,80 --dims 2,1,1 --steps 100 --precision fp32 \
  --no-plot --output $W/md > $W/md.txt 2>&1 || tail -5 $W/md.txt
grep -E "atom-steps|^communication|^compute|^neighbor" $W/md.txt | tr -s ' ' | tr '\n' '|'; echo
echo "== 5. GPU suite, 2-rank parametrisations [$(el) s]"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests -k "ranks2" > $W/t5.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)" $W/t5.txt | head -10; tail -1 $W/t5.txt
echo "done [$(el) s]"
python3 - $W <<'PY'
import json, sys, glob
w = sys.argv[1]
for f in sorted(glob.glob(f"{w}/t*g*.json")):
    try:
        print(f.rsplit("/", 1)[1], json.dumps(json.load(open(f)))[:400])
    except Exception as error:
        print(f, error)
PY
rm -rf $W

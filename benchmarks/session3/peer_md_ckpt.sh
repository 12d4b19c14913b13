#!/usr/bin/env bash
# Session 3, GPU call 2 (2 H200): the peer (CUDA IPC) halo transport, where MD's 2-GPU time goes, and
# the async-checkpoint overhead with enough repeats to see through the host-bound run's noise.
# Run from an unpacked `git archive HEAD`; prints short tables.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=$(mktemp -d); T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
echo "== 1. halo GPU tests (peer transport added; in-flight race test) [$(el) s]"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_halo_gpu.py > $W/halo.txt 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)|Error:" $W/halo.txt | head -8; tail -1 $W/halo.txt
echo "== 2. jacobi 16384^2 x 1000 on 2 GPUs: nccl vs peer [$(el) s]"
J="-m apps.stencil --model jacobi --nx 16384 --ny 16384 --norm-every 1000 --nan-check-every 0 --quiet --no-plot"
for transport in nccl peer; do
  for flags in "--steps 1000" "--steps 1000 --no-overlap" "--steps 3000"; do
    tag=$transport$(echo $flags | tr -d ' -')
    HPCGPU_TRANSPORT=$transport timeout 90 mpirun -np 2 --bind-to none python3 $J $flags --output $W/j --summary $W/$tag.json > $W/$tag.txt 2>&1 \
      && python3 -c "import json;s=json.load(open('$W/$tag.json'));t=s['timers'];print('$transport', '$flags', 'wall', round(s['wall_seconds'],4), 'compute', round(t.get('compute',{}).get('max',0),4), 'comm', round(t.get('communication',{}).get('max',0),4), 'checksum', s.get('checksum'))" \
      || { echo "$tag failed"; tail -4 $W/$tag.txt; }
  done
done
echo "== 3. stencil GPU app tests with HPCGPU_TRANSPORT=peer [$(el) s]"
HPCGPU_TRANSPORT=peer timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/apps/stencil/jacobi tests/apps/stencil/swe \
  > $W/stencil_peer.txt 2>&1; echo "rc=$?"; grep -E "^(FAILED|ERROR)" $W/stencil_peer.txt | head -6; tail -1 $W/stencil_peer.txt
echo "== 4. MD 2.05M/GPU, 1 and 2 GPUs: timers and a profile of rank 0 [$(el) s]"
timeout 120 python3 -m apps.md --backend cupy --cells 8 --steps 40 --precision fp32 --quiet --no-plot --output $W/warm > /dev/null 2>&1
for n in 1 2; do
  cells=80; [ $n = 2 ] && cells="160,80,80 --dims 2,1,1"
  timeout 150 mpirun -np $n --bind-to none bash -c "python3 -m cProfile -o $W/md$n.prof.\$OMPI_COMM_WORLD_RANK -m apps.md --backend cupy --cells $cells --steps 100 --precision fp32 --no-plot --output $W/md$n --summary $W/md$n.json" > $W/md$n.txt 2>&1 || tail -5 $W/md$n.txt
  grep -iE "atom-steps|compute|communication|neighbor|thermo|builds|graphs|ghosts_per" $W/md$n.txt | head -12
  python3 -c "
import pstats,sys
p=pstats.Stats('$W/md$n.prof.0'); p.sort_stats('tottime'); p.print_stats(14)" 2>&1 | grep -E "^\s+[0-9]" | head -14
done
echo "== 5. async checkpoint overhead, 7 interleaved repeats, pinned to cores 4-7 [$(el) s]"
for layout in 1 0; do
  walls=""
  for r in 1 2 3 4 5 6 7; do
    for mode in plain async; do
      e=""; [ $mode = async ] && e="--checkpoint-every 100 --async-checkpoint --checkpoint-dir $W/c$layout$r"
      HPCGPU_CHECKPOINT_LAYOUT_PROCESS=$layout timeout 60 taskset -c 4-7 python3 -m apps.stencil --model swe --days 2 --quiet --no-plot \
        --snapshot-every 0 --nan-check-every 0 $e --output $W/o --summary $W/s.json > /dev/null 2>&1 \
        && walls="$walls $mode:$(python3 -c "import json;print(json.load(open('$W/s.json'))['wall_seconds'])")"
    done
  done
  python3 - "$layout" "$walls" <<'PY'
import statistics, sys
layout, pairs = sys.argv[1], [w.split(":") for w in sys.argv[2].split()]
plain = [float(v) for m, v in pairs if m == "plain"]; ckpt = [float(v) for m, v in pairs if m == "async"]
if plain and ckpt:
    print(f"layout process {'on' if layout == '1' else 'off'}: plain {[round(v, 3) for v in plain]} async {[round(v, 3) for v in ckpt]}")
    print(f"   median {100 * (statistics.median(ckpt) / statistics.median(plain) - 1):+.1f}%  best-of {100 * (min(ckpt) / min(plain) - 1):+.1f}% (target <= 5%)")
PY
done
echo "== 6. train fp16, 2 GPUs, NCCL channels 8 and 16 [$(el) s]"
for n in 8 16; do
  timeout 75 mpirun -np 2 --bind-to none python3 benchmarks/train_ddp.py --frameworks hpcgpu --precisions fp16 \
    --nccl-channels $n --warmup 2 --json $W/sweep_$n.json > $W/sweep_$n.txt 2>&1
  echo "channels $n: rc=$? $(grep -E '^  hpcgpu|^hpcgpu' $W/sweep_$n.txt | tr -s ' ' | tr '\n' ' ')"
done
echo "done [$(el) s]"
rm -rf $W

#!/usr/bin/env bash
# Where do the CPU and GPU Jacobi states differ? Checkpoint after k steps on both backends, compare.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
D=/tmp/jdiff; rm -rf $D; mkdir -p $D
for k in 9 10 11 40; do
  for b in numpy cupy; do
    timeout 120 python3 -m apps.stencil --model jacobi --nx 256 --ny 192 --steps $k --norm-every 10 --quiet --backend $b \
      --output $D/${b}$k --checkpoint-every 1 --summary $D/${b}$k.json > $D/${b}$k.log 2>&1 || { echo "run $b $k failed"; tail -5 $D/${b}$k.log; }
  done
done
python3 - <<'PY'
import glob, json, numpy as np, h5py
D = "/tmp/jdiff"
for k in (9, 10, 11, 40):
    states = {}
    for b in ("numpy", "cupy"):
        try:
            s = json.load(open(f"{D}/{b}{k}.json"))
        except OSError:
            s = {"checksum": "sha256:missing-----"}
        files = sorted(glob.glob(f"{D}/{b}{k}/checkpoints/ckpt_*/checkpoint.h5"))
        arr = None
        if files:
            with h5py.File(files[-1]) as f:
                names = []
                f.visit(names.append)
                ds = [n for n in names if isinstance(f[n], h5py.Dataset) and f[n].ndim == 2]
                arr = f[ds[0]][...] if ds else None
        states[b] = (s["checksum"][7:19], arr)
    a, g = states["numpy"][1], states["cupy"][1]
    line = f"k={k} cpu {states['numpy'][0]} gpu {states['cupy'][0]}"
    if a is not None and g is not None:
        diff = np.argwhere(a != g)
        line += f" differing cells {len(diff)}"
        if len(diff):
            rows = sorted(set(diff[:, 0].tolist())); cols = sorted(set(diff[:, 1].tolist()))
            line += f" rows {rows[:6]}..{rows[-3:]} cols {cols[:6]}..{cols[-3:]} max {np.abs(a.astype(float)-g).max():.3e}"
            j, i = diff[0]; line += f" first ({j},{i}) cpu {a[j,i]!r} gpu {g[j,i]!r}"
    print(line)
PY

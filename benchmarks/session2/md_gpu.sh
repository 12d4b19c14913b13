#!/usr/bin/env bash
# apps.md GPU fast path (issue 5): GPU tests, then in.lj-style throughput on 1 H200 (32k, 256k, 2M atoms)
# (and 2M with --thermo-every 0: no thermo inside the loop) and weak scaling 2,048,000 -> 4,096,000 atoms on
# 1 -> 2 GPUs (160,80,80 cells cut along x: the fp32 sub-box-edge case); 1-GPU rows with CUDA step graphs on
# (default) and off (--graph off). Run from the repository root.
set -u; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=$(mktemp -d)
echo "== GPU tests"
MD_TESTS=${MD_TESTS:-"tests/apps/md/test_md_graph.py tests/apps/md/test_md_gpu_fast.py tests/apps/md/test_md_gpu.py tests/apps/md/test_md_distributed_gpu.py"}
timeout 300 python3 -m pytest -q -x -p no:cacheprovider $MD_TESTS -m gpu 2>&1 | tail -25
echo "tests: exit ${PIPESTATUS[0]}"

# Warm-up: compiles every fp32 kernel once into CuPy's disk cache, so the timed runs do not pay NVRTC.
timeout 120 python3 -m apps.md --backend cupy --cells 8 --steps 40 --precision fp32 --quiet --no-plot --output "$OUT/warm" > "$OUT/warm.log" 2>&1
echo "warm-up: exit $?"; tail -3 "$OUT/warm.log" | grep -i error

run() {   # name ranks cells [extra args]
  local name=$1 ranks=$2 cells=$3; shift 3
  if [ "$ranks" = 1 ]; then
    timeout 120 python3 -m apps.md --backend cupy --cells "$cells" --steps 100 --precision fp32 --quiet --no-plot \
        --output "$OUT/$name" --summary "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  else
    timeout 120 mpirun -np "$ranks" --bind-to none python3 -m apps.md --backend cupy --cells "$cells" --steps 100 \
        --precision fp32 --quiet --no-plot --output "$OUT/$name" --summary "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  fi
  local rc=$?
  echo "$name: exit $rc"
  [ $rc = 0 ] || tail -20 "$OUT/$name.log"
}
echo "== timings (fp32 pair math, fp64 force/energy accumulation; 100 steps incl. rebuilds and communication)"
run c20 1 20
[ -z "${MD_QUICK:-}" ] && run c40 1 40
run c80 1 80
[ -z "${MD_QUICK:-}" ] && run c80_nothermo 1 80 --thermo-every 0
run c80x2 2 160,80,80 --dims 2,1,1
[ -z "${MD_QUICK:-}" ] && run c20_every1 1 20 --check-interval 1
run c20_nograph 1 20 --graph off
run c80_nograph 1 80 --graph off
run c20_langevin 1 20 --thermostat langevin

python3 - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
rows = [("c20", "32k, 1 GPU"), ("c40", "256k, 1 GPU"), ("c80", "2.05M, 1 GPU"),
        ("c80_nothermo", "2.05M, 1 GPU, thermo 0"), ("c80x2", "4.1M, 2 GPUs"),
        ("c20_every1", "32k, 1 GPU, check every step"), ("c20_nograph", "32k, 1 GPU, --graph off"),
        ("c80_nograph", "2.05M, 1 GPU, --graph off"), ("c20_langevin", "32k, 1 GPU, Langevin")]
print()
print(f"{'run':<30} {'atom-steps/s':>12} {'per GPU':>10} {'wall s':>7} {'builds':>6} {'checks':>6} {'rollbk':>6} {'graphs':>9}  phases s (max over ranks)")
rates = {}
for name, label in rows:
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        print(f"{label:<30} {'FAILED':>12}")
        continue
    d = json.load(open(path))
    diag = d.get("diagnostics", {})
    checks = diag.get("rebuild_checks", {})
    phases = " ".join(f"{k[:5]}={v['max']:.3f}" for k, v in sorted(d.get("timers", {}).items()) if v.get("max", 0) > 0.0005)
    rates[name] = d["throughput"]
    n_samples = max(len(d.get("thermo", [])), 1)   # the "thermo" phase covers every sample, the first one too
    thermo_ms = 1e3 * d.get("timers", {}).get("thermo", {}).get("max", 0.0) / n_samples
    graphs = diag.get("step_graphs") or {}
    graphs = f"{graphs.get('captures', '-')}/{graphs.get('launches', '-')}" if graphs else "off"
    print(f"{label:<30} {d['throughput']:>12.4g} {d['throughput'] / d['n_ranks']:>10.4g} {d['wall_seconds']:>7.3f} "
          f"{diag.get('neighbor_builds', '?'):>6} {checks.get('checks', '-'):>6} {checks.get('rollbacks', '-'):>6} {graphs:>9}  {phases}"
          f"  ({thermo_ms:.1f} ms/thermo sample)")
    last = d.get("thermo", [{}])[-1]
    print(f"{'':<30} thermo step {last.get('step')}: T {last.get('temp', 0):.6f} E_pair {last.get('e_pair', 0):.6f} "
          f"P {last.get('press', 0):.6f}")
if "c80" in rates and "c80x2" in rates:
    print(f"weak scaling 1 -> 2 GPUs (2.05M -> 4.1M atoms): {rates['c80x2'] / (2 * rates['c80']):.1%}  (target >= 95%)")
for a, b, what in (("c20", "c20_nograph", "32k"), ("c80", "c80_nograph", "2.05M")):
    if a in rates and b in rates:
        print(f"graph speed-up at {what}: {rates[a] / rates[b]:.2f}x (graphs column: captures/launches)")
print("targets: >= 3e8 at 32k, >= 1e9 at 2M atom-steps/s on one H200; thermo sample at 2M: a few ms")
print("CPU fp64 reference at step 100 (32k): T 0.7574615 E_pair -5.7585458 P 0.2237822")
PYEOF

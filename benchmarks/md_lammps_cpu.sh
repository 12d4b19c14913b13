#!/usr/bin/env bash
# apps.md against LAMMPS on in.lj, core for core (see benchmarks/md_lammps_cpu.py for the cases, the
# measurements and the options). Needs LAMMPS's `lmp` (Debian/Ubuntu: apt-get install lammps) and the
# environment of the installation activated (its python3 and mpiexec are used).
# Usage (repository root):  bash benchmarks/md_lammps_cpu.sh [--cells 20 40] [--repeats 3] [--json FILE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python3}" benchmarks/md_lammps_cpu.py "$@"

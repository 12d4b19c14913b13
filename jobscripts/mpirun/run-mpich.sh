#!/bin/bash
# run-mpich.sh APP [APP ARGS...]: one MPI rank per GPU with MPICH's mpiexec (hydra), no Slurm needed.
#
#   GPUS_PER_NODE=8 CPUS_PER_RANK=8 N_NODES=2 HOSTFILE=hosts jobscripts/mpirun/run-mpich.sh apps.stencil --steps 1000
#
# Starts `python -m hpcgpu info` (rank -> node -> GPU -> CPUs, warnings) and then the app on
# N_RANKS ranks, GPUS_PER_NODE per node (-ppn), each bound to CPUS_PER_RANK consecutive cores
# (-bind-to core:C: local rank i gets cores i*C .. i*C+C-1, which on most 8-GPU nodes lie on the
# socket of GPU i; the info report says "NO" in its "near GPU" column when they do not), each given
# its GPU by gpu-per-rank.sh (from MPI_LOCALRANKID). Output: runs/<app>-local-<time>-<pid>/ and the
# terminal. Hydra passes the whole environment to the ranks, NCCL_* included.
# Knobs (environment): N_NODES [1], GPUS_PER_NODE [SLURM_GPUS_ON_NODE, else `nvidia-smi -L`], CPUS_PER_RANK [8], N_RANKS
# [N_NODES x GPUS_PER_NODE], HOSTFILE [none: hydra's default, or the Slurm allocation],
# HPCGPU_MPIEXEC [mpiexec on PATH, else the one beside HPCGPU_PYTHON], HPCGPU_MPIEXEC_FLAGS [""],
# and the common ones (HPCGPU_PYTHON, HPCGPU_APP_ARGS, HPCGPU_RUN_DIR ...): docs/jobscripts.md.
if [ $# -lt 1 ]; then
    echo "usage: $0 APP [APP ARGS...]   (e.g. $0 apps.stencil --model jacobi)" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)   # physical path: hpcgpu/jobs/jobscripts links here
# A checkout two levels up runs un-installed; an installed hpcgpu (site-packages/hpcgpu/jobs/jobscripts) runs as is.
root=$(cd "$here/../.." && pwd)
if [ -z "${HPCGPU_ROOT:-}" ] && [ -f "$root/pyproject.toml" ] && [ -f "$root/hpcgpu/__init__.py" ]; then
    export HPCGPU_ROOT=$root
fi
N_NODES=${N_NODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}}
if ! [ "${GPUS_PER_NODE:-0}" -gt 0 ] 2>/dev/null; then
    echo "$0: cannot count this node's GPUs (no nvidia-smi, no SLURM_GPUS_ON_NODE): set GPUS_PER_NODE" >&2
    exit 2
fi
CPUS_PER_RANK=${CPUS_PER_RANK:-8}
N_RANKS=${N_RANKS:-$(( N_NODES * GPUS_PER_NODE ))}
export CPUS_PER_RANK
source "$here/../common.sh" || exit 2

mpiexec=${HPCGPU_MPIEXEC:-$(command -v mpiexec || echo "$(dirname "$(command -v "$HPCGPU_PYTHON")")/mpiexec")}
read -r -a launcher_flags <<< "${HPCGPU_MPIEXEC_FLAGS:-}"
HPCGPU_LAUNCH=("$mpiexec" -n "$N_RANKS" -ppn "$GPUS_PER_NODE" ${HOSTFILE:+-f "$HOSTFILE"}
               -bind-to "core:$CPUS_PER_RANK" "${launcher_flags[@]}" "$here/gpu-per-rank.sh")
if ! command -v "${HPCGPU_LAUNCH[0]}" >/dev/null 2>&1; then
    echo "$0: the launcher ${HPCGPU_LAUNCH[0]} is not a command here; load or install your MPI (module load ...)," \
         "or set HPCGPU_MPIEXEC (MPICH) or HPCGPU_MPIRUN (Open MPI) to its path" >&2
    exit 2
fi
hpcgpu_run "$@"

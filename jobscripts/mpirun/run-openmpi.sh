#!/bin/bash
# run-openmpi.sh APP [APP ARGS...]: one MPI rank per GPU with Open MPI's mpirun, no Slurm needed.
#
#   GPUS_PER_NODE=8 CPUS_PER_RANK=8 N_NODES=2 HOSTFILE=hosts jobscripts/mpirun/run-openmpi.sh apps.md --cells 80
#
# Starts `python -m hpcgpu info` and then the app on N_RANKS ranks: GPUS_PER_NODE per node, each
# bound to CPUS_PER_RANK cores (--map-by ppr:G:node:pe=C --bind-to core: consecutive ranks get
# consecutive cores, so on most 8-GPU nodes local rank i sits on the socket of GPU i; mpirun prints
# the bindings with --report-bindings, the info report checks them against each GPU's NUMA node),
# each given its GPU by gpu-per-rank.sh (from OMPI_COMM_WORLD_LOCAL_RANK). mpirun forwards only
# the variables named with -x: PATH, LD_LIBRARY_PATH, PYTHONPATH and the thread settings, plus
# every NCCL_*, UCX_*, OMPI_MCA_* and HPCGPU_* variable set when this script starts.
# Open MPI 5 spells --report-bindings as --display bindings (the old flag still works, with a note).
# Knobs (environment): N_NODES [1], GPUS_PER_NODE [SLURM_GPUS_ON_NODE, else `nvidia-smi -L`], CPUS_PER_RANK [8], N_RANKS
# [N_NODES x GPUS_PER_NODE], HOSTFILE [none: localhost, or the Slurm allocation], HPCGPU_MPIRUN
# [mpirun], HPCGPU_MPIRUN_FLAGS [""], and the common ones: docs/jobscripts.md.
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

exports=()
for name in PATH LD_LIBRARY_PATH PYTHONPATH PYTHONUNBUFFERED OMP_NUM_THREADS CUDA_DEVICE_ORDER \
            $(compgen -e | grep -E '^(NCCL|UCX|OMPI_MCA|HPCGPU)_'); do
    [ -n "${!name+set}" ] && exports+=(-x "$name")
done
read -r -a launcher_flags <<< "${HPCGPU_MPIRUN_FLAGS:-}"
HPCGPU_LAUNCH=("${HPCGPU_MPIRUN:-mpirun}" -np "$N_RANKS" ${HOSTFILE:+--hostfile "$HOSTFILE"}
               --map-by "ppr:$GPUS_PER_NODE:node:pe=$CPUS_PER_RANK" --bind-to core --report-bindings
               "${exports[@]}" "${launcher_flags[@]}" "$here/gpu-per-rank.sh")
if ! command -v "${HPCGPU_LAUNCH[0]}" >/dev/null 2>&1; then
    echo "$0: the launcher ${HPCGPU_LAUNCH[0]} is not a command here; load or install your MPI (module load ...)," \
         "or set HPCGPU_MPIEXEC (MPICH) or HPCGPU_MPIRUN (Open MPI) to its path" >&2
    exit 2
fi
hpcgpu_run "$@"

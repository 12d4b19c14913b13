#!/bin/bash
# gpu-per-rank.sh COMMAND [ARGS...]: give this MPI rank one GPU, then exec COMMAND.
#
# For launchers that start ranks but do not bind GPUs (mpirun/mpiexec, srun without --gpus-per-task):
#   mpirun -np 16 --map-by ppr:8:node:pe=8 --bind-to core jobscripts/mpirun/gpu-per-rank.sh python -m apps.md
# The node-local rank comes from the first of these that is set:
#   OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), MPI_LOCALRANKID (MPICH hydra, Intel MPI), PMI_LOCAL_RANK,
#   PALS_LOCAL_RANKID (Cray PALS), MV2_COMM_WORLD_LOCAL_RANK (MVAPICH), FLUX_TASK_LOCAL_ID (Flux),
#   SLURM_LOCALID (srun; last, because hydra's and Open MPI's daemons started by srun pass their
#   own SLURM_LOCALID, 0, to every rank they fork).
# The GPUs to choose from: CUDA_VISIBLE_DEVICES when it lists several (rank i gets the i-th entry);
# else HPCGPU_GPUS_PER_NODE; else the count from `nvidia-smi -L`. A CUDA_VISIBLE_DEVICES that names
# exactly one GPU is left alone: the launcher (srun --gpus-per-task=1) already bound the rank.
# More local ranks than GPUs: ranks share GPUs round-robin, with a warning. No local rank at all
# (started without a launcher): the command runs unchanged.
# HPCGPU_GPU_WRAPPER_VERBOSE=1 prints one line per rank: local rank -> CUDA_VISIBLE_DEVICES.
# GPU numbers follow PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID), as nvidia-smi and NVML count.

if [ $# -eq 0 ]; then
    echo "usage: gpu-per-rank.sh COMMAND [ARGS...]" >&2
    exit 2
fi

local_rank=""
for variable in OMPI_COMM_WORLD_LOCAL_RANK MPI_LOCALRANKID PMI_LOCAL_RANK PALS_LOCAL_RANKID \
                MV2_COMM_WORLD_LOCAL_RANK FLUX_TASK_LOCAL_ID SLURM_LOCALID; do
    if [ -n "${!variable:-}" ]; then
        local_rank=${!variable}
        source_variable=$variable
        break
    fi
done
if [ -z "$local_rank" ]; then
    # Started without a launcher (one process): nothing to choose between.
    echo "gpu-per-rank.sh: no node-local rank in the environment (expected one of OMPI_COMM_WORLD_LOCAL_RANK," \
         "MPI_LOCALRANKID, PMI_LOCAL_RANK, PALS_LOCAL_RANKID, MV2_COMM_WORLD_LOCAL_RANK, FLUX_TASK_LOCAL_ID," \
         "SLURM_LOCALID); running without changing CUDA_VISIBLE_DEVICES" >&2
    exec "$@"
fi

export CUDA_DEVICE_ORDER=PCI_BUS_ID
IFS=, read -r -a visible <<< "${CUDA_VISIBLE_DEVICES:-}"
if [ "${#visible[@]}" -eq 1 ]; then
    chosen=${visible[0]}      # bound by the launcher already
elif [ "${#visible[@]}" -gt 1 ]; then
    chosen=${visible[$(( local_rank % ${#visible[@]} ))]}
    [ "$local_rank" -lt "${#visible[@]}" ] \
        || echo "gpu-per-rank.sh: WARNING: local rank $local_rank but only ${#visible[@]} GPUs visible; ranks share GPU $chosen" >&2
else
    n_gpus=${HPCGPU_GPUS_PER_NODE:-}
    if [ -z "$n_gpus" ] && command -v nvidia-smi >/dev/null 2>&1; then
        n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    fi
    if [ -n "$n_gpus" ] && [ "$n_gpus" -gt 0 ]; then
        chosen=$(( local_rank % n_gpus ))
        [ "$local_rank" -lt "$n_gpus" ] \
            || echo "gpu-per-rank.sh: WARNING: local rank $local_rank but only $n_gpus GPUs on $(hostname); ranks share GPU $chosen" >&2
    else
        chosen=$local_rank    # GPU count unknown (no nvidia-smi): trust the launcher's rank count
    fi
fi
export CUDA_VISIBLE_DEVICES=$chosen
if [ "${HPCGPU_GPU_WRAPPER_VERBOSE:-0}" = 1 ]; then
    echo "gpu-per-rank.sh: $(hostname) local rank $local_rank ($source_variable) -> CUDA_VISIBLE_DEVICES=$chosen"
fi
exec "$@"

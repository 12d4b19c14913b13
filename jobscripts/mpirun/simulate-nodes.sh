#!/bin/bash
# simulate-nodes.sh COMMAND [ARGS...]: make NCCL treat the ranks of one host as K separate nodes.
#
# With HPCGPU_SIMULATE_NODES=K (or K:block, K:cyclic) every rank exports NCCL_HOSTID=<host>-node<k>,
# k being its pretend node, the same split hpcgpu's decomposition uses (block: rank * K / n_ranks;
# cyclic: rank % K). NCCL hashes NCCL_HOSTID instead of the host name when it groups ranks into nodes
# (recent NCCL versions; NCCL_DEBUG=INFO shows it), so traffic between pretend nodes takes NCCL's
# network transport (NET/Socket on lo with NCCL_SOCKET_IFNAME=lo, or NET/IB loopback) while ranks of
# one pretend node keep P2P/NVLink. An NCCL_HOSTID already set is kept. docs/multinode.md has the rest.
#   HPCGPU_SIMULATE_NODES=2 NCCL_SOCKET_IFNAME=lo mpirun -np 4 jobscripts/mpirun/simulate-nodes.sh \
#       python -m hpcgpu.bench halo --simulate-nodes 2
# The world rank and size come from the launcher: OMPI_COMM_WORLD_RANK/SIZE (Open MPI), PMI_RANK/SIZE
# (MPICH hydra, Intel MPI) or SLURM_PROCID/SLURM_NTASKS (srun).

if [ $# -eq 0 ]; then
    echo "usage: HPCGPU_SIMULATE_NODES=K simulate-nodes.sh COMMAND [ARGS...]" >&2
    exit 2
fi
setting=${HPCGPU_SIMULATE_NODES:-}
if [ -z "$setting" ] || [ -n "${NCCL_HOSTID:-}" ]; then
    exec "$@"
fi
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}
size=${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${SLURM_NTASKS:-}}}
count=${setting%%:*}
pattern=block
[ "$count" = "$setting" ] || pattern=${setting#*:}
if [ -z "$rank" ] || [ -z "$size" ]; then
    echo "simulate-nodes.sh: no world rank/size from the launcher (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID);" \
         "running without NCCL_HOSTID" >&2
    exec "$@"
fi
if ! [[ "$count" =~ ^[0-9]+$ ]] || [ "$count" -lt 1 ] || [ "$count" -gt "$size" ] \
        || { [ "$pattern" != block ] && [ "$pattern" != cyclic ]; }; then
    echo "simulate-nodes.sh: HPCGPU_SIMULATE_NODES=$setting: expected K, K:block or K:cyclic with 1 <= K <= $size" >&2
    exit 2
fi
if [ "$pattern" = cyclic ]; then
    node=$(( rank % count ))
else
    node=$(( rank * count / size ))
fi
export NCCL_HOSTID="$(hostname)-node$node"
exec "$@"

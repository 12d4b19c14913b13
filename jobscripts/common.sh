# shellcheck shell=bash
# jobscripts/common.sh: the logic shared by every hpcgpu job script. Sourced, never run.
#
# A job script holds its #SBATCH lines, sources this file and calls ONE of:
#   hpcgpu_run APP [ARGS...]               info report, then the app once; exits with the app's code
#   hpcgpu_run_preemptible APP [ARGS...]   the same with a checkpoint directory (and --restart latest
#                                          once it holds a checkpoint);
#                                          forwards SIGUSR1 to the app, requeues the job when the app
#                                          stopped with a checkpoint (exit 75), so a chain of runs
#                                          finishes one long simulation
#   hpcgpu_sweep_value VALUE...            (before either) the VALUE of this job-array task
# Both run `hpcgpu check` on every rank first (HPCGPU_CHECK=1): a failing node is not used; the job
# resubmits itself without it (sbatch --exclude, same run directory, continuing from the newest
# checkpoint), and so does a run that the watchdog ended because a rank hung (exit 76, hang.json).
# docs/health.md has the details.
# Every knob is an environment variable with a default; docs/jobscripts.md has them in one table.
# Export a knob before `sbatch` (sbatch passes the submitting environment by default) or with
# `sbatch --export=ALL,KNOB=value`.
#
# Layout of a job's output, relative to the job's working directory (the submit directory, or
# `sbatch --chdir`): <job-name>-<job-id>.log (Slurm's --output, in the working directory itself
# because Slurm cannot create a directory for it) and runs/<job-name>-<job-id>/ (this file creates
# it): info.txt, the app's --output (environment.json, plots ...), summary.json, checkpoints/.
# Array tasks use <job-name>-<array-job-id>_<task-id>.

# ---------------------------------------------------------------- where things are
# The code that runs: a checkout (HPCGPU_ROOT, or the submit directory when it is one), put first on
# PYTHONPATH so an un-installed checkout works; otherwise the hpcgpu installed for HPCGPU_PYTHON
# (`pip install hpcgpu`; `hpcgpu jobscript` writes HPCGPU_PYTHON into the scripts it generates).
if [ -z "${HPCGPU_ROOT:-}" ] && [ -f "${SLURM_SUBMIT_DIR:-$PWD}/hpcgpu/__init__.py" ]; then
    HPCGPU_ROOT=${SLURM_SUBMIT_DIR:-$PWD}
fi
HPCGPU_PYTHON=${HPCGPU_PYTHON:-python}       # e.g. /path/to/venv/bin/python (no `activate` needed)
HPCGPU_RUNS_DIR=${HPCGPU_RUNS_DIR:-runs}
HPCGPU_INFO=${HPCGPU_INFO:-1}                # 0: skip the `python -m hpcgpu info` report (and the binding it recommends)
HPCGPU_BIND=${HPCGPU_BIND:-topology}         # topology: each rank bound as the report recommends; launcher: launcher's only
HPCGPU_APP_ARGS=${HPCGPU_APP_ARGS:-}         # appended to the app's flags (the last value of a flag wins)
HPCGPU_MAX_RESTARTS=${HPCGPU_MAX_RESTARTS:-20}
HPCGPU_SIGNAL_GRACE=${HPCGPU_SIGNAL_GRACE:-60}
HPCGPU_CHECK=${HPCGPU_CHECK:-1}              # 0: no `hpcgpu check` before the app
HPCGPU_CHECK_FLAGS=${HPCGPU_CHECK_FLAGS:-}   # e.g. "--need 40G --min-link-gbps 20" (hpcgpu check --help)
HPCGPU_MOVE_ON=${HPCGPU_MOVE_ON:-1}          # 0: a failing check or a hang ends the job; no follow-up job
HPCGPU_EXCLUDE_BAD_NODES=${HPCGPU_EXCLUDE_BAD_NODES:-1}   # 0: the follow-up may use the same nodes again
HPCGPU_EXCLUDE=${HPCGPU_EXCLUDE:-}           # nodes excluded so far (comma-separated; follow-ups extend it)
HPCGPU_MIN_NODES=${HPCGPU_MIN_NODES:-}       # a follow-up may start on this many nodes or more (default: as many)
HPCGPU_FOLLOWUP_SBATCH=${HPCGPU_FOLLOWUP_SBATCH:-}   # extra sbatch flags of follow-up jobs
HPCGPU_MAX_FOLLOWUPS=${HPCGPU_MAX_FOLLOWUPS:-3}
HPCGPU_FOLLOWUP=${HPCGPU_FOLLOWUP:-0}        # set by the job script itself: how many follow-ups came before

# ---------------------------------------------------------------- containers (docs/containers.md)
# HPCGPU_CONTAINER=IMAGE: `hpcgpu info`, `hpcgpu check` and the app run inside IMAGE, one container per
# rank, started by the host's launcher (srun), with the image's interpreter and hpcgpu; the run directory
# is the submit directory, mounted at the same path.
HPCGPU_CONTAINER=${HPCGPU_CONTAINER:-}
HPCGPU_CONTAINER_RUNTIME=${HPCGPU_CONTAINER_RUNTIME:-apptainer}   # apptainer | singularity | pyxis | podman
HPCGPU_CONTAINER_FLAGS=${HPCGPU_CONTAINER_FLAGS:-}   # more flags for the runtime, e.g. "--bind /scratch"
HPCGPU_CONTAINER_EXEC=()
if [ -n "$HPCGPU_CONTAINER" ]; then
    HPCGPU_PYTHON=${HPCGPU_CONTAINER_PYTHON:-python}   # the image's; a host path means nothing inside
    HPCGPU_ROOT=                                       # the image's hpcgpu, not a checkout on PYTHONPATH
fi

if [ -n "${HPCGPU_ROOT:-}" ] && [ ! -f "$HPCGPU_ROOT/hpcgpu/__init__.py" ]; then
    echo "[hpcgpu-job] ERROR: HPCGPU_ROOT=$HPCGPU_ROOT is not an hpcgpu checkout (no hpcgpu/__init__.py);" \
         "submit from the repository root, export HPCGPU_ROOT=/path/to/hpcgpu, or unset it to use" \
         "the hpcgpu installed for HPCGPU_PYTHON" >&2
    exit 2
fi
if [ -z "$HPCGPU_CONTAINER" ] && ! command -v "$HPCGPU_PYTHON" >/dev/null 2>&1; then
    echo "[hpcgpu-job] ERROR: HPCGPU_PYTHON=$HPCGPU_PYTHON is not an executable; export" \
         "HPCGPU_PYTHON=/path/to/venv/bin/python" >&2
    exit 2
fi
if [ -n "${HPCGPU_ROOT:-}" ]; then
    export HPCGPU_ROOT
    export PYTHONPATH="$HPCGPU_ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
export HPCGPU_PYTHON
export PYTHONUNBUFFERED=1                    # progress lines reach the log as they happen

# ---------------------------------------------------------------- threads
# One thread per CPU Slurm gave the task. Slurm 22.05-23.02 srun does not inherit --cpus-per-task
# from sbatch any more; SRUN_CPUS_PER_TASK makes every srun below use it again.
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
    export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
else
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${CPUS_PER_RANK:-1}}
fi

# ---------------------------------------------------------------- NCCL (GPU runs; uncomment as needed)
# export NCCL_DEBUG=INFO                 # WARN for less: print NCCL's version, transports (NVLink,
#                                        # IB, socket) and rings/trees at init; first thing to try
# export NCCL_DEBUG_SUBSYS=INIT,NET      # limit NCCL_DEBUG to init and network
# export NCCL_IB_HCA=mlx5_0,mlx5_1       # InfiniBand adapters NCCL may use (`ibv_devinfo -l`);
#                                        # =^mlx5_2 excludes one (e.g. a storage-only HCA)
# export NCCL_SOCKET_IFNAME=ib0          # interface for bootstrap and the socket transport;
#                                        # =^lo,docker0 excludes; a wrong one hangs NCCL init
# export NCCL_NET_GDR_LEVEL=PHB          # GPUDirect RDMA when the NIC is this close to the GPU
# export NCCL_CROSS_NIC=0                # 0: a ring/tree keeps to one NIC rail (rail-optimised IB);
#                                        # 1: may cross (Slingshot, non-rail fabrics); default 2: prefer not
# export NCCL_IB_DISABLE=1               # no InfiniBand (test the socket path)
# export NCCL_P2P_DISABLE=1              # no NVLink/PCIe peer access (isolate P2P problems)
# Slingshot (HPE Cray): NCCL needs the aws-ofi-nccl plugin (libnccl-net*.so on LD_LIBRARY_PATH, often a
# site module), else it falls back to slow TCP sockets; then libfabric's cxi provider:
# export FI_PROVIDER=cxi NCCL_SOCKET_IFNAME=hsn NCCL_NET_GDR_LEVEL=PHB NCCL_CROSS_NIC=1
# export FI_CXI_DISABLE_HOST_REGISTER=1 FI_MR_CACHE_MONITOR=userfaultfd
# Not measured with hpcgpu: docs/jobscripts.md#nccl-on-infiniband-and-slingshot has the details.

# ---------------------------------------------------------------- the launcher
# Flags of the topology report: on GPU nodes also NCCL's own view of the topology (one NCCL
# communicator of one rank, a second or two); set HPCGPU_INFO_FLAGS= (empty) to skip that.
if [ -z "${HPCGPU_INFO_FLAGS+set}" ] && [ "${SLURM_GPUS_ON_NODE:-0}" != 0 ] \
        && [ "${SLURM_GPUS_ON_NODE//[!0-9]/}" = "${SLURM_GPUS_ON_NODE:-0}" ]; then
    HPCGPU_INFO_FLAGS=--nccl-topology
fi
HPCGPU_INFO_FLAGS=${HPCGPU_INFO_FLAGS:-}
# srun's MPI plugin: the site's default (slurm.conf MpiDefault, or SLURM_MPI_TYPE) unless
# HPCGPU_SRUN_MPI names one: pmi2 for the MPICH wheel and most MPICH-based MPIs, pmix for Open MPI 5
# and PMIx builds (`srun --mpi=list` shows what this Slurm offers).
HPCGPU_SRUN_MPI=${HPCGPU_SRUN_MPI:-}
HPCGPU_CPU_BIND=${HPCGPU_CPU_BIND-cores}     # each task pinned to its --cpus-per-task cores; set and empty: no --cpu-bind
HPCGPU_SRUN_FLAGS=${HPCGPU_SRUN_FLAGS:-}     # extra srun flags, e.g. "--distribution=block:block"
# The launcher as an array: job scripts for other launchers (jobscripts/mpirun/) replace it.
# Never put mpiexec inside srun: hydra's own srun for its proxies waits forever for the step's CPUs.
# Flags in knobs are split at whitespace, never glob-expanded ("--dims *,1" stays as written).
read -r -a _hpcgpu_srun_flags <<< "$HPCGPU_SRUN_FLAGS"
HPCGPU_LAUNCH=(srun ${HPCGPU_SRUN_MPI:+"--mpi=$HPCGPU_SRUN_MPI"} ${HPCGPU_CPU_BIND:+"--cpu-bind=$HPCGPU_CPU_BIND"}
               "${_hpcgpu_srun_flags[@]}")

# One rank per GPU, with the GPU count taken from Slurm: SLURM_GPUS_ON_NODE (from --gpus-per-node,
# --gres=gpu:G ...). Every rank sees all of its node's GPUs (no per-task GPU binding, so CUDA IPC
# between the ranks of a node works) and hpcgpu picks GPU local_rank % G (hpcgpu.runtime.device).
# More tasks per node than GPUs (e.g. `sbatch --gpus-per-node=4` on an 8-task script): srun starts
# only G per node instead of letting ranks share a GPU.
_hpcgpu_tasks_per_node=${SLURM_NTASKS_PER_NODE:-}
_hpcgpu_tasks_per_node=${_hpcgpu_tasks_per_node%%[!0-9]*}    # "8(x4)" or "8,8" -> 8
if [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ "${SLURM_GPUS_ON_NODE//[!0-9]/}" = "$SLURM_GPUS_ON_NODE" ] \
        && [ "$SLURM_GPUS_ON_NODE" -gt 0 ] && [ -n "$_hpcgpu_tasks_per_node" ] && [ -n "${SLURM_JOB_NUM_NODES:-}" ]; then
    if [ "$_hpcgpu_tasks_per_node" -gt "$SLURM_GPUS_ON_NODE" ]; then
        echo "[hpcgpu-job] $_hpcgpu_tasks_per_node tasks per node but $SLURM_GPUS_ON_NODE GPUs per node:" \
             "starting $SLURM_GPUS_ON_NODE ranks per node, one per GPU"
        HPCGPU_LAUNCH+=("--ntasks-per-node=$SLURM_GPUS_ON_NODE" "--ntasks=$(( SLURM_GPUS_ON_NODE * SLURM_JOB_NUM_NODES ))")
    elif [ "$_hpcgpu_tasks_per_node" -lt "$SLURM_GPUS_ON_NODE" ]; then
        echo "[hpcgpu-job] WARNING: $_hpcgpu_tasks_per_node tasks per node for $SLURM_GPUS_ON_NODE GPUs per node:" \
             "$(( SLURM_GPUS_ON_NODE - _hpcgpu_tasks_per_node )) GPUs per node stay idle;" \
             "submit with --ntasks-per-node=$SLURM_GPUS_ON_NODE" >&2
    fi
fi

# Each rank's container: HPCGPU_CONTAINER_EXEC goes between the launcher (and the bind wrapper) and
# the interpreter. Apptainer and podman inherit the launcher's PMI variables, so the MPI inside (MPICH's
# PMI-2 client with srun --mpi=pmi2, PMIx with --mpi=pmix) finds srun; pyxis is srun's own plugin.
# GPUs: apptainer --nv, podman --device nvidia.com/gpu=all (the NVIDIA Container Toolkit's CDI name).
_HPCGPU_GPU_JOB=0
if [ "${SLURM_GPUS_ON_NODE:-0}" != 0 ] && [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then _HPCGPU_GPU_JOB=1; fi
# podman passes only the variables named with --env; srun's PMI-2 client talks over the inherited file
# descriptor PMI_FD, which podman passes only as one of 3, 4, ...: it is moved to 3 first.
_HPCGPU_PODMAN_RANK='if [ -n "${PMI_FD:-}" ] && [ "$PMI_FD" != 3 ]; then
    eval "exec 3>&$PMI_FD" && export PMI_FD=3
fi
exec podman run --rm ${PMI_FD:+--preserve-fds=1} "$@"'
if [ -n "$HPCGPU_CONTAINER" ]; then
    read -r -a _hpcgpu_container_flags <<< "$HPCGPU_CONTAINER_FLAGS"
    case $HPCGPU_CONTAINER_RUNTIME in
        apptainer|singularity)
            HPCGPU_CONTAINER_EXEC=("$HPCGPU_CONTAINER_RUNTIME" exec)
            [ "$_HPCGPU_GPU_JOB" = 1 ] && HPCGPU_CONTAINER_EXEC+=(--nv)
            HPCGPU_CONTAINER_EXEC+=(--bind "$PWD" --pwd "$PWD" "${_hpcgpu_container_flags[@]}" "$HPCGPU_CONTAINER")
            ;;
        pyxis)
            HPCGPU_LAUNCH+=("--container-image=$HPCGPU_CONTAINER" "--container-mounts=$PWD"
                            "--container-workdir=$PWD" "${_hpcgpu_container_flags[@]}")
            ;;
        podman)
            HPCGPU_CONTAINER_EXEC=(bash -c "$_HPCGPU_PODMAN_RANK" hpcgpu-podman-rank
                --network=host --ipc=host --pid=host --uts=host --user "$(id -u):$(id -g)"
                --volume "$PWD:$PWD" --workdir "$PWD" --env 'SLURM_*' --env 'PMI_*' --env 'PMIX_*'
                --env 'HPCGPU_*' --env 'NCCL_*' --env OMP_NUM_THREADS --env PYTHONUNBUFFERED)
            [ "$_HPCGPU_GPU_JOB" = 1 ] && HPCGPU_CONTAINER_EXEC+=(--device nvidia.com/gpu=all)
            HPCGPU_CONTAINER_EXEC+=("${_hpcgpu_container_flags[@]}" "$HPCGPU_CONTAINER")
            ;;
        *)
            echo "[hpcgpu-job] ERROR: HPCGPU_CONTAINER_RUNTIME=$HPCGPU_CONTAINER_RUNTIME: expected apptainer," \
                 "singularity, pyxis or podman" >&2
            exit 2
            ;;
    esac
    if [ "$HPCGPU_CONTAINER_RUNTIME" != pyxis ] && ! command -v "$HPCGPU_CONTAINER_RUNTIME" >/dev/null 2>&1; then
        echo "[hpcgpu-job] ERROR: HPCGPU_CONTAINER_RUNTIME=$HPCGPU_CONTAINER_RUNTIME but no" \
             "$HPCGPU_CONTAINER_RUNTIME command on this node; load its module or pick another runtime" >&2
        exit 2
    fi
fi

hpcgpu_log() { echo "[hpcgpu-job] $*"; }

# The per-job run directory: runs/<job-name>-<job-id>[_<task-id>], HPCGPU_RUN_DIR when set (a chain
# of separately submitted jobs sharing one checkpoint directory), runs/<name>-local-<time>-<pid>
# outside Slurm.
hpcgpu_run_dir() {
    local name=${SLURM_JOB_NAME:-${HPCGPU_JOB_NAME:-$1}}
    if [ -n "${HPCGPU_RUN_DIR:-}" ]; then
        echo "$HPCGPU_RUN_DIR"
    elif [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
        echo "$HPCGPU_RUNS_DIR/$name-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
    elif [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "$HPCGPU_RUNS_DIR/$name-$SLURM_JOB_ID"
    else
        echo "$HPCGPU_RUNS_DIR/$name-local-$(date +%Y%m%d-%H%M%S)-$$"
    fi
}

# hpcgpu_sweep_value VALUE...: the value for this array task, e.g. lr=$(hpcgpu_sweep_value 1e-3 3e-3)
hpcgpu_sweep_value() {
    local index=${SLURM_ARRAY_TASK_ID:-0} values=("$@")
    if [ "$index" -ge "${#values[@]}" ]; then
        echo "[hpcgpu-job] ERROR: array task $index but only ${#values[@]} sweep values (${values[*]});" \
             "submit with --array=0-$(( ${#values[@]} - 1 ))" >&2
        return 2
    fi
    echo "${values[$index]}"
}

# Create the run directory and print what the job is; sets HPCGPU_RUN_DIR.
_hpcgpu_prepare() {
    HPCGPU_RUN_DIR=$(hpcgpu_run_dir "${1#apps.}")
    mkdir -p "$HPCGPU_RUN_DIR" || { echo "[hpcgpu-job] ERROR: cannot create $HPCGPU_RUN_DIR" >&2; exit 2; }
    export HPCGPU_RUN_DIR
    # The script as submitted, for a follow-up job (Slurm's copy of it goes away with the job).
    if [ -n "${SLURM_JOB_ID:-}" ] && [ -f "$0" ] && [ "$HPCGPU_FOLLOWUP" = 0 ]; then
        cp "$0" "$HPCGPU_RUN_DIR/job.sbatch" 2>/dev/null || true
    fi
    hpcgpu_log "job ${SLURM_JOB_ID:-none} (${SLURM_JOB_NAME:-no Slurm}) run $(( ${SLURM_RESTART_COUNT:-0} + 1 ))" \
               "SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-$(hostname)} at $(date -Is)"
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        hpcgpu_log "nodes $SLURM_JOB_NUM_NODES, tasks ${SLURM_NTASKS:-?} (${SLURM_NTASKS_PER_NODE:-?} per node)," \
                   "cpus-per-task ${SLURM_CPUS_PER_TASK:-?}, OMP_NUM_THREADS=$OMP_NUM_THREADS," \
                   "GPUs per node ${SLURM_GPUS_ON_NODE:-none}, GPUs per task ${SLURM_GPUS_PER_TASK:-none}"
    else
        hpcgpu_log "nodes ${N_NODES:-?}, ranks ${N_RANKS:-?} (${GPUS_PER_NODE:-?} per node)," \
                   "CPUs per rank ${CPUS_PER_RANK:-?}, OMP_NUM_THREADS=$OMP_NUM_THREADS"
    fi
    hpcgpu_log "run directory $HPCGPU_RUN_DIR; python $HPCGPU_PYTHON;" \
               "code ${HPCGPU_ROOT:-installed hpcgpu (no HPCGPU_ROOT checkout)}" \
               "${HPCGPU_CONTAINER:+in the $HPCGPU_CONTAINER_RUNTIME container $HPCGPU_CONTAINER}"
}

# Each rank's launch wrapper when the report recommends a binding (HPCGPU_BIND=topology): source the
# `hpcgpu info --apply` lines ($0; a `case` on the node-local rank exporting HPCGPU_RECOMMENDED_CPUS =
# the rank's share of its GPU's NUMA node, and NCCL_IB_HCA = the nearest InfiniBand adapter), keep a
# NCCL_IB_HCA the user exported, and run the rank under `taskset -c` when the job may use those CPUs
# (a cgroup of a shared node may not allow them: then the launcher's binding stays, with a warning).
_HPCGPU_BIND_RANK='user_hca=${NCCL_IB_HCA-hpcgpu-unset}
. "$0" || exit 2
[ "$user_hca" = hpcgpu-unset ] || export NCCL_IB_HCA="$user_hca"
if [ -n "${HPCGPU_RECOMMENDED_CPUS:-}" ]; then
    if taskset -c "$HPCGPU_RECOMMENDED_CPUS" true 2>/dev/null; then
        exec taskset -c "$HPCGPU_RECOMMENDED_CPUS" "$@"
    fi
    echo "[hpcgpu-job] rank ${SLURM_PROCID:-${PMI_RANK:-?}}: cannot bind to CPUs $HPCGPU_RECOMMENDED_CPUS (not allowed for this job); keeping the launcher binding" >&2
fi
exec "$@"'
HPCGPU_RANK_WRAPPER=()

# The topology and binding report (rank -> node -> GPU -> CPUs, links, network, warnings), in the log
# and in info.txt, and its recommended binding in topology.sh. A failure here is reported but does not
# stop the job: the app would say more.
_hpcgpu_info() {
    [ "$HPCGPU_INFO" = 1 ] || { hpcgpu_log "binding: the launcher's (HPCGPU_INFO=0: no topology report)"; return 0; }
    local topology="$HPCGPU_RUN_DIR/topology.sh" flags rc
    read -r -a flags <<< "$HPCGPU_INFO_FLAGS"
    rm -f "$topology"
    hpcgpu_log "topology: ${HPCGPU_LAUNCH[*]} $HPCGPU_PYTHON -m hpcgpu info ${flags[*]} --apply-to $topology"
    "${HPCGPU_LAUNCH[@]}" "${HPCGPU_CONTAINER_EXEC[@]}" "$HPCGPU_PYTHON" -m hpcgpu info "${flags[@]}" --apply-to "$topology" \
        > "$HPCGPU_RUN_DIR/info.txt" 2>&1
    rc=$?
    cat "$HPCGPU_RUN_DIR/info.txt"
    [ $rc -eq 0 ] || hpcgpu_log "WARNING: hpcgpu info exited with $rc (see above); starting the app anyway"
    _hpcgpu_binding "$topology"
}

# Sets HPCGPU_RANK_WRAPPER from the recommendation in topology.sh (when there is one and HPCGPU_BIND=topology).
_hpcgpu_binding() {
    if [ "$HPCGPU_BIND" = topology ] && [ -f "$1" ] && grep -q ') export ' "$1"; then
        HPCGPU_RANK_WRAPPER=(bash -c "$_HPCGPU_BIND_RANK" "$1")
        hpcgpu_log "binding: as the report recommends ($1: CPUs near each rank's GPU with taskset -c," \
                   "NCCL_IB_HCA unless exported); HPCGPU_BIND=launcher keeps the launcher's binding only"
    elif [ "$HPCGPU_BIND" = topology ]; then
        hpcgpu_log "binding: the launcher's (the report recommends none here: no GPU, or no NUMA / InfiniBand" \
                   "information)"
    else
        hpcgpu_log "binding: the launcher's (HPCGPU_BIND=$HPCGPU_BIND)"
    fi
}

# ---------------------------------------------------------------- health: check first, move on
# `hpcgpu check` on every rank (GPUs through NVML, links, versions, clocks, free space where the
# checkpoints go); report in the log and check.txt / check.json. Returns 0 when the app may start (healthy
# or warnings only, or the check itself could not run), else the check's exit code (4: a node failed).
_hpcgpu_check() {
    [ "$HPCGPU_CHECK" = 1 ] || { hpcgpu_log "health check: skipped (HPCGPU_CHECK=$HPCGPU_CHECK)"; return 0; }
    local flags rc
    read -r -a flags <<< "$HPCGPU_CHECK_FLAGS"
    rm -f "$HPCGPU_RUN_DIR/exclude.txt"
    hpcgpu_log "health check: ${HPCGPU_LAUNCH[*]} $HPCGPU_PYTHON -m hpcgpu check --checkpoint-dir" \
               "$HPCGPU_RUN_DIR/checkpoints ${flags[*]}"
    "${HPCGPU_LAUNCH[@]}" "${HPCGPU_CONTAINER_EXEC[@]}" "$HPCGPU_PYTHON" -m hpcgpu check --checkpoint-dir "$HPCGPU_RUN_DIR/checkpoints" \
        --json "$HPCGPU_RUN_DIR/check.json" --exclude-file "$HPCGPU_RUN_DIR/exclude.txt" "${flags[@]}" \
        > "$HPCGPU_RUN_DIR/check.txt" 2>&1
    rc=$?
    cat "$HPCGPU_RUN_DIR/check.txt"
    case $rc in
        0|3) return 0 ;;
        4) hpcgpu_log "health check failed (exit 4): not starting the app"; return 4 ;;
        *) hpcgpu_log "WARNING: hpcgpu check exited with $rc (see above); starting the app anyway"; return 0 ;;
    esac
}

# The nodes to leave out after a failed check or a hang: from exclude.txt (the check) or hang.json (the
# watchdog's verdict), comma-separated; empty when the problem is not tied to a node.
_hpcgpu_bad_nodes() {
    if [ "$1" = check ]; then
        tr -d ' \n' < "$HPCGPU_RUN_DIR/exclude.txt" 2>/dev/null
    elif [ -f "$HPCGPU_RUN_DIR/hang.json" ]; then
        "$HPCGPU_PYTHON" -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))["exclude_nodes"]))' \
            "$HPCGPU_RUN_DIR/hang.json" 2>/dev/null
    fi
}

# _hpcgpu_wait_for_lock APP-ARGS: true for a requeued run or a follow-up job (unless the app flags already
# say --wait-for-lock). Such a run may start while the job before it still holds the run directory (a
# node Slurm took for lost; a hung job whose rank 0 was not told): the app then waits for it, at most
# HPCGPU_LOCK_WAIT seconds (a dead holder on another node is proven dead after 600 s), instead of being
# refused (docs/reliability.md, "One job per run directory").
HPCGPU_LOCK_WAIT=${HPCGPU_LOCK_WAIT:-900}
_hpcgpu_wait_for_lock() {
    case " $* " in *" --wait-for-lock"*) return 1 ;; esac
    [ "${SLURM_RESTART_COUNT:-0}" != 0 ] || [ "$HPCGPU_FOLLOWUP" != 0 ]
}

# _hpcgpu_move_on check|hang: submit a follow-up job without the bad nodes, in the same run directory,
# continuing from the newest checkpoint there; it starts when this job has ended (afterany). Returns 0
# when one was submitted.
_hpcgpu_move_on() {
    local why=$1 bad exclude nodes min script id
    [ "$HPCGPU_MOVE_ON" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ] || return 1
    bad=$(_hpcgpu_bad_nodes "$why")
    if [ -z "$bad" ] && [ "$why" = check ]; then
        hpcgpu_log "the failure is not tied to a node (see the report): no follow-up job"
        return 1
    fi
    if [ "$HPCGPU_FOLLOWUP" -ge "$HPCGPU_MAX_FOLLOWUPS" ]; then
        hpcgpu_log "not moving on: already $HPCGPU_FOLLOWUP follow-up job(s) (HPCGPU_MAX_FOLLOWUPS)"
        return 1
    fi
    script="$HPCGPU_RUN_DIR/job.sbatch"
    [ -f "$script" ] || { hpcgpu_log "no copy of the job script at $script: cannot resubmit"; return 1; }
    exclude=$HPCGPU_EXCLUDE
    if [ "$HPCGPU_EXCLUDE_BAD_NODES" = 1 ] && [ -n "$bad" ]; then
        exclude=${exclude:+$exclude,}$bad
    fi
    nodes=${SLURM_JOB_NUM_NODES:-1}
    min=${HPCGPU_MIN_NODES:-$nodes}
    [ "$min" -le "$nodes" ] || min=$nodes
    local sbatch_flags=(--parsable "--dependency=afterany:$SLURM_JOB_ID" "--nodes=$min-$nodes")
    [ -n "$exclude" ] && sbatch_flags+=("--exclude=$exclude")
    local extra
    read -r -a extra <<< "$HPCGPU_FOLLOWUP_SBATCH"
    # A fresh environment for sbatch: this job's SLURM_* variables would leak into the next one, and a
    # test-only hang switch must not follow it.
    id=$(cd "${SLURM_SUBMIT_DIR:-$PWD}" && env $(compgen -e | grep -E '^(SLURM_|SBATCH_|SRUN_)' | sed 's/^/-u /') \
         -u HPCGPU_WATCHDOG_TEST HPCGPU_RUN_DIR="$HPCGPU_RUN_DIR" HPCGPU_EXCLUDE="$exclude" \
         HPCGPU_FOLLOWUP=$(( HPCGPU_FOLLOWUP + 1 )) sbatch "${sbatch_flags[@]}" "${extra[@]}" \
         "--job-name=${SLURM_JOB_NAME:-hpcgpu}" "$script" 2>&1)
    if [ $? -ne 0 ]; then
        hpcgpu_log "could not submit a follow-up job (sbatch ${sbatch_flags[*]:1} ${extra[*]}): $id"
        return 1
    fi
    hpcgpu_log "moving on ($why): bad node(s) ${bad:-none named}; follow-up job ${id%%;*} submitted" \
               "(${sbatch_flags[*]:1} ${extra[*]}), continuing in $HPCGPU_RUN_DIR from the newest checkpoint"
    echo "${id%%;*}" > "$HPCGPU_RUN_DIR/followup-job.txt"
    return 0
}

_hpcgpu_report_exit() {
    case $1 in
        0) hpcgpu_log "finished: exit 0; summary $HPCGPU_RUN_DIR/summary.json" ;;
        76) hpcgpu_log "a rank hung (exit 76): the watchdog's verdict is in $HPCGPU_RUN_DIR/hang.json" ;;
        75) hpcgpu_log "stopped early with a checkpoint (exit 75) in $HPCGPU_RUN_DIR/checkpoints:" \
                       "continue with the preemptible script or --restart latest" ;;
        2) hpcgpu_log "invalid input (exit 2): see the app's message above" ;;
        74) hpcgpu_log "a file could not be written (exit 74: full disk, quota or I/O error): see the app's" \
                       "message above; earlier records and the last checkpoint are intact, free space and" \
                       "continue with --restart latest" ;;
        *) hpcgpu_log "failed: exit $1" ;;
    esac
}

# hpcgpu_run APP [ARGS...]: one run; the job's exit code is the app's.
hpcgpu_run() {
    local app=$1 rc extra
    shift
    _hpcgpu_prepare "$app"
    _hpcgpu_info
    _hpcgpu_check
    rc=$?
    if [ $rc -ne 0 ]; then
        _hpcgpu_move_on check && exit 0
        exit $rc
    fi
    read -r -a extra <<< "$HPCGPU_APP_ARGS"
    set -- --output "$HPCGPU_RUN_DIR" --summary "$HPCGPU_RUN_DIR/summary.json" "$@" "${extra[@]}"
    if [ "$HPCGPU_FOLLOWUP" != 0 ] && compgen -G "$HPCGPU_RUN_DIR/checkpoints/ckpt_*[0-9]" >/dev/null; then
        set -- --restart latest "$@"   # a follow-up job continues where the one before it stopped
    fi
    _hpcgpu_wait_for_lock "$@" && set -- --wait-for-lock "$HPCGPU_LOCK_WAIT" "$@"
    rm -f "$HPCGPU_RUN_DIR/hang.json"
    hpcgpu_log "launch: ${HPCGPU_LAUNCH[*]}${HPCGPU_RANK_WRAPPER:+ [bind wrapper]}${HPCGPU_CONTAINER:+ [$HPCGPU_CONTAINER_RUNTIME $HPCGPU_CONTAINER]} $HPCGPU_PYTHON -m $app $*"
    "${HPCGPU_LAUNCH[@]}" "${HPCGPU_RANK_WRAPPER[@]}" "${HPCGPU_CONTAINER_EXEC[@]}" "$HPCGPU_PYTHON" -m "$app" "$@"
    rc=$?
    [ -f "$HPCGPU_RUN_DIR/hang.json" ] && rc=76   # the launcher may report the signal that ended the ranks
    _hpcgpu_report_exit $rc
    [ $rc -eq 76 ] && _hpcgpu_move_on hang && exit 0
    exit $rc
}

# ---------------------------------------------------------------- preemptible runs
# Slurm sends SIGUSR1 to this shell only (#SBATCH --signal=B:USR1@SECONDS, or scancel --signal=USR1
# --batch): bash runs a trap only between commands, so the launcher runs in the background and the
# trap forwards the signal; srun and mpiexec pass it to every rank, and the app writes a final
# checkpoint and exits 75. A rank that gets SIGUSR1 before Python installed its handler would die
# of it, so the signal is held until the run has written a checkpoint or run HPCGPU_SIGNAL_GRACE s.
_hpcgpu_signal_pending=0
_hpcgpu_got_term=0
_hpcgpu_launcher_pid=""
_hpcgpu_launched_at=0

_hpcgpu_app_is_ready() {
    compgen -G "$HPCGPU_RUN_DIR/checkpoints/ckpt_*" >/dev/null \
        || [ $(( SECONDS - _hpcgpu_launched_at )) -ge "$HPCGPU_SIGNAL_GRACE" ]
}

_hpcgpu_forward_pending_signal() {
    if [ "$_hpcgpu_signal_pending" = 1 ] && [ -n "$_hpcgpu_launcher_pid" ] && _hpcgpu_app_is_ready; then
        hpcgpu_log "forwarding SIGUSR1 to the launcher (pid $_hpcgpu_launcher_pid)"
        kill -USR1 "$_hpcgpu_launcher_pid" 2>/dev/null
        _hpcgpu_signal_pending=0
    fi
}

_hpcgpu_on_usr1() {
    hpcgpu_log "SIGUSR1 received at $(date -Is): the app will checkpoint and stop"
    _hpcgpu_signal_pending=1
    _hpcgpu_forward_pending_signal
}

# SIGTERM comes from Slurm itself (scancel, time limit, preemption) and reaches the app directly;
# the shell only keeps waiting so the app can finish its checkpoint, and does not requeue: a
# preempting Slurm (PreemptMode=REQUEUE) requeues by itself, a cancelled job should stay cancelled.
_hpcgpu_on_term() {
    hpcgpu_log "SIGTERM received at $(date -Is): waiting for the app's checkpoint"
    _hpcgpu_got_term=1
}

# hpcgpu_run_preemptible APP [ARGS...]: run (from the newest checkpoint if any); requeue on exit 75.
hpcgpu_run_preemptible() {
    local app=$1 rc extra restart_count=${SLURM_RESTART_COUNT:-0}
    shift
    # Trap first: an untrapped SIGUSR1 kills bash (its default action) and with it the job.
    trap _hpcgpu_on_usr1 USR1
    trap _hpcgpu_on_term TERM
    _hpcgpu_prepare "$app"
    _hpcgpu_info
    _hpcgpu_check
    rc=$?
    if [ $rc -ne 0 ]; then
        _hpcgpu_move_on check && exit 0
        exit $rc
    fi
    rm -f "$HPCGPU_RUN_DIR/hang.json"
    read -r -a extra <<< "$HPCGPU_APP_ARGS"
    set -- --output "$HPCGPU_RUN_DIR" --summary "$HPCGPU_RUN_DIR/summary.json" \
        --checkpoint-dir "$HPCGPU_RUN_DIR/checkpoints" "$@" "${extra[@]}"
    # Continue from the newest valid checkpoint when there is one (the app verifies it and falls
    # back to an older one); the first run of a chain has none and starts from the beginning.
    if compgen -G "$HPCGPU_RUN_DIR/checkpoints/ckpt_*[0-9]" >/dev/null; then
        set -- --restart latest "$@"
        hpcgpu_log "continuing from the newest checkpoint in $HPCGPU_RUN_DIR/checkpoints (--restart latest)"
    else
        hpcgpu_log "no checkpoint in $HPCGPU_RUN_DIR/checkpoints yet: starting from the beginning"
    fi
    _hpcgpu_wait_for_lock "$@" && set -- --wait-for-lock "$HPCGPU_LOCK_WAIT" "$@"
    if [ "$_hpcgpu_signal_pending" = 1 ] || [ "$_hpcgpu_got_term" = 1 ]; then
        # Stopped before the app started (e.g. a requeued run that began near its time limit): the
        # newest checkpoint is still the state to continue from.
        rc=75
        hpcgpu_log "signal before the app started: not starting it"
    else
        hpcgpu_log "launch: ${HPCGPU_LAUNCH[*]}${HPCGPU_RANK_WRAPPER:+ [bind wrapper]}${HPCGPU_CONTAINER:+ [$HPCGPU_CONTAINER_RUNTIME $HPCGPU_CONTAINER]} $HPCGPU_PYTHON -m $app $*"
        _hpcgpu_launched_at=$SECONDS
        "${HPCGPU_LAUNCH[@]}" "${HPCGPU_RANK_WRAPPER[@]}" "${HPCGPU_CONTAINER_EXEC[@]}" "$HPCGPU_PYTHON" -m "$app" "$@" &
        _hpcgpu_launcher_pid=$!
        # `wait` returns early (status > 128) whenever a trapped signal arrives; a short sleep lets
        # a held signal be forwarded once the app is ready. Loop until the launcher is gone, then
        # collect its status (bash keeps it for a later `wait`).
        while kill -0 "$_hpcgpu_launcher_pid" 2>/dev/null; do
            _hpcgpu_forward_pending_signal
            sleep 1 &
            wait $! 2>/dev/null
        done
        wait "$_hpcgpu_launcher_pid"
        rc=$?
        [ -f "$HPCGPU_RUN_DIR/hang.json" ] && rc=76   # the launcher may report the signal that ended the ranks
    fi
    _hpcgpu_report_exit $rc
    [ $rc -eq 76 ] && _hpcgpu_move_on hang && exit 0
    if [ $rc -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "$_hpcgpu_got_term" = 0 ]; then
        if [ "$restart_count" -ge "$HPCGPU_MAX_RESTARTS" ]; then
            hpcgpu_log "not requeueing: already restarted $restart_count times (HPCGPU_MAX_RESTARTS)"
            exit 75
        fi
        hpcgpu_log "requeueing job $SLURM_JOB_ID; the next run gets SLURM_RESTART_COUNT=$(( restart_count + 1 ))" \
                   "and continues from the newest checkpoint"
        if scontrol requeue "$SLURM_JOB_ID"; then
            exit 0    # slurmctld has marked the job; this run ends here either way
        fi
        hpcgpu_log "scontrol requeue failed (job submitted with --no-requeue?); resubmit to continue"
    fi
    exit $rc
}

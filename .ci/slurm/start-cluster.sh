#!/usr/bin/env bash
# Start a one-node Slurm cluster on this host for CI: munged + slurmctld + slurmd as plain
# background daemons (no systemd), one node = this host, sized by `slurmd -C`.
#
# Usage (as root):  bash .ci/slurm/start-cluster.sh        (.ci/run: SLURM_CI_FAKE_GPUS=2 bash ...)
# This script is the only thing that installs or configures Slurm for the tests: the Slurm tests in
# tests/jobscripts use a running cluster and skip without one (docs/testing.md). It changes the
# system: apt-get install slurm-wlm munge, /etc/slurm/{slurm,gres}.conf, /etc/munge/munge.key,
# /var/{lib/slurm-ci,log/slurm,spool/slurm*}, and leaves munged, slurmctld and slurmd running
# (stop them with .ci/slurm/stop-cluster.sh).
# Idempotent: every step checks first, so a second call while the cluster runs changes nothing.
# If the wanted slurm.conf differs from the one on disk (e.g. SLURM_CI_FAKE_GPUS changed), the
# file is rewritten and running slurm daemons are restarted.
# Environment knobs (all optional):
#   SLURM_CI_PARTITION   partition name                                   (default: ci)
#   SLURM_CI_TIMEOUT     seconds to wait for the node to become idle      (default: 60)
#   SLURM_CI_FAKE_GPUS   N > 0 declares N fake GPUs (gres/gpu) on the node (default: 0)
# See .ci/slurm/NOTES.md for why each slurm.conf setting is what it is.
set -euo pipefail

PARTITION="${SLURM_CI_PARTITION:-ci}"
TIMEOUT="${SLURM_CI_TIMEOUT:-60}"
FAKE_GPUS="${SLURM_CI_FAKE_GPUS:-0}"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
LOG_DIR=/var/log/slurm
FAKE_GPU_DIR=/var/lib/slurm-ci
CTLD_PIDFILE=/run/slurmctld.pid
SLURMD_PIDFILE=/run/slurmd.pid
MUNGE_PIDFILE=/run/munge/munged.pid
CONF_MARKER="# written by .ci/slurm/start-cluster.sh"

log() { echo "[slurm-ci] $*"; }
die() {
    echo "[slurm-ci] ERROR: $*" >&2
    local f
    for f in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
        if [ -f "$f" ]; then echo "----- tail $f" >&2; tail -n 25 "$f" >&2; fi
    done
    exit 1
}

# True if the pid in pidfile $1 is alive and its command name is $2.
pid_alive() {
    local pidfile=$1 name=$2 pid
    [ -s "$pidfile" ] || return 1
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}

# stop_daemon PIDFILE NAME: SIGTERM the pid in the file and wait (up to 10 s) for it to exit.
stop_daemon() {
    local pidfile=$1 name=$2 pid i
    pid_alive "$pidfile" "$name" || return 0
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
        sleep 0.1
    done
    die "$name (pid $pid) did not stop within 10 s"
}

[ "$(id -u)" -eq 0 ] || die "run me as root (CI runs .ci/run as root); found uid $(id -u)"
[[ "$FAKE_GPUS" =~ ^[0-9]+$ ]] || die "SLURM_CI_FAKE_GPUS must be a whole number, found '$FAKE_GPUS'"
START_SECONDS=$SECONDS

# ---------------------------------------------------------------- 1. packages
install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sinfo >/dev/null && command -v munged >/dev/null; then
        log "packages: slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null || echo '?')" \
            "and munge $(dpkg-query -W -f='${Version}' munge 2>/dev/null || echo '?') already installed"
        return
    fi
    log "packages: installing slurm-wlm and munge with apt-get"
    # Without systemd, the packages' postinst would call the SysV init scripts and start daemons
    # with the packaged defaults; a policy-rc.d that answers 101 ("action forbidden") stops that,
    # so this script alone decides how the daemons start.
    local added_policy=0 ok=1
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        added_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # slurm-wlm's Recommends (slurm-wlm-plugins: hdf5/rrd/... extras) are not needed here.
    if ! apt-get update -qq >/tmp/slurm-ci-apt.log 2>&1; then
        ok=0
    elif ! apt-get install -y -qq --no-install-recommends -o Dpkg::Use-Pty=0 \
            slurm-wlm munge >>/tmp/slurm-ci-apt.log 2>&1; then
        ok=0
    fi
    if [ $added_policy -eq 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    if [ $ok -eq 0 ]; then
        tail -n 30 /tmp/slurm-ci-apt.log >&2
        die "apt-get update / install slurm-wlm munge failed (full log: /tmp/slurm-ci-apt.log)"
    fi
    log "packages: installed slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm)" \
        "and munge $(dpkg-query -W -f='${Version}' munge)"
}

# ---------------------------------------------------------------- 2. munge
start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        log "munge: creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    # munged refuses a key readable by others, or one not owned by its own user.
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    if pid_alive "$MUNGE_PIDFILE" munged && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munge: munged already running (pid $(cat "$MUNGE_PIDFILE"))"
        return
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge  # clients (slurm daemons, job steps) must reach the socket
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    log "munge: starting munged as user munge"
    runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PIDFILE" \
        || die "munged did not start"
    local i
    for i in $(seq 1 50); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            log "munge: credential round trip ok"
            return
        fi
        sleep 0.1
    done
    die "munge -n | unmunge still fails 5 s after starting munged"
}

# ---------------------------------------------------------------- 3. slurm.conf
# render_conf HOST: print the slurm.conf this script wants. Deterministic (no timestamp), so a
# rerun can compare it with the file on disk.
render_conf() {
    local host=$1 node_line cpus real_memory topology gres_node="" gres_types=""
    # `slurmd -C` prints exactly the hardware slurmd will later report (CPUs, sockets, cores,
    # threads, RealMemory in MiB); configuring more than that would drain the node.
    node_line=$(slurmd -C | head -n 1)
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
    real_memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
    [ -n "$cpus" ] && [ -n "$real_memory" ] || die "could not parse 'slurmd -C': $node_line"
    # Leave ~5% of the memory to the OS and the daemons.
    real_memory=$(( real_memory * 95 / 100 ))
    topology=$(grep -o 'Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*' <<<"$node_line" || true)
    if [ "$FAKE_GPUS" -gt 0 ]; then
        gres_types="GresTypes=gpu"
        gres_node="Gres=gpu:$FAKE_GPUS "
    fi
    cat <<EOF
$CONF_MARKER (reasons: .ci/slurm/NOTES.md)
ClusterName=ci
# 127.0.0.1 so nothing depends on the hostname resolving to a reachable address.
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s);
# 10 s keeps a requeue cycle short while leaving step launch plenty of time on a slow CI host.
AuthInfo=cred_expire=10
MailProg=/bin/true
# CI runs as root; running the daemons as root avoids chowning every spool and log directory.
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PIDFILE
SlurmdPidFile=$SLURMD_PIDFILE
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups / systemd in the CI container: track job processes through /proc (parent pid
# chains); bind nothing (task/none) so oversubscribed ranks are not pinned onto one core.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# A permanent record per finished job (state, exit code): sacct -c reads it, no database needed.
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
# srun without --mpi speaks PMI2, which the MPICH wheel's libmpi understands (it rejects PMIx).
MpiDefault=pmi2
SchedulerType=sched/backfill
# Schedule often: a tiny cluster, and a requeued job should start soon after it becomes eligible.
SchedulerParameters=sched_interval=2,bf_interval=1
SelectType=select/cons_tres
# Cores are the consumable resource; memory is not, so jobs without --mem never block each other.
SelectTypeParameters=CR_Core
# Reject at submit time what can never run here (e.g. -n 4 without --overcommit on 2 CPUs)
# instead of leaving it pending forever (Reason=PartitionConfig) and hanging sbatch --wait.
EnforcePartLimits=ALL
# Batch jobs may be requeued (scontrol requeue, node failure) unless they say --no-requeue.
JobRequeue=1
# A node that was down (e.g. slurmd restarted) comes back by itself once slurmd registers.
ReturnToService=2
# sbatch --wait sleeps 2 s between polls and multiplies that by 4 (up to 32 s) while the sleep
# is below MinJobAge/2: with the default of 300 a 12 s job returns after 42 s. 5 keeps the poll
# at 2 s. The price: finished jobs leave squeue/scontrol 5-60 s after they end; use
# sacct -c (reads the jobcomp file below) for the state and exit code of any finished job.
# (0 = "never purge" is refused by 22.05: "MinJobAge must be at least 2".)
MinJobAge=5
# Short grace between SIGTERM and SIGKILL so cancelled CI jobs end fast.
KillWait=5
InactiveLimit=0
SlurmctldTimeout=120
SlurmdTimeout=300
$gres_types
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$cpus $topology RealMemory=$real_memory ${gres_node}State=UNKNOWN
# OverSubscribe=YES lets jobs that ask for --oversubscribe share cores with other jobs.
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# Fake GPUs are character devices with /dev/null's numbers: slurmd accepts them as GPU files,
# schedules --gpus* requests and sets CUDA_VISIBLE_DEVICES per task; nothing can compute on them.
render_gres_conf() {
    [ "$FAKE_GPUS" -gt 0 ] || return 0
    echo "$CONF_MARKER"
    echo "AutoDetect=off"
    echo "Name=gpu File=$FAKE_GPU_DIR/fake-gpu[0-$(( FAKE_GPUS - 1 ))]"
}

make_fake_gpu_devices() {
    [ "$FAKE_GPUS" -gt 0 ] || return 0
    local i
    mkdir -p "$FAKE_GPU_DIR"
    for i in $(seq 0 $(( FAKE_GPUS - 1 ))); do
        [ -c "$FAKE_GPU_DIR/fake-gpu$i" ] && continue
        rm -f "$FAKE_GPU_DIR/fake-gpu$i"
        if ! mknod -m 666 "$FAKE_GPU_DIR/fake-gpu$i" c 1 3 2>/dev/null; then
            # Plain files still let the scheduler accept --gpus* jobs, but slurmd then sets no
            # CUDA_VISIBLE_DEVICES (it logs "not a valid character or block device").
            touch "$FAKE_GPU_DIR/fake-gpu$i"
            log "config: mknod not permitted; fake GPU $i is a plain file (no CUDA_VISIBLE_DEVICES)"
        fi
    done
}

# Write slurm.conf (and gres.conf); set CONF_CHANGED=1 if either differs from what was there.
CONF_CHANGED=0
write_conf() {
    local host wanted wanted_gres
    host=$(hostname -s)
    wanted=$(render_conf "$host")
    wanted_gres=$(render_gres_conf)
    make_fake_gpu_devices
    if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$wanted" ] \
        && { [ "$FAKE_GPUS" -eq 0 ] || [ "$(cat "$CONF_DIR/gres.conf" 2>/dev/null)" = "$wanted_gres" ]; }; then
        log "config: $CONF is up to date"
        return
    fi
    if [ -f "$CONF" ] && ! head -n 1 "$CONF" | grep -qF "$CONF_MARKER"; then
        cp "$CONF" "$CONF.orig.$(date +%s)"
        log "config: kept the previous, foreign $CONF as $CONF.orig.*"
    fi
    mkdir -p "$CONF_DIR"
    printf '%s\n' "$wanted" >"$CONF"
    if [ "$FAKE_GPUS" -gt 0 ]; then
        printf '%s\n' "$wanted_gres" >"$CONF_DIR/gres.conf"
    elif [ -f "$CONF_DIR/gres.conf" ] && head -n 1 "$CONF_DIR/gres.conf" | grep -qF "$CONF_MARKER"; then
        rm -f "$CONF_DIR/gres.conf"
    fi
    CONF_CHANGED=1
    log "config: wrote $CONF: node $host, $(grep -o ' CPUs=[0-9]*' <<<"$wanted" | tr -d ' ')," \
        "$(grep -o 'RealMemory=[0-9]*' <<<"$wanted") MiB, fake GPUs: $FAKE_GPUS, partition $PARTITION"
}

# ---------------------------------------------------------------- 4. daemons
start_slurmctld() {
    if pid_alive "$CTLD_PIDFILE" slurmctld; then
        if [ "$CONF_CHANGED" -eq 1 ]; then
            log "slurmctld: config changed, restarting"
            stop_daemon "$CTLD_PIDFILE" slurmctld
        else
            log "slurmctld: already running (pid $(cat "$CTLD_PIDFILE"))"
            return
        fi
    fi
    mkdir -p /var/spool/slurmctld "$LOG_DIR"
    log "slurmctld: starting"
    # -i: ignore unreadable saved state (e.g. from an older run) instead of refusing to start.
    slurmctld -i || die "slurmctld failed to start"
}

start_slurmd() {
    if pid_alive "$SLURMD_PIDFILE" slurmd; then
        if [ "$CONF_CHANGED" -eq 1 ]; then
            log "slurmd: config changed, restarting"
            stop_daemon "$SLURMD_PIDFILE" slurmd
        else
            log "slurmd: already running (pid $(cat "$SLURMD_PIDFILE"))"
            return
        fi
    fi
    mkdir -p /var/spool/slurmd "$LOG_DIR"
    log "slurmd: starting"
    slurmd || die "slurmd failed to start"
}

wait_for_idle_node() {
    local host state="" deadline resumed=0
    host=$(hostname -s)
    deadline=$(( SECONDS + TIMEOUT ))
    while [ $SECONDS -lt $deadline ]; do
        # A daemon that died after forking (bad config, port in use) will never bring the node up.
        pid_alive "$CTLD_PIDFILE" slurmctld || { sleep 1; pid_alive "$CTLD_PIDFILE" slurmctld; } \
            || die "slurmctld is not running (see its log below)"
        pid_alive "$SLURMD_PIDFILE" slurmd || { sleep 1; pid_alive "$SLURMD_PIDFILE" slurmd; } \
            || die "slurmd is not running (see its log below)"
        state=$(sinfo -h -n "$host" -o '%T' 2>/dev/null | head -n 1 || true)
        case "$state" in
            idle|mixed|allocated|completing)
                log "node $host is $state"
                return ;;
            inval*)
                # slurmd registered with less hardware than slurm.conf declares: no retry helps.
                sinfo -R >&2 || true
                die "node $host is $state: slurmd reports less than slurm.conf declares (reason above)" ;;
            down*|drain*|fail*)
                # A node remembered as down or drained from an earlier run: bring it back once.
                if [ $resumed -eq 0 ]; then
                    log "node $host is $state, resuming it"
                    scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
                    resumed=1
                fi ;;
        esac
        sleep 0.5
    done
    sinfo -R >&2 || true
    die "node $host not idle after ${TIMEOUT}s (last state: '${state:-no answer}')"
}

install_packages
start_munge
write_conf
start_slurmctld
start_slurmd
wait_for_idle_node
log "cluster ready in $(( SECONDS - START_SECONDS ))s (logs: $LOG_DIR, config: $CONF;" \
    "stop it with: bash .ci/slurm/stop-cluster.sh):"
sinfo

#!/usr/bin/env bash
# Stop the one-node CI cluster started by start-cluster.sh: cancel its jobs, then stop slurmd,
# slurmctld and munged (SIGTERM through their pid files, SIGKILL after 10 s).
#
# Usage (as root):  bash .ci/slurm/stop-cluster.sh [--purge]
#   --purge  also delete the saved controller/node state and the logs, so the next start is
#            a fresh cluster (job ids restart at 1). slurm.conf and the munge key are kept.
# Safe to call when nothing runs.
set -uo pipefail

PURGE=0
case "${1:-}" in
    --purge) PURGE=1 ;;
    "") ;;
    *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

log() { echo "[slurm-ci] $*"; }

# stop_daemon PIDFILE NAME: TERM, wait up to 10 s, then KILL. Only the pid in the file is touched.
stop_daemon() {
    local pidfile=$1 name=$2 pid i
    if [ ! -s "$pidfile" ]; then
        log "$name: not running (no $pidfile)"
        return
    fi
    pid=$(cat "$pidfile")
    if ! kill -0 "$pid" 2>/dev/null || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
        log "$name: not running (stale $pidfile)"
        rm -f "$pidfile"
        return
    fi
    kill -TERM "$pid"
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || { log "$name: stopped (pid $pid)"; rm -f "$pidfile"; return; }
        sleep 0.1
    done
    log "$name: still alive after 10 s, sending SIGKILL to pid $pid"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

[ "$(id -u)" -eq 0 ] || { echo "[slurm-ci] ERROR: run me as root" >&2; exit 1; }

# Cancel jobs first while slurmctld and slurmd still run, so their processes are cleaned up
# by Slurm (slurmstepd outlives slurmd otherwise).
if command -v squeue >/dev/null && squeue -h >/dev/null 2>&1; then
    jobs=$(squeue -h -o '%A' | sort -u | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        scancel $jobs || true
        for i in $(seq 1 30); do
            [ -z "$(squeue -h -t RUNNING,COMPLETING -o '%A')" ] && break
            sleep 0.5
        done
    fi
fi

stop_daemon /run/slurmd.pid slurmd
stop_daemon /run/slurmctld.pid slurmctld
stop_daemon /run/munge/munged.pid munged

if [ $PURGE -eq 1 ]; then
    rm -rf /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    log "purged controller/node state and logs"
fi

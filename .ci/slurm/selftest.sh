#!/usr/bin/env bash
# Self-test of the one-node CI Slurm cluster (starts it first if needed). Proves, in ~1 minute:
#   1. sbatch --wait returns the job's exit code and the output lands where --output says;
#   2. MPI inside an allocation: MPICH's mpiexec (hydra) and srun (PMI2) give a proper
#      COMM_WORLD, including 4 ranks on 2 CPUs (mpiexec -n 4; srun --overcommit; sbatch --overcommit);
#   3. requeue from outside: USR1 to the batch shell (forwarded to mpiexec -> ranks, which
#      checkpoint and stop), then `scontrol requeue`; the second run sees SLURM_RESTART_COUNT=1
#      and resumes from the checkpoint;
#   4. requeue from inside: the batch script forwards USR1 to srun, then runs
#      `scontrol requeue $SLURM_JOB_ID` itself; `sbatch --wait` returns only after the second run.
#   5. sbatch --test-only of a --gpus-per-task=1 script is rejected on a GPU-less node.
# Usage: bash .ci/slurm/selftest.sh      (as root; exit status 0 = all checks passed)
# Knobs: SLURM_CI_PYTHON (default: the `python3` on PATH, i.e. the activated environment with
#        mpi4py over the `mpich` wheel),
#        SLURM_CI_MPIEXEC (default: mpiexec next to that python).
set -uo pipefail

PYTHON="${SLURM_CI_PYTHON:-$(command -v python3)}"
MPIEXEC="${SLURM_CI_MPIEXEC:-$(dirname "$PYTHON")/mpiexec}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d /tmp/slurm-selftest.XXXXXX)"
mkdir -p "$WORK/out"
N_FAILED=0
START_SECONDS=$SECONDS
# Every job of this test carries this name, so a failure cancels exactly these jobs.
export SBATCH_JOB_NAME=ci-selftest

pass() { printf 'PASS  [%3ds] %s\n' $(( SECONDS - START_SECONDS )) "$*"; }
fail() { printf 'FAIL  [%3ds] %s\n' $(( SECONDS - START_SECONDS )) "$*"; N_FAILED=$(( N_FAILED + 1 )); }
show() { echo "      --- $1"; sed 's/^/      | /' "$1" 2>/dev/null; }
job_field() { scontrol show job -o "$1" 2>/dev/null | grep -o "$2=[^ ]*" | cut -d= -f2; }

# wait_until SECONDS COMMAND...: poll every 0.25 s until COMMAND succeeds; 1 on timeout.
wait_until() {
    local deadline=$(( SECONDS + $1 )); shift
    until "$@"; do
        [ $SECONDS -ge "$deadline" ] && return 1
        sleep 0.25
    done
}
state_is() { [ "$(job_field "$1" JobState)" = "$2" ]; }
log_has() { grep -q -- "$2" "$1" 2>/dev/null; }

[ -x "$PYTHON" ] || { echo "FAIL  no python at $PYTHON (set SLURM_CI_PYTHON)"; exit 1; }
[ -x "$MPIEXEC" ] || { echo "FAIL  no mpiexec at $MPIEXEC (set SLURM_CI_MPIEXEC)"; exit 1; }
if ! sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    bash "$HERE/start-cluster.sh" || { echo "FAIL  could not start the cluster"; exit 1; }
fi
echo "selftest: work dir $WORK, python $PYTHON, $(sinfo -V)"

# ---------------------------------------------------------------------- shared files
# Toy MPI worker: counts steps; on SIGUSR1 every rank stops at the same step and rank 0
# writes the step reached to a checkpoint file; a later run resumes from there.
cat >"$WORK/worker.py" <<'EOF'
import os, signal, sys, time
from mpi4py import MPI

comm = MPI.COMM_WORLD
checkpoint_path, n_steps, step_seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop_requests = []
signal.signal(signal.SIGUSR1, lambda signum, frame: stop_requests.append(signum))
first_step = int(open(checkpoint_path).read()) if os.path.exists(checkpoint_path) else 0
comm.Barrier()  # every rank has its handler before anyone says "started"
if comm.rank == 0:
    print(f"[worker] started ranks={comm.size} restart={os.environ.get('SLURM_RESTART_COUNT', '0')} "
          f"resume_from={first_step}", flush=True)
for step in range(first_step, n_steps):
    # Ranks agree on the stop step, whichever rank the signal reached first.
    if comm.allreduce(len(stop_requests), op=MPI.MAX):
        if comm.rank == 0:
            with open(checkpoint_path + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(checkpoint_path + ".tmp", checkpoint_path)
            print(f"[worker] USR1: checkpointed at step {step}", flush=True)
        sys.exit(0)
    time.sleep(step_seconds)
if comm.rank == 0:
    print(f"[worker] finished {n_steps} steps, resumed_from={first_step}", flush=True)
EOF

# ---------------------------------------------------------------------- 1. sbatch --wait
cat >"$WORK/hello.sh" <<'EOF'
#!/bin/bash
#SBATCH --ntasks=1 --time=1
echo "hello job=$SLURM_JOB_ID restart=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME"
exit "${HELLO_EXIT:-0}"
EOF
jid=$(timeout 60 sbatch --wait --parsable --output="$WORK/out/hello-%j.log" "$WORK/hello.sh"); rc=$?
if [ $rc -eq 0 ] && log_has "$WORK/out/hello-$jid.log" "hello job=$jid restart=0"; then
    pass "sbatch --wait: rc 0, output in --output file ($(cat "$WORK/out/hello-$jid.log"))"
else
    fail "sbatch --wait: rc=$rc job=$jid"; show "$WORK/out/hello-$jid.log"
fi
jid=$(HELLO_EXIT=3 timeout 60 sbatch --wait --parsable --output="$WORK/out/hello-%j.log" "$WORK/hello.sh"); rc=$?
if [ $rc -eq 3 ] && [ "$(job_field "$jid" JobState)" = FAILED ]; then
    pass "sbatch --wait: a job exiting 3 makes sbatch exit 3 (JobState=FAILED)"
else
    fail "sbatch --wait with exit 3: rc=$rc state=$(job_field "$jid" JobState)"
fi

# ---------------------------------------------------------------------- 2. MPI
cat >"$WORK/mpi.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=2 --time=2
# Rank 0 gathers every rank id and prints one line: hydra's mpiexec may interleave lines of
# different ranks mid-line, so per-rank prints are unreliable to parse.
hello='from mpi4py import MPI; import sys; c = MPI.COMM_WORLD; r = c.gather(c.rank); c.rank or print(sys.argv[1], "size=%d ranks=%s" % (c.size, r), flush=True)'
$MPIEXEC -n 2 $PYTHON -c "\$hello" mpiexec-2
$MPIEXEC -n 4 $PYTHON -c "\$hello" mpiexec-4
srun -n 2 $PYTHON -c "\$hello" srun-2
srun --overcommit -n 4 $PYTHON -c "\$hello" srun-4
srun --mpi=none -n 2 $PYTHON -c "\$hello" srun-mpinone
EOF
cat >"$WORK/mpi-overcommit.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=4 --overcommit --time=2
# Rank 0 gathers every rank id and prints one line: hydra's mpiexec may interleave lines of
# different ranks mid-line, so per-rank prints are unreliable to parse.
hello='from mpi4py import MPI; import sys; c = MPI.COMM_WORLD; r = c.gather(c.rank); c.rank or print(sys.argv[1], "size=%d ranks=%s" % (c.size, r), flush=True)'
srun $PYTHON -c "\$hello" sbatchO-srun
$MPIEXEC $PYTHON -c "\$hello" sbatchO-mpiexec
EOF
# ranks_ok FILE TAG N: rank 0 of the run tagged TAG saw a COMM_WORLD of N ranks 0..N-1.
ranks_ok() {
    local expected
    expected="$2 size=$3 ranks=[$(seq -s ', ' 0 $(( $3 - 1 )))]"
    [ "$(grep "^$2 " "$1")" = "$expected" ]
}
jid=$(timeout 90 sbatch --wait --parsable --output="$WORK/out/mpi-%j.log" "$WORK/mpi.sh"); rc=$?
log="$WORK/out/mpi-$jid.log"
[ $rc -eq 0 ] || { fail "MPI job rc=$rc"; show "$log"; }
for spec in "mpiexec-2 2" "mpiexec-4 4" "srun-2 2" "srun-4 4"; do
    set -- $spec
    if ranks_ok "$log" "$1" "$2"; then pass "MPI in sbatch -n 2: $1 gives ranks 0..$(( $2 - 1 )) of $2"
    else fail "MPI in sbatch -n 2: $1"; show "$log"; fi
done
# Without PMI2 each task is a singleton: the pitfall this documents.
if [ "$(grep -c '^srun-mpinone size=1 ranks=\[0\]$' "$log")" = 2 ]; then
    pass "srun --mpi=none gives 2 singletons (size 1): always use PMI2 (MpiDefault=pmi2)"
else
    fail "srun --mpi=none behaved unexpectedly"; show "$log"
fi
jid=$(timeout 90 sbatch --wait --parsable --output="$WORK/out/mpiO-%j.log" "$WORK/mpi-overcommit.sh"); rc=$?
log="$WORK/out/mpiO-$jid.log"
if [ $rc -eq 0 ] && ranks_ok "$log" sbatchO-srun 4 && ranks_ok "$log" sbatchO-mpiexec 4; then
    pass "sbatch --ntasks=4 --overcommit on 2 CPUs: srun and plain mpiexec both give 4 ranks"
else
    fail "sbatch --ntasks=4 --overcommit: rc=$rc"; show "$log"
fi

# ---------------------------------------------------------------------- 3/4. requeue
# The batch script recipe from NOTES.md: trap USR1 before starting the launcher in the
# background, forward the signal, wait until the launcher is really gone, then decide.
cat >"$WORK/requeue.sh" <<EOF
#!/bin/bash
#SBATCH --ntasks=2 --time=3 --requeue --open-mode=append --signal=B:USR1@60
restart_count=\${SLURM_RESTART_COUNT:-0}
echo "[batch] run restart_count=\$restart_count mode=\$REQUEUE_MODE"
got_usr1=0
launcher_pid=""
forward_usr1() {
    got_usr1=1
    echo "[batch] USR1 received, forwarding to the launcher"
    [ -n "\$launcher_pid" ] && kill -USR1 "\$launcher_pid" 2>/dev/null
}
trap forward_usr1 USR1
if [ "\$REQUEUE_MODE" = self ]; then
    srun $PYTHON -u "$WORK/worker.py" "$WORK/ckpt-\$REQUEUE_MODE" 20 0.2 &
else
    $MPIEXEC -n 2 $PYTHON -u "$WORK/worker.py" "$WORK/ckpt-\$REQUEUE_MODE" 20 0.2 &
fi
launcher_pid=\$!
# wait returns early (status > 128) each time a trapped signal arrives: loop until it is gone.
while kill -0 "\$launcher_pid" 2>/dev/null; do wait "\$launcher_pid"; done
wait "\$launcher_pid"; rc=\$?
echo "[batch] launcher exited rc=\$rc"
if [ "\$REQUEUE_MODE" = self ] && [ \$got_usr1 -eq 1 ] && [ \$restart_count -lt 3 ]; then
    echo "[batch] requeueing myself"
    scontrol requeue "\$SLURM_JOB_ID"
    exit 0   # slurmctld already marked the job for requeue; exiting now is clean
fi
exit \$rc
EOF

# 3. From outside: signal, let the job end, requeue it, watch the second run.
t0=$SECONDS
jid=$(REQUEUE_MODE=external sbatch --parsable --output="$WORK/out/rq-external-%j.log" "$WORK/requeue.sh")
log="$WORK/out/rq-external-$jid.log"
if wait_until 30 log_has "$log" "worker\] started"; then
    scancel --signal=USR1 --batch "$jid"
    if wait_until 20 state_is "$jid" COMPLETED && log_has "$log" "checkpointed at step"; then
        scontrol requeue "$jid"
        echo "      after scontrol requeue: JobState=$(job_field "$jid" JobState) Reason=$(job_field "$jid" Reason)" \
             "Restarts=$(job_field "$jid" Restarts) EligibleTime=$(job_field "$jid" EligibleTime) (now $(date +%T))"
        if wait_until 60 state_is "$jid" COMPLETED && log_has "$log" "restart_count=1" \
            && log_has "$log" "finished 20 steps, resumed_from=[1-9]"; then
            pass "external requeue: USR1 -> mpiexec -> ranks checkpoint; scontrol requeue; run 2 has" \
                 "SLURM_RESTART_COUNT=1 and resumes ($(( SECONDS - t0 ))s)"
        else
            fail "external requeue: second run missing or wrong"; show "$log"
        fi
    else
        fail "external requeue: job did not checkpoint and complete after USR1"; show "$log"
    fi
else
    fail "external requeue: worker never started"; show "$log"
fi

# 4. From inside, with sbatch --wait across the requeue.
t0=$SECONDS
REQUEUE_MODE=self timeout 90 sbatch --wait --parsable --output="$WORK/out/rq-self-%j.log" \
    "$WORK/requeue.sh" >"$WORK/self.jobid" &
sbatch_pid=$!
wait_until 10 test -s "$WORK/self.jobid"
jid=$(cat "$WORK/self.jobid")
log="$WORK/out/rq-self-$jid.log"
if wait_until 30 log_has "$log" "worker\] started"; then
    scancel --signal=USR1 --batch "$jid"
    wait "$sbatch_pid"; rc=$?
    if [ $rc -eq 0 ] && [ "$(job_field "$jid" Restarts)" = 1 ] && log_has "$log" "requeueing myself" \
        && log_has "$log" "restart_count=1" && log_has "$log" "finished 20 steps, resumed_from=[1-9]"; then
        pass "self requeue: USR1 -> srun -> ranks checkpoint; scontrol requeue \$SLURM_JOB_ID;" \
             "sbatch --wait returned 0 after run 2 ($(( SECONDS - t0 ))s)"
    else
        fail "self requeue: sbatch rc=$rc Restarts=$(job_field "$jid" Restarts)"; show "$log"
    fi
else
    fail "self requeue: worker never started"; show "$log"
    kill "$sbatch_pid" 2>/dev/null
fi
echo "      requeue log (append mode keeps both runs):"; show "$log"

# ---------------------------------------------------------------------- 5. GPU request
printf '#!/bin/bash\n#SBATCH --ntasks=2 --gpus-per-task=1\nsrun true\n' >"$WORK/gpu.sh"
msg=$(sbatch --test-only "$WORK/gpu.sh" 2>&1); rc=$?
if scontrol show node -o | grep -q 'Gres=gpu'; then
    if [ $rc -eq 0 ]; then pass "sbatch --test-only --gpus-per-task=1 accepted (fake GPUs): $msg"
    else fail "sbatch --test-only with fake GPUs: rc=$rc $msg"; fi
elif [ $rc -ne 0 ] && grep -q 'Invalid generic resource (gres) specification' <<<"$msg"; then
    pass "sbatch --test-only --gpus-per-task=1 on a GPU-less node: rc=$rc, '$msg'"
else
    fail "sbatch --test-only --gpus-per-task=1: rc=$rc '$msg'"
fi

# ---------------------------------------------------------------------- summary
elapsed=$(( SECONDS - START_SECONDS ))
if [ $N_FAILED -eq 0 ]; then
    echo "selftest: all checks passed in ${elapsed}s"
    rm -rf "$WORK"
    exit 0
fi
echo "selftest: $N_FAILED check(s) failed in ${elapsed}s; files kept in $WORK; logs in /var/log/slurm"
scancel --name=ci-selftest 2>/dev/null
exit 1

#!/usr/bin/env bash
# A whole experiment (`mm-ds run RECIPE`), every training stage started the way the environment says.
#
#   launchers/pipeline.sh tiny --out runs/tiny                                  # the recipe's launcher (2 CPU ranks)
#   LAUNCH_WITH=deepspeed HOSTFILE=hosts NNODES=4 NPROC_PER_NODE=8 MASTER_ADDR=node0 \
#       launchers/pipeline.sh paper --out runs/paper
#   sbatch --nodes=4 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=12 --exclusive \
#          --time=48:00:00 --partition=gpu --account=myproject launchers/pipeline.sh paper --out runs/paper
#
# Knobs (environment; unset ones keep the recipe's `launch:`): LAUNCH_WITH=deepspeed|mpirun|srun|none;
# NPROC_PER_NODE (launch.ranks); NNODES (launch.nodes); HOSTFILE (launch.hostfile); MASTER_ADDR; MASTER_PORT;
# LAUNCHER=pdsh|openmpi|mvapich|slurm|mpich|impi (deepspeed's way to the other nodes); PYTHON. NNODES unset with a
# HOSTFILE: all its hosts. CHECK=1 runs `mm-ds run ... --check` and starts nothing. Run it on one machine (it starts
# every node itself); finished stage runs are skipped on a re-run, interrupted ones resume.
#
# As a SLURM batch job (the sbatch line above; time limit, partition and account also from SBATCH_TIMELIMIT,
# SBATCH_PARTITION, SBATCH_ACCOUNT): every stage runs under srun on the allocation (LAUNCH_WITH=srun, NNODES and
# NPROC_PER_NODE from the job). 120 s before the time limit SLURM sends this script SIGUSR1 (--signal=B:USR1@120):
# the running stage saves and stops (exit 75) and the job requeues itself (--requeue); the requeued job's `mm-ds run`
# skips what finished and resumes the rest. `scancel --batch --signal=USR1 JOBID` does the same by hand; after a
# plain `scancel JOBID` (the stage saves too) resubmit the same sbatch line.
#SBATCH --job-name=mm-ds-run
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
set -euo pipefail
if [[ -n ${SLURM_JOB_ID:-} && -z ${SLURM_STEP_ID:-} ]]; then  # the batch script of a job: stages under srun
    LAUNCH_WITH=${LAUNCH_WITH:-srun}
    NNODES=${NNODES:-${SLURM_JOB_NUM_NODES:-}}
    per_node=${SLURM_NTASKS_PER_NODE:-}
    NPROC_PER_NODE=${NPROC_PER_NODE:-${per_node%%(*}}  # "8(x4)": 8
fi
args=("$@" ${LAUNCH_WITH:+--launch launcher="$LAUNCH_WITH"}
      ${NPROC_PER_NODE:+--launch ranks="$NPROC_PER_NODE"} ${NNODES:+--launch nodes="$NNODES"}
      ${HOSTFILE:+--launch hostfile="$HOSTFILE"} ${MASTER_ADDR:+--launch master_addr="$MASTER_ADDR"}
      ${MASTER_PORT:+--launch master_port="$MASTER_PORT"} ${LAUNCHER:+--launch ds_launcher="$LAUNCHER"})
if [[ -n ${CHECK:-} ]]; then
    exec "${PYTHON:-python}" -m mm_ds.cli run "${args[@]}" --check
fi
# `mm-ds run` in the background, so that a signal to this script is passed on to it (it passes it to the running
# stage's launcher, whose ranks save and stop), then waited for.
requeue=
stop_run() { [[ $1 == USR1 ]] && requeue=1; kill -s "$1" "$run" 2>/dev/null || true; }
trap 'stop_run USR1' USR1
trap 'stop_run TERM' TERM
trap 'stop_run INT' INT
"${PYTHON:-python}" -m mm_ds.cli run "${args[@]}" &
run=$!
rc=0
wait "$run" || rc=$?
while kill -0 "$run" 2>/dev/null; do  # a trapped signal interrupted `wait`: the stage is still saving
    rc=0
    wait "$run" || rc=$?
done
if (( rc > 128 )); then  # interrupted just as it ended: its own status is still to be collected
    wait "$run" 2>/dev/null && rc=0 || { r=$?; (( r == 127 )) || rc=$r; }
fi
if [[ -n $requeue && $rc -eq 75 && -n ${SLURM_JOB_ID:-} ]]; then  # stopped (exit 75) for the time limit
    echo "[mm-ds] stopped before the time limit: requeueing job $SLURM_JOB_ID; \`mm-ds run\` resumes it"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"

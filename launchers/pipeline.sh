#!/usr/bin/env bash
# A whole experiment (`mm-ds run RECIPE`), every training stage started the way the environment says.
#
#   launchers/pipeline.sh tiny --out runs/tiny                                  # the recipe's launcher (2 CPU ranks)
#   LAUNCH_WITH=deepspeed HOSTFILE=hosts NNODES=4 NPROC_PER_NODE=8 MASTER_ADDR=node0 \
#       launchers/pipeline.sh paper --out runs/paper
#   sbatch --nodes=4 --ntasks-per-node=8 --gpus-per-node=8 --wrap "LAUNCH_WITH=srun NNODES=4 NPROC_PER_NODE=8 launchers/pipeline.sh paper --out runs/paper"
#
# Knobs (environment; unset ones keep the recipe's `launch:`): LAUNCH_WITH=deepspeed|mpirun|srun|none;
# NPROC_PER_NODE (launch.ranks); NNODES (launch.nodes); HOSTFILE (launch.hostfile); MASTER_ADDR; MASTER_PORT;
# LAUNCHER=pdsh|openmpi|mvapich|slurm|mpich|impi (deepspeed's way to the other nodes); PYTHON. NNODES unset with a
# HOSTFILE: all its hosts. CHECK=1: `mm-ds run ... --check` (every stage at this launch; nothing runs).
# Run it on one machine (it starts every node itself); finished stage runs are skipped on a re-run.
set -euo pipefail
exec "${PYTHON:-python}" -m mm_ds.cli run "$@" ${CHECK:+--check} ${LAUNCH_WITH:+--launch launcher="$LAUNCH_WITH"} \
    ${NPROC_PER_NODE:+--launch ranks="$NPROC_PER_NODE"} ${NNODES:+--launch nodes="$NNODES"} \
    ${HOSTFILE:+--launch hostfile="$HOSTFILE"} ${MASTER_ADDR:+--launch master_addr="$MASTER_ADDR"} \
    ${MASTER_PORT:+--launch master_port="$MASTER_PORT"} ${LAUNCHER:+--launch ds_launcher="$LAUNCHER"}

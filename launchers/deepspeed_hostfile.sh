#!/usr/bin/env bash
# Any mm-ds stage on several nodes through the `deepspeed` launcher and a hostfile (`HOST slots=N` lines).
#
#   HOSTFILE=hosts launchers/deepspeed_hostfile.sh pretrain --preset paper/minijoint --out runs/mj
#   # no ssh between nodes: run the same line on every node with its own NODE_RANK
#   HOSTFILE=hosts NODE_RANK=1 launchers/deepspeed_hostfile.sh adapt --preset paper/adapt ...
#
# Knobs (environment): HOSTFILE (required); NNODES (first N hosts; default all); NPROC_PER_NODE (default each
# host's slots); MASTER_ADDR (rank 0's address, reachable from every node, never loopback; default: the
# hostfile's first host with NODE_RANK or LAUNCHER=slurm, else that host's `hostname -I`, asked over ssh);
# MASTER_PORT (29500); LAUNCHER=pdsh|openmpi|mvapich|slurm|mpich|impi (how deepspeed reaches the other nodes;
# pdsh); NODE_RANK (start only this node, `--no_ssh`); PYTHON, DEEPSPEED (executables).
# The run directory must be on a filesystem every node sees.
set -euo pipefail
: "${HOSTFILE:?set HOSTFILE to a file of 'HOST slots=N' lines}"
launch=(--hostfile "$HOSTFILE" ${NNODES:+--nodes "$NNODES"} ${NPROC_PER_NODE:+--ranks "$NPROC_PER_NODE"}
    ${NODE_RANK:+--node-rank "$NODE_RANK"} --ds-launcher "${LAUNCHER:-pdsh}"
    ${MASTER_ADDR:+--master-addr "$MASTER_ADDR"} --master-port "${MASTER_PORT:-29500}")
# Checks the hostfile, the ranks and the master address and port; prints the address the ranks meet at.
MASTER_ADDR=$("${PYTHON:-python}" -m mm_ds.runtime.launch "${launch[@]}")
# What the openmpi or slurm runner is given as `mm-ds` gives it (each rank's CPUs; slurm: --no_ssh_check), one a line.
mapfile -t RUNNER_ARGS < <("${PYTHON:-python}" -m mm_ds.runtime.launch --runner-args "${launch[@]}")
# A script path, not `--module mm_ds.cli`: DeepSpeed's slurm runner drops --module.
ENTRY=$("${PYTHON:-python}" -c 'import mm_ds.runtime.launch; print(mm_ds.runtime.launch.ENTRY)')
exec "${DEEPSPEED:-deepspeed}" --hostfile "$HOSTFILE" ${NNODES:+--num_nodes "$NNODES"} \
    ${NPROC_PER_NODE:+--num_gpus "$NPROC_PER_NODE"} --launcher "${LAUNCHER:-pdsh}" \
    ${MASTER_ADDR:+--master_addr "$MASTER_ADDR"} --master_port "${MASTER_PORT:-29500}" \
    ${NODE_RANK:+--no_ssh --node_rank "$NODE_RANK"} "${RUNNER_ARGS[@]}" "$ENTRY" "$@"

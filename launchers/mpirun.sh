#!/usr/bin/env bash
# Any mm-ds stage under `mpirun` (OpenMPI); each rank finds its place through mpi4py.
#
#   NP=2 launchers/mpirun.sh pretrain --preset tiny/minijoint --out runs/mj data.corpus=data/en
#   HOSTFILE=hosts NNODES=4 NPROC_PER_NODE=8 launchers/mpirun.sh pretrain --preset paper/minijoint ...
#
# Knobs (environment): NP (total ranks; default NNODES x NPROC_PER_NODE); HOSTFILE (`HOST slots=N`, also
# OpenMPI's format); NNODES (1); NPROC_PER_NODE (1); MASTER_ADDR (rank 0's address, reachable from every node,
# never loopback on several; default 127.0.0.1 on one node, else rank 0's `hostname -I`); MASTER_PORT (29500);
# MPIRUN (mpirun); MPIRUN_BIND (default `--bind-to none`: each rank sizes its threads to its share of the
# node's cores; e.g. "--map-by ppr:8:node:PE=12 --bind-to core" with OMP_NUM_THREADS=12 to pin);
# MPIRUN_ARGS (extra flags, e.g. "--mca btl_tcp_if_include eth0"); PYTHON.
# Forwarded to every rank with -x: PATH, MASTER_*, and what DeepSpeed's runners forward (NCCL*, PYTHON*, UCX*),
# and GLOO_SOCKET_IFNAME.
set -euo pipefail
NP=${NP:-$(( ${NNODES:-1} * ${NPROC_PER_NODE:-1} ))}
export MASTER_PORT=${MASTER_PORT:-29500}
# Checks the hostfile, the ranks and the master address and port; prints the address the ranks meet at.
MASTER_ADDR=$("${PYTHON:-python}" -m mm_ds.runtime.launch --launcher mpirun ${HOSTFILE:+--hostfile "$HOSTFILE"} \
    ${NNODES:+--nodes "$NNODES"} ${NPROC_PER_NODE:+--ranks "$NPROC_PER_NODE"} \
    ${MASTER_ADDR:+--master-addr "$MASTER_ADDR"} --master-port "$MASTER_PORT")
forward=()
for v in $(compgen -e); do
    case $v in NCCL*|PYTHON*|UCX*|GLOO_SOCKET_IFNAME) forward+=(-x "$v") ;; esac
done
exec "${MPIRUN:-mpirun}" -n "$NP" ${HOSTFILE:+--hostfile "$HOSTFILE"} ${NPROC_PER_NODE:+-npernode "$NPROC_PER_NODE"} \
    -x MASTER_PORT ${MASTER_ADDR:+-x MASTER_ADDR="$MASTER_ADDR"} -x PATH "${forward[@]}" ${MPIRUN_BIND---bind-to none} \
    ${MPIRUN_ARGS:-} "${PYTHON:-python}" -m mm_ds.cli "$@"

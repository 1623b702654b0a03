#!/usr/bin/env bash
# Any mm-ds stage under `mpirun` (OpenMPI); each rank finds its place through mpi4py.
#
#   NP=2 launchers/mpirun.sh pretrain --preset tiny/minijoint --out runs/mj data.corpus=data/en
#   HOSTFILE=hosts NNODES=4 NPROC_PER_NODE=8 MASTER_ADDR=node0 launchers/mpirun.sh pretrain --preset paper/minijoint ...
#
# Knobs (environment): NP (total ranks; default NNODES x NPROC_PER_NODE); HOSTFILE (`HOST slots=N`, also
# OpenMPI's format); NNODES (1); NPROC_PER_NODE (1); MASTER_ADDR (default: rank 0's `hostname -I`);
# MASTER_PORT (29500); MPIRUN (mpirun), MPIRUN_ARGS (extra flags, e.g. "--mca btl_tcp_if_include eth0"); PYTHON.
set -euo pipefail
NP=${NP:-$(( ${NNODES:-1} * ${NPROC_PER_NODE:-1} ))}
export MASTER_PORT=${MASTER_PORT:-29500}
"${PYTHON:-python}" -m mm_ds.launch --launcher mpirun ${HOSTFILE:+--hostfile "$HOSTFILE"} ${NNODES:+--nodes "$NNODES"} \
    ${NPROC_PER_NODE:+--ranks "$NPROC_PER_NODE"} ${MASTER_ADDR:+--master-addr "$MASTER_ADDR"} --master-port "$MASTER_PORT"
exec "${MPIRUN:-mpirun}" -n "$NP" ${HOSTFILE:+--hostfile "$HOSTFILE"} ${NPROC_PER_NODE:+-npernode "$NPROC_PER_NODE"} \
    -x MASTER_PORT ${MASTER_ADDR:+-x MASTER_ADDR="$MASTER_ADDR"} -x PATH ${MPIRUN_ARGS:-} \
    "${PYTHON:-python}" -m mm_ds.cli "$@"

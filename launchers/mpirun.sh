#!/usr/bin/env bash
# Any mm-ds stage under `mpirun` (Open MPI); each rank finds its place through mpi4py.
#
#   NPROC_PER_NODE=2 launchers/mpirun.sh pretrain --preset tiny/minijoint --out runs/mj data.corpus=data/en
#   HOSTFILE=hosts NPROC_PER_NODE=8 launchers/mpirun.sh pretrain --preset paper/minijoint ...
#   CHECK=1 HOSTFILE=hosts NPROC_PER_NODE=8 launchers/mpirun.sh pretrain --preset paper/minijoint ...
#
# Knobs (environment), each a `launch.*` key of `mm-ds STAGE` (mm_ds/config.py LaunchConfig), checked as it checks
# them: HOSTFILE (`HOST slots=N`, also Open MPI's format); NNODES (the first N hosts; default all, else 1);
# NPROC_PER_NODE (1); NP (the ranks of one node without a hostfile: NPROC_PER_NODE's old name); MASTER_ADDR (rank 0's
# address, reachable from every node, never loopback on several; default 127.0.0.1 on one node, else rank 0's
# `hostname -I`); MASTER_PORT (29500); MPIRUN_BIND (default `--bind-to none`: each rank sizes its threads to its
# share of the node's cores; e.g. "--map-by ppr:8:node:PE=12 --bind-to core" with OMP_NUM_THREADS=12 to pin);
# MPIRUN_ARGS (extra flags, e.g. "--mca btl_tcp_if_include eth0"); PYTHON. CHECK=1: check, print the command, run
# nothing (exit 0, or 2 with the reason).
# mpirun is the one next to PYTHON (else on PATH), by its absolute path and with `--prefix` (its install root), so
# the other nodes' daemons start from the same Open MPI. Forwarded to every rank with -x: PATH, MASTER_*, and what
# mm_ds/runtime/distributed/environment.py FORWARDED lists (LD_LIBRARY_PATH, NCCL_*, TORCH_NCCL_*, FI_*, CUDA_*, ...).
set -euo pipefail
PY=${PYTHON:-python}
if [[ -n ${NP:-} ]]; then
    if [[ -n ${HOSTFILE:-} || ( -n ${NPROC_PER_NODE:-} && $NPROC_PER_NODE != "$NP" ) ]]; then
        echo "mm-ds: error: NP is one node's ranks; with HOSTFILE or NPROC_PER_NODE give NNODES and NPROC_PER_NODE" \
            "(world size = NNODES x NPROC_PER_NODE) instead" >&2
        exit 2
    fi
    NPROC_PER_NODE=$NP
fi
launch=(launcher=mpirun ${HOSTFILE:+hostfile="$HOSTFILE"} ${NNODES:+nodes="$NNODES"}
    ${NPROC_PER_NODE:+ranks="$NPROC_PER_NODE"} ${MASTER_ADDR:+master_addr="$MASTER_ADDR"}
    master_port="${MASTER_PORT:-29500}")
# The stage as `mm-ds STAGE ... --check` sees it at this launch: its config and preset, its batch at this world
# size, the hostfile, mpirun, the master address.
check=$("$PY" -m mm_ds.cli "$@" --check "${launch[@]/#/launch.}")
# mpirun as mm-ds starts it (one argument a line: its environment, its path and --prefix, the ranks, what it
# forwards, the hostfile), after the same checks and the master port's.
out=$("$PY" -m mm_ds.runtime.distributed.launch "${launch[@]}" --command ${CHECK:+--check})
mapfile -t cmd <<< "$out"
cmd+=(-x PATH ${MPIRUN_BIND---bind-to none} ${MPIRUN_ARGS:-} "$PY" -m mm_ds.cli "$@")
if [[ -n ${CHECK:-} ]]; then
    grep '^# ' <<< "$check" || true
    echo "would run: ${cmd[*]@Q}"
    exit 0
fi
exec "${cmd[@]}"

#!/usr/bin/env bash
# Any mm-ds stage on several nodes through the `deepspeed` launcher and a hostfile (`HOST slots=N` lines).
#
#   HOSTFILE=hosts launchers/deepspeed_hostfile.sh pretrain --preset paper/minijoint --out runs/mj
#   CHECK=1 HOSTFILE=hosts launchers/deepspeed_hostfile.sh pretrain --preset paper/minijoint --out runs/mj
#   # no ssh between nodes: run the same line on every node with its own NODE_RANK
#   HOSTFILE=hosts NODE_RANK=1 launchers/deepspeed_hostfile.sh adapt --preset paper/adapt ...
#
# Knobs (environment), each a `launch.*` key of `mm-ds STAGE` (mm_ds/config.py LaunchConfig), checked as it checks
# them: HOSTFILE (required); NNODES (the first N hosts; default all); NPROC_PER_NODE (default: the slots every one
# of those hosts has, as deepspeed's own default); MASTER_ADDR
# (rank 0's address, reachable from every node, never loopback; default: the hostfile's first host); MASTER_PORT
# (29500); LAUNCHER=pdsh|openmpi|mvapich|slurm|mpich|impi (DeepSpeed's runner to the other nodes; pdsh);
# NODE_RANK (start only this node, `--no_ssh`); RUN_HERE=true (one node's ranks on this machine, though the hostfile
# names another); PYTHON. CHECK=1: check, print the command, run nothing (exit 0, or 2 with the reason).
# The run directory must be on a filesystem every node sees.
set -euo pipefail
: "${HOSTFILE:?set HOSTFILE to a file of 'HOST slots=N' lines}"
PY=${PYTHON:-python}
NPROC_PER_NODE=${NPROC_PER_NODE:-$("$PY" -m mm_ds.runtime.distributed.hostfile "$HOSTFILE" ${NNODES:+--nodes "$NNODES"} --slots)}
launch=(launcher=deepspeed hostfile="$HOSTFILE" ${NNODES:+nodes="$NNODES"} ${NPROC_PER_NODE:+ranks="$NPROC_PER_NODE"}
    ${NODE_RANK:+node_rank="$NODE_RANK"} ds_launcher="${LAUNCHER:-pdsh}" ${MASTER_ADDR:+master_addr="$MASTER_ADDR"}
    master_port="${MASTER_PORT:-29500}" ${RUN_HERE:+run_here="$RUN_HERE"})
# The stage as `mm-ds STAGE ... --check` sees it at this launch: its config and preset, its batch at this world
# size, the hostfile, the machine rank 0 starts on, DeepSpeed's runner and its executables, the master address.
check=$("$PY" -m mm_ds.cli "$@" --check "${launch[@]/#/launch.}")
# deepspeed as mm-ds starts it (one argument a line: its environment, the nodes, the runner and its arguments, rank
# 0's address), after the same checks and the master port's; then the script every rank runs, by path.
out=$("$PY" -m mm_ds.runtime.distributed.launch "${launch[@]}" --command ${CHECK:+--check})
mapfile -t cmd <<< "$out"
cmd+=("$("$PY" -c 'import mm_ds.runtime.distributed.launch as l; print(l.ENTRY)')" "$@")
if [[ -n ${CHECK:-} ]]; then
    grep '^# ' <<< "$check" || true
    echo "would run: ${cmd[*]@Q}"
    exit 0
fi
exec "${cmd[@]}"

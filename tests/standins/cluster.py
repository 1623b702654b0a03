"""What the stand-ins beside this file share: the emulated cluster's map, and how a process starts on a node.

The stand-ins (`ssh`, `pdsh`, `srun`, `sinfo`, `scontrol`; hydra's `mpirun`/`mpiexec` and `mpiname` in hydra/)
are put first on PATH of the launching node's processes by tests/support/netns.py. Each starts processes on the nodes of
the map named by MMDS_TEST_CLUSTER (written by `Nodes.write_map`):

    {"nodes": [{"name": ..., "ns": ..., "addr": ...}, ...],   tests/support/netns.py's nodes, in order
     "login_env": {...},      what a login on a node starts with (ssh; hydra's and SLURM's daemons run there too)
     "cpus": 64, "gpus": 2,   per node, as SLURM's configuration would list them (srun checks requests against them)
     "pmi": "",               "pmi2": srun's MpiDefault=pmi2 (its tasks get PMI_RANK/PMI_SIZE)
     "mpi": "mpich",          which MPI hydra's mpirun is: mpich, impi, mvapich (MV2_COMM_WORLD_* as well)
     "broken": {"NAME": "why"},   nodes where the Python environment is missing (its directory is hidden)
     "hide": "/path/.venv",   that directory
     "kill_wait_s": 5}        SLURM's KillWait (30 s by default on a real cluster)

A node is a network namespace with its own host name (`unshare --uts`); every process on it starts with `env -i`
and exactly the environment its launcher gives it: what the real tool would hand over, nothing of the test's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

MAP = "MMDS_TEST_CLUSTER"


def load() -> dict:
    path = os.environ.get(MAP)
    if not path:
        sys.exit(f"{os.path.basename(sys.argv[0])} (stand-in): {MAP} names no cluster map; this is a test's "
                 f"stand-in (tests/standins), not the real tool")
    with open(path) as f:
        return json.load(f)


def node_named(cluster: dict, host: str) -> dict | None:
    """The node a name (or its address) refers to, as the nodes' /etc/hosts would resolve it."""
    host = host.split("@")[-1]
    return next((n for n in cluster["nodes"] if host in (n["name"], n["addr"])), None)


def on_node(cluster: dict, node: dict, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
    """The command that runs `argv` on `node`: in its namespace, under its host name, with exactly `env`, in `cwd`.
    On a broken node the Python environment's directory is hidden first, as if it had never been installed."""
    hide = cluster.get("hide") if node["name"] in cluster.get("broken", {}) else None
    script = 'hostname "$0" && ' + ('mount -t tmpfs -o ro tmpfs "$1" && ' if hide else "") + \
        ('shift && ' if hide else "") + 'exec env -i "$@"'
    return ["ip", "netns", "exec", node["ns"], "unshare", "--uts", *(["--mount"] if hide else []), "--",
            "/bin/sh", "-c", script, node["name"], *([hide] if hide else []),
            *(["-C", cwd] if cwd else []), *[f"{k}={v}" for k, v in env.items()], *argv]


def start(cluster: dict, node: dict, argv: list[str], env: dict[str, str], cwd: str | None = None,
          **popen) -> subprocess.Popen:
    """A task on `node`, in a process group of its own: `signal_task` reaches all it started, as slurmstepd's
    (and hydra's proxy's) kill reaches a task's whole tree."""
    return subprocess.Popen(on_node(cluster, node, argv, env, cwd), start_new_session=True, **popen)


def signal_task(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except OSError:
        pass


def exit_code(p: subprocess.Popen) -> int:
    """A task's exit code as a shell reports it: 128 + N for a task ended by signal N."""
    return 128 - p.returncode if p.returncode < 0 else p.returncode


def expand(hostlist: str) -> list[str]:
    """SLURM's host list syntax, written here independently of mm-ds's: `n[1-3,07],m` -> n1 n2 n3 n07 m."""
    out = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        for piece in m.group(2).split(","):
            a, _, b = piece.partition("-")
            out += [f"{m.group(1)}{i:0{len(a)}d}{m.group(3)}" for i in range(int(a), int(b or a) + 1)]
    return out


def compress(hosts: list[str]) -> str:
    """The inverse, as SLURM prints it: hosts sharing a prefix before trailing digits go in one bracket."""
    groups: dict[str, list[str]] = {}
    for h in hosts:
        m = re.fullmatch(r"(.*?)(\d+)", h)
        groups.setdefault(m.group(1) if m else h, []).append(m.group(2) if m else "")
    parts = []
    for prefix, nums in groups.items():
        if nums == [""]:
            parts.append(prefix)
        elif len(nums) == 1:
            parts.append(prefix + nums[0])
        else:
            runs, start = [], 0
            for i in range(1, len(nums) + 1):
                if i == len(nums) or int(nums[i]) != int(nums[i - 1]) + 1:
                    runs.append(nums[start] if start == i - 1 else f"{nums[start]}-{nums[i - 1]}")
                    start = i
            parts.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(parts)


def per_node_counts(counts: list[int]) -> str:
    """SLURM's tasks-per-node form: [2, 2, 1] -> 2(x2),1."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)

"""Where an srun step's ranks meet, decided from SLURM's strings (mm_ds/runtime/distributed/bringup.py `place` asks
`srun_master` for an srun task's rendezvous): the step's first node from its node list, whatever MASTER_ADDR came with
the environment (sbatch exports the submitting shell's), and whether two names are one machine by name alone. Every
rank decides from the same strings, never from how a name resolves on its node.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess

from ...config import ConfigError

MARKED = "MM_DS_MASTER_ADDR"
"""Set beside MASTER_ADDR by the mm-ds process that chose it (launch.master_addr, or the hostfile's first host):
an srun step's ranks then keep it. Any other MASTER_ADDR an srun task sees came with the environment."""


def srun_master(given: dict[str, str]) -> tuple[str, str]:
    """(address, note) of an srun step's rendezvous: the step's first node, where task 0 runs. sbatch exports the
    submitting shell's environment, so a MASTER_ADDR there may be a past job's or loopback: one that names
    another host is not used (and said once) unless mm-ds set it (`MARKED`). A loopback address on a step of
    several nodes stops every rank at once: each would dial its own node."""
    first, addr = slurm_first_host(given), given.get("MASTER_ADDR", "")
    nodes = given.get("SLURM_STEP_NUM_NODES", given.get("SLURM_NNODES", "1"))
    known = "SLURM_STEP_NODELIST" in given or "SLURM_JOB_NODELIST" in given or nodes == "1"
    note = ""
    if addr and known and given.get(MARKED) != addr and not same_host(addr, first):
        note = (f"MASTER_ADDR={addr} came with the environment (sbatch exports the submitting shell's) and is not "
                f"this step's first node {first}, where rank 0 runs: the ranks meet at {first}. To choose another "
                f"address of that node, set launch.master_addr (mm-ds then marks it: {MARKED})")
        addr = first
    addr = addr or first
    if is_loopback(addr) and nodes.isdigit() and int(nodes) > 1:
        raise ConfigError(f"MASTER_ADDR={addr} is loopback, but this srun step spans {nodes} nodes: every node's "
                          f"ranks would dial their own. Unset MASTER_ADDR (the ranks meet at the step's first node, "
                          f"{first}) or give rank 0's address with launch.master_addr")
    return addr, note


def same_host(a: str, b: str) -> bool:
    """The same machine by name alone: equal names, equal short names (n01 vs n01.cluster), or both loopback."""
    if is_loopback(a) and is_loopback(b):
        return True
    if is_ip(a) or is_ip(b):
        return a == b
    return a.lower().split(".")[0] == b.lower().split(".")[0]


def slurm_first_host(given: dict[str, str]) -> str:
    """The first node of the step (task 0's), from SLURM_STEP_NODELIST / SLURM_JOB_NODELIST; 127.0.0.1 on one."""
    nodelist = given.get("SLURM_STEP_NODELIST", given.get("SLURM_JOB_NODELIST", ""))
    if not nodelist or given.get("SLURM_STEP_NUM_NODES", given.get("SLURM_NNODES", "1")) == "1":
        return "127.0.0.1"
    return slurm_hosts(nodelist)[0]


def slurm_hosts(nodelist: str) -> list[str]:
    """SLURM's host list ("gpu[01-04],login1") as names: `scontrol show hostnames` where SLURM is installed (the
    same answer on every node), else expanded here."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()
    return expand_hostlist(nodelist)


def expand_hostlist(nodelist: str) -> list[str]:
    """`n[1-3,07],m` -> n1 n2 n3 n07 m (one bracket a name, zero padding kept)."""
    hosts = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", nodelist):
        prefix, ranges, suffix = m.groups()
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            hosts += [f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi or lo) + 1)]
    return hosts


def is_loopback(addr: str) -> bool:
    """The address (not what it resolves to here) names each machine itself: 127.x, ::1, localhost."""
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return addr.lower().rstrip(".") in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr.split("%")[0])
        return True
    except ValueError:
        return False

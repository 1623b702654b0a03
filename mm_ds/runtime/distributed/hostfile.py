"""DeepSpeed/OpenMPI hostfiles: one `HOST slots=N [...]` line per node, `#` comments, blank lines.

What DeepSpeed's launcher accepts is accepted: a host, `slots=N`, and anything after it (OpenMPI reads
`max_slots=M` there; DeepSpeed ignores it). One deliberate difference: `slots=0` is refused (that node would
get no rank).

Checked before anything starts, so a typo fails with the line to fix instead of a hang at rendezvous:

    python -m mm_ds.runtime.distributed.hostfile hosts --nodes 2 --nproc-per-node 8
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ...config import ConfigError


@dataclass(frozen=True)
class Host:
    name: str
    slots: int
    line: int
    """1-based line in the hostfile, for error messages."""


def parse(text: str, source: str = "hostfile") -> list[Host]:
    """Hosts in file order. Raises ConfigError naming the line of the first problem."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {no} ({raw.strip()!r})"
        fields = line.split()
        if "=" in fields[0]:
            raise ConfigError(f"{where}: no host name before {fields[0]!r}; write `HOST slots=N`")
        name = fields[0]
        if len(fields) == 1:
            raise ConfigError(f"{where}: host {name!r} has no slots; write `{name} slots=N` (N ranks on that node)")
        m = re.fullmatch(r"slots=(\d+)", fields[1])  # the second field, as DeepSpeed's runner reads it
        if not m or int(m.group(1)) < 1:
            raise ConfigError(f"{where}: malformed {fields[1]!r} for host {name!r}; expected slots=N with N a "
                              f"positive integer")
        if name in seen:
            raise ConfigError(f"{where}: host {name!r} is already listed on line {seen[name]}; list each node once")
        seen[name] = no
        hosts.append(Host(name, int(m.group(1)), no))
    if not hosts:
        raise ConfigError(f"{source} lists no hosts; write one `HOST slots=N` line per node")
    return hosts


def read(path: str | Path) -> list[Host]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"hostfile {path} does not exist (launch.hostfile / HOSTFILE)")
    return parse(path.read_text(), str(path))


def select(hosts: list[Host], nodes: int | None, ranks_per_node: int | None, source: str = "hostfile") -> list[Host]:
    """The first `nodes` hosts (all when None), each able to hold `ranks_per_node` ranks (its slots when None).
    Raises ConfigError when more nodes or ranks are asked for than the hostfile offers."""
    nodes = len(hosts) if nodes is None else nodes
    if nodes < 1:
        raise ConfigError(f"nodes (launch.nodes / NNODES) must be positive, got {nodes}")
    if nodes > len(hosts):
        raise ConfigError(f"{nodes} nodes requested (launch.nodes / NNODES) but {source} lists only "
                          f"{len(hosts)}: {', '.join(h.name for h in hosts)}")
    used = hosts[:nodes]
    if ranks_per_node is not None:
        if ranks_per_node < 1:
            raise ConfigError(f"ranks per node (launch.ranks / NPROC_PER_NODE) must be positive, got {ranks_per_node}")
        short = [h for h in used if h.slots < ranks_per_node]
        if short:
            h = short[0]
            raise ConfigError(f"{ranks_per_node} ranks per node requested (launch.ranks / NPROC_PER_NODE) but "
                              f"{source} line {h.line} gives host {h.name!r} only slots={h.slots}; lower the ranks "
                              f"per node or raise its slots")
    return used


def world_size(hosts: list[Host], ranks_per_node: int | None) -> int:
    return sum(ranks_per_node or h.slots for h in hosts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mm_ds.runtime.distributed.hostfile", description="check a hostfile before launching")
    p.add_argument("hostfile")
    p.add_argument("--nodes", type=int, help="nodes to use (the first N hosts); default all")
    p.add_argument("--nproc-per-node", type=int, help="ranks per node; default each host's slots")
    p.add_argument("--slots", action="store_true", help="print only the ranks every one of the nodes can hold (the "
                   "least of their slots): launchers/deepspeed_hostfile.sh's default")
    a = p.parse_args(argv)
    try:
        used = select(read(a.hostfile), a.nodes, a.nproc_per_node, a.hostfile)
    except ConfigError as e:
        print(f"mm-ds: error: {e}", file=sys.stderr)
        return 2
    if a.slots:
        print(min(h.slots for h in used))
        return 0
    print(f"[mm-ds] {a.hostfile}: {len(used)} node(s), world size {world_size(used, a.nproc_per_node)}: "
          + ", ".join(f"{h.name}x{a.nproc_per_node or h.slots}" for h in used))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`mm-ds probe`: start the ranks as a stage starts them, and have each say where it runs.

    mm-ds probe launch.hostfile=hosts launch.nodes=4 launch.ranks=8

The ranks come up exactly as a training stage's do (the launcher's command from `launch.command`, each rank
running mm_ds/rank.py, `dist.init`'s rendezvous), then rank 0 lists every rank's host, local rank, device and
CPU threads, and all of them run one all-reduce. A first check on a new cluster, in seconds and before any data
is read: a rank on the wrong node, two ranks on one GPU, a node whose ranks never start, a thread count that
oversubscribes the node.
"""

from __future__ import annotations

import argparse
import sys
import time

from ...config import ConfigError, LaunchConfig, from_dict, parse_override
from . import dist, rendezvous
from . import launch as launching


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mm-ds probe", description="start the ranks as a stage would; each reports "
                                "its host, local rank, device and threads, and all run one all-reduce")
    # Overrides as a stage takes them: flags after the script would meet DeepSpeed's parser, which takes a
    # `--launch` for an abbreviation of its own `--launcher`.
    p.add_argument("overrides", nargs="*", metavar="launch.KEY=VALUE",
                   help="launch settings as a stage takes them, e.g. launch.launcher=srun launch.nodes=2 launch.ranks=8")
    return p


def launch_config(items: list[str]) -> LaunchConfig:
    """The launch.* settings of `launch.KEY=VALUE ...` over the defaults, checked as a stage's are."""
    data = {}
    for item in items:
        if not item.startswith("launch.") or "=" not in item:
            raise ConfigError(f"{item!r}: give launch settings as launch.KEY=VALUE, e.g. launch.ranks=8")
        key, value = parse_override(item.removeprefix("launch."))
        data[".".join(key)] = value
    cfg = from_dict(LaunchConfig, data, prefix="launch.")
    cfg.check()
    return cfg


def main(argv: list[str]) -> int:
    """Outside a launcher: check the launch settings and start the ranks. As a rank: report."""
    cfg = launch_config(parser().parse_args(argv).overrides)
    if launching.under_launcher() or cfg.launcher == "none":
        return report(cfg)
    launching.preflight(cfg)
    return launching.relaunch(cfg, ["probe", *argv])


def report(cfg: LaunchConfig) -> int:
    """Every rank: join the world, take part in one all-reduce; rank 0 prints what each rank told it."""
    started = time.monotonic()
    rank, _, world = dist.init(cfg)
    joined = time.monotonic() - started
    started = time.monotonic()
    total = dist.all_reduce([rank + 1.0])[0]
    took_ms = (time.monotonic() - started) * 1000
    expected = world * (world + 1) / 2
    if rank == 0:
        members = rendezvous.members()
        hosts = list(dict.fromkeys(m["host"] for m in members))
        print(f"[mm-ds probe] {world} rank(s) on {len(hosts)} node(s), {dist.backend()}, up in {joined:.1f} s", flush=True)
        for r, m in enumerate(members):
            device = (f"GPU {m['device']['index']} of {m['device']['count']}" if m.get("device") else "cpu")
            print(f"  rank {r:>4}  node {hosts.index(m['host'])} {m['host']:<20} local {m['local_rank']}/"
                  f"{m['local_world'] or '?'}  {device:<12} threads {m['threads']:<3} pid {m['pid']}", flush=True)
        ok = "ok" if total == expected else f"WRONG, expected {expected:.0f}"
        print(f"[mm-ds probe] all_reduce over {world} rank(s): {total:.0f} ({ok}) in {took_ms:.1f} ms", flush=True)
    if total != expected:
        print(f"[mm-ds probe] rank {rank}: all_reduce gave {total}, expected {expected}", file=sys.stderr, flush=True)
        return 1
    return 0

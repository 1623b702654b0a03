"""Starting ranks: `mm-ds <stage>` re-executes itself under a launcher when it is not already under one.

Under `deepspeed`, `mpirun`, or `srun` the environment already names the rank, and the stage runs
directly. Otherwise `launch.ranks` processes on each of `launch.nodes` nodes are started with
`launch.launcher`: `deepspeed` (one node, or a hostfile reached through pdsh/openmpi/slurm/..., or one
node at a time with `--no_ssh --node_rank`), `mpirun` (ranks found through mpi4py), or `srun`.
`preflight` checks the hostfile and the master port before anything starts.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys

from .config import ConfigError, LaunchConfig

RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
SRUN_STEP_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
"""Set in every task of an `srun` job step (not in the sbatch script itself, which has no SLURM_STEP_NUM_TASKS)."""


def under_launcher() -> bool:
    return any(v in os.environ for v in RANK_VARS) or all(v in os.environ for v in SRUN_STEP_VARS)


def _bin(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.path.exists(here) else shutil.which(name)
    if not found:
        raise ConfigError(f"launcher executable {name!r} not found next to {sys.executable} or on PATH; "
                          f"install it or set launch.launcher=none with launch.ranks=1")
    return found


def command(launch: LaunchConfig, argv: list[str]) -> list[str]:
    """The command line that runs `python -m mm_ds.cli ARGV` on `launch.ranks` ranks per node."""
    where = ["--master_addr", launch.master_addr, "--master_port", str(launch.master_port)]
    if launch.launcher == "deepspeed":
        if launch.hostfile:
            nodes = ["--hostfile", launch.hostfile, "--num_nodes", str(launch.nodes), "--launcher", launch.ds_launcher]
            if launch.node_rank is not None:
                nodes += ["--no_ssh", "--node_rank", str(launch.node_rank)]
        elif launch.nodes > 1:
            raise ConfigError(f"launch.nodes={launch.nodes} under deepspeed needs launch.hostfile (HOST slots=N lines)")
        else:
            nodes = []
        return [_bin("deepspeed"), *nodes, "--num_gpus", str(launch.ranks), *where, "--module", "mm_ds.cli", *argv]
    if launch.launcher == "mpirun":
        env = ["-x", f"MASTER_ADDR={launch.master_addr}", "-x", f"MASTER_PORT={launch.master_port}"]
        if launch.hostfile:
            env += ["--hostfile", launch.hostfile, "-npernode", str(launch.ranks)]
        elif launch.nodes > 1:
            raise ConfigError(f"launch.nodes={launch.nodes} under mpirun needs launch.hostfile (HOST slots=N lines)")
        return [_bin("mpirun"), "-n", str(launch.world_size), *env, sys.executable, "-m", "mm_ds.cli", *argv]
    if launch.launcher == "srun":
        return [_bin("srun"), "--nodes", str(launch.nodes), "--ntasks-per-node", str(launch.ranks),
                "--ntasks", str(launch.world_size), "--kill-on-bad-exit=1", sys.executable, "-m", "mm_ds.cli", *argv]
    raise ConfigError(f"launch.launcher={launch.launcher!r} cannot start {launch.world_size} ranks; "
                      f"use deepspeed, mpirun or srun")


def preflight(launch: LaunchConfig, port: bool = True) -> None:
    """Fail before any rank starts: hostfile lines, ranks vs. slots, the master address and port (`port=False`,
    `--dry-run`: whether the port is free is not checked, it need only be free when the ranks start)."""
    if launch.launcher == "none":
        return
    if launch.hostfile:
        from . import hostfile
        if launch.launcher == "srun":
            raise ConfigError("launch.hostfile is for deepspeed and mpirun; under srun the SLURM allocation "
                              "names the nodes (unset launch.hostfile)")
        hostfile.select(hostfile.read(launch.hostfile), launch.nodes, launch.ranks, launch.hostfile)
    if launch.launcher == "srun":
        return  # the address is the allocation's first node, known only inside the job
    # Rank 0 runs here on one node, or on node 0 of a --no_ssh start; a pdsh/openmpi start may be elsewhere.
    # The other --no_ssh nodes only need the address to resolve (node 0 may already be listening).
    check_master(launch.master_addr, launch.master_port, must_be_local=launch.nodes == 1 or launch.node_rank == 0,
                 bind=port and launch.node_rank in (None, 0))


def check_master(addr: str, port: int, must_be_local: bool, bind: bool = True) -> None:
    """The rendezvous address resolves and, when rank 0 may run here, its port can be bound."""
    try:
        ip = socket.gethostbyname(addr)
    except OSError as e:
        raise ConfigError(f"launch.master_addr={addr!r} does not resolve ({e}); give rank 0's address") from None
    if not bind:
        return
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like the TCPStore: TIME_WAIT is fine
        try:
            s.bind((ip, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"master port {port} on {addr} is already in use (another run?); choose a free "
                                  f"one with launch.master_port=N (MASTER_PORT)") from None
            if e.errno == errno.EADDRNOTAVAIL:
                if must_be_local:
                    raise ConfigError(f"launch.master_addr={addr!r} ({ip}) is not an address of this machine, "
                                      f"but rank 0 runs here; use 127.0.0.1 on one node, or this node's "
                                      f"address on several") from None
                return  # rank 0 runs on another node: nothing to bind here
            raise ConfigError(f"cannot bind the master port {addr}:{port}: {e}") from None


def relaunch(launch: LaunchConfig, argv: list[str]) -> int:
    cmd = command(launch, argv)
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MM_DS_LAUNCH_ROOT", str(os.getpid()))  # ranks exit when it dies (mm_ds/watchdog.py)
    print("[mm-ds] launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def main(argv: list[str] | None = None) -> int:
    """`python -m mm_ds.launch ...`: the launcher scripts' preflight (hostfile, slots, master port)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mm_ds.launch", description="check launch settings before starting")
    p.add_argument("--launcher", default="deepspeed", choices=["deepspeed", "mpirun", "srun"])
    p.add_argument("--hostfile", default="")
    p.add_argument("--nodes", type=int, help="default: every host of the hostfile, else 1")
    p.add_argument("--ranks", type=int, help="ranks per node; default: each host's slots")
    p.add_argument("--node-rank", type=int)
    p.add_argument("--master-addr", default="")
    p.add_argument("--master-port", type=int, default=29500)
    a = p.parse_args(argv)
    try:
        from . import hostfile
        hosts = hostfile.read(a.hostfile) if a.hostfile else []
        nodes = a.nodes or len(hosts) or 1
        ranks = a.ranks or (min(h.slots for h in hosts[:nodes]) if hosts else 1)
        # No address given: deepspeed asks the first host over ssh; only the hostfile can be checked here.
        addr = a.master_addr or (hosts[0].name if hosts else "127.0.0.1")
        cfg = LaunchConfig(ranks=ranks, launcher=a.launcher, master_port=a.master_port, master_addr=addr, nodes=nodes,
                           hostfile=a.hostfile, node_rank=a.node_rank)
        cfg.check()
        if a.hostfile:
            hostfile.select(hosts, nodes, a.ranks, a.hostfile)
        if a.master_addr or not hosts:
            preflight(LaunchConfig(**{**cfg.__dict__, "hostfile": ""}))
    except ConfigError as e:
        print(f"mm-ds: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Starting ranks: `mm-ds <stage>` re-executes itself under a launcher when it is not already under one.

Under `deepspeed`, `mpirun`, or `srun` the environment already names the rank, and the stage runs
directly. Otherwise `launch.ranks` processes on each of `launch.nodes` nodes are started with
`launch.launcher`: `deepspeed` (one node, or a hostfile reached through pdsh/openmpi/slurm/..., or one
node at a time with `--no_ssh --node_rank`), `mpirun` (ranks found through mpi4py), or `srun`.
`preflight` checks the hostfile, the master address and the master port before anything starts.

A launcher hands a remote node's ranks only part of the launching shell's environment (pdsh: a few prefixes,
mpirun: the `-x` names, srun: all of it), so nothing a rank decides collectively may come from it
(mm_ds/runtime/environment.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys

from ..config import ConfigError, LaunchConfig
# Which launcher's variables make a process a rank: one table (mm_ds/runtime/bringup.py LAUNCHERS).
from .bringup import MARKED, RANK_VARS, SRUN_STEP_VARS, is_loopback, under_launcher  # noqa: F401


def _bin(name: str) -> str:
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.path.exists(here) else shutil.which(name)
    if not found:
        raise ConfigError(f"launcher executable {name!r} not found next to {sys.executable} or on PATH; "
                          f"install it or set launch.launcher=none with launch.ranks=1")
    return found


ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank.py")
"""What every rank runs: a script path, since DeepSpeed's slurm runner drops `--module` (mm_ds/rank.py)."""
FORWARDED = ("NCCL", "PYTHON", "UCX", "MV2", "MLFLOW", "GLOO_SOCKET_IFNAME")
"""What DeepSpeed's runners forward to other nodes (its EXPORT_ENVS and the CUDA accelerator's NCCL), and the
gloo interface: `mpirun` gets a `-x` for each of these that is set, so a remote rank sees the same."""


def master_addr(launch: LaunchConfig) -> str:
    """`launch.master_addr`, or when empty: 127.0.0.1 on one node; the hostfile's first host, where rank 0 runs,
    for `deepspeed --no_ssh` and DeepSpeed's slurm runner (neither can ask that host); else empty, found at
    start: DeepSpeed's ssh runners ask the first host (`hostname -I`), mpirun's rank 0 tells the others its
    `hostname -I` (DeepSpeed's MPI discovery), srun's ranks take the allocation's first node."""
    if launch.master_addr or launch.nodes == 1:
        return launch.master_addr or "127.0.0.1"
    if launch.launcher == "deepspeed" and launch.hostfile and (launch.node_rank is not None
                                                               or launch.ds_launcher == "slurm"):
        from . import hostfile
        return hostfile.read(launch.hostfile)[0].name
    return ""


def command(launch: LaunchConfig, argv: list[str]) -> list[str]:
    """The command line that runs `python -m mm_ds.cli ARGV` on `launch.ranks` ranks per node."""
    addr = master_addr(launch)
    where = [*(["--master_addr", addr] if addr else []), "--master_port", str(launch.master_port)]
    if launch.launcher == "deepspeed":
        if launch.hostfile:
            nodes = ["--hostfile", launch.hostfile, "--num_nodes", str(launch.nodes), "--launcher", launch.ds_launcher]
            if launch.node_rank is not None:
                nodes += ["--no_ssh", "--node_rank", str(launch.node_rank)]
            else:
                nodes += runner_args(launch)
        elif launch.nodes > 1:
            raise ConfigError(f"launch.nodes={launch.nodes} under deepspeed needs launch.hostfile (HOST slots=N lines)")
        else:
            nodes = []
        return [_bin("deepspeed"), *nodes, "--num_gpus", str(launch.ranks), *where, ENTRY, *argv]
    if launch.launcher == "mpirun":
        env = [*(["-x", f"MASTER_ADDR={addr}"] if addr else []), "-x", f"MASTER_PORT={launch.master_port}"]
        env += [a for k in sorted(os.environ) if k.startswith(FORWARDED) for a in ("-x", k)]
        if launch.hostfile:
            env += ["--hostfile", launch.hostfile, "-npernode", str(launch.ranks)]
        elif launch.nodes > 1:
            raise ConfigError(f"launch.nodes={launch.nodes} under mpirun needs launch.hostfile (HOST slots=N lines)")
        # OpenMPI binds each rank to one core when it starts two or fewer: a rank's share of the node's cores
        # (mm_ds.runtime.dist.set_threads) instead.
        return [_bin("mpirun"), "-n", str(launch.world_size), *env, "--bind-to", "none", sys.executable, ENTRY,
                *argv]
    if launch.launcher == "srun":
        return [_bin("srun"), "--nodes", str(launch.nodes), "--ntasks-per-node", str(launch.ranks),
                "--ntasks", str(launch.world_size), *srun_cpus(launch.ranks), "--kill-on-bad-exit=1",
                sys.executable, ENTRY, *argv]
    raise ConfigError(f"launch.launcher={launch.launcher!r} cannot start {launch.world_size} ranks; "
                      f"use deepspeed, mpirun or srun")


def runner_args(launch: LaunchConfig) -> list[str]:
    """What DeepSpeed's runner is given when it starts every node from here (no --node_rank): each rank's CPUs
    (`runner_cpus`), and for slurm `--no_ssh_check` (srun reaches the nodes; ssh to them need not work)."""
    return runner_cpus(launch) + (["--no_ssh_check"] if launch.ds_launcher == "slurm" else [])


def runner_cpus(launch: LaunchConfig) -> list[str]:
    """`--launcher_args` for DeepSpeed's openmpi and slurm runners, which start the ranks with mpirun or srun:
    each rank's CPUs as mm-ds's own mpirun and srun commands give them (theirs would bind a rank to one core, or
    give a srun task one CPU). pdsh starts DeepSpeed's launcher on each node, which binds nothing."""
    flags = {"openmpi": ["--bind-to", "none"], "slurm": srun_cpus(launch.ranks)}.get(launch.ds_launcher, [])
    # One word: DeepSpeed's parser would take a separate `--cpus-per-task=N` for an unknown option of its own.
    return [f"--launcher_args={' '.join(flags)}"] if flags else []


def srun_cpus(ranks_per_node: int) -> list[str]:
    """`--cpus-per-task`: the batch job's own, else this node's CPUs of the allocation shared by its tasks (srun
    gives a task one CPU otherwise, where the allocation was sized in tasks)."""
    per_task, on_node = os.environ.get("SLURM_CPUS_PER_TASK", ""), os.environ.get("SLURM_CPUS_ON_NODE", "")
    if per_task.isdigit():
        return [f"--cpus-per-task={per_task}"]
    return [f"--cpus-per-task={max(1, int(on_node) // ranks_per_node)}"] if on_node.isdigit() else []


def preflight(launch: LaunchConfig, port: bool = True) -> None:
    """Fail before any rank starts: hostfile lines, ranks vs. slots, the master address and port (`port=False`,
    `--check`: whether the port is free is not checked, it need only be free when the ranks start)."""
    if launch.launcher == "none":
        return
    check_hosts(launch)
    addr = master_addr(launch)
    if launch.launcher == "srun" or not addr:
        return  # the address is found at start (the allocation's first node, or asked of rank 0's host)
    # Rank 0 runs here on one node, or on node 0 of a --no_ssh start; a pdsh/openmpi start may be elsewhere.
    # The other --no_ssh nodes only need the address to resolve (node 0 may already be listening).
    check_master(addr, launch.master_port, must_be_local=launch.nodes == 1 or launch.node_rank == 0,
                 bind=port and launch.node_rank in (None, 0))


def check_hosts(launch: LaunchConfig) -> None:
    """What needs no network: the hostfile (its lines, nodes and slots) and a master address that is not
    loopback on several nodes (`mm-ds run --check` runs this much on a login node)."""
    hosts = []
    if launch.hostfile:
        from . import hostfile
        if launch.launcher == "srun":
            raise ConfigError("launch.hostfile is for deepspeed and mpirun; under srun the SLURM allocation "
                              "names the nodes (unset launch.hostfile)")
        hosts = hostfile.select(hostfile.read(launch.hostfile), launch.nodes, launch.ranks, launch.hostfile)
    addr = master_addr(launch)
    if launch.nodes > 1 and addr and is_loopback(addr) and not (hosts and all(is_loopback(h.name) for h in hosts)):
        # Loopback reaches rank 0 from every node only when every node is this machine (a hostfile of
        # localhost/127.x lines): otherwise each other node dials itself until the 30-minute store timeout.
        fix = f"e.g. launch.master_addr={hosts[0].name} (the hostfile's first host)" if hosts else \
            "launch.master_addr=NODE0"
        raise ConfigError(f"launch.master_addr={addr} is loopback, but launch.nodes={launch.nodes}: the other nodes' "
                          f"ranks would dial their own machine and wait 30 minutes. Give rank 0's address that the "
                          f"other nodes reach, {fix}, or leave launch.master_addr empty for mm-ds to choose")


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


def launch_env(launch: LaunchConfig) -> dict[str, str]:
    """The launcher's environment over this process's. MASTER_ADDR/PORT reach the ranks of srun and of
    DeepSpeed's slurm runner this way (their command lines carry no address); the rest as each launcher
    forwards it: nothing collective depends on it (mm_ds/runtime/environment.py)."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MM_DS_LAUNCH_ROOT", str(os.getpid()))  # ranks exit when it dies (mm_ds/runtime/watchdog.py)
    env.pop(MARKED, None)  # an outer launch's mark is not this one's
    if launch.launcher != "none":
        env["MASTER_PORT"] = str(launch.master_port)
        if master_addr(launch):
            env["MASTER_ADDR"] = env[MARKED] = master_addr(launch)  # srun's ranks keep what mm-ds chose
    return env


def relaunch(launch: LaunchConfig, argv: list[str], env: dict[str, str] | None = None) -> int:
    cmd = command(launch, argv)
    print("[mm-ds] launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=launch_env(launch) | (env or {}))


def main(argv: list[str] | None = None) -> int:
    """`python -m mm_ds.runtime.launch ...`: the launcher scripts' preflight (hostfile, slots, master address and port);
    prints the master address the ranks are to meet at (empty: found at start), or with --runner-args what
    DeepSpeed's runner is to pass its mpirun or srun."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mm_ds.runtime.launch", description="check launch settings before starting")
    p.add_argument("--launcher", default="deepspeed", choices=["deepspeed", "mpirun", "srun"])
    p.add_argument("--hostfile", default="")
    p.add_argument("--nodes", type=int, help="default: every host of the hostfile, else 1")
    p.add_argument("--ranks", type=int, help="ranks per node; default: each host's slots")
    p.add_argument("--node-rank", type=int)
    p.add_argument("--ds-launcher", default="pdsh", help="how deepspeed reaches the other nodes")
    p.add_argument("--master-addr", default="", help="default: the hostfile's first host, else 127.0.0.1")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--runner-args", action="store_true", help="print instead what deepspeed is to pass its openmpi "
                   "or slurm runner (each rank's CPUs, slurm's --no_ssh_check), one a line; empty for pdsh")
    a = p.parse_args(argv)
    try:
        from . import hostfile
        hosts = hostfile.read(a.hostfile) if a.hostfile else []
        nodes = a.nodes or len(hosts) or 1
        ranks = a.ranks or (min(h.slots for h in hosts[:nodes]) if hosts else 1)
        cfg = LaunchConfig(ranks=ranks, launcher=a.launcher, master_port=a.master_port, master_addr=a.master_addr,
                           nodes=nodes, hostfile=a.hostfile, node_rank=a.node_rank, ds_launcher=a.ds_launcher)
        cfg.check()
        preflight(cfg)
    except ConfigError as e:
        print(f"mm-ds: error: {e}", file=sys.stderr)
        return 2
    if a.runner_args:  # one argument a line (--launcher_args=... holds a space); no line when there are none
        for arg in runner_args(cfg) if cfg.node_rank is None else []:
            print(arg)
    else:
        print(master_addr(cfg) or "")  # the scripts pass it on
    return 0


if __name__ == "__main__":
    sys.exit(main())

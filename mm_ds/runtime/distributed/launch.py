"""Starting ranks: `mm-ds <stage>` re-executes itself under a launcher when it is not already under one.

Under `deepspeed`, `mpirun`, or `srun` the environment already names the rank, and the stage runs
directly. Otherwise `launch.ranks` processes on each of `launch.nodes` nodes are started with
`launch.launcher`: `deepspeed` (one node, or a hostfile reached through one of DeepSpeed's runners: pdsh, openmpi,
slurm, ... as mm_ds/runtime/distributed/runners.py drives them, or one node at a time with `--no_ssh --node_rank`),
`mpirun` (ranks found through mpi4py), or `srun`. `resolve` completes the settings once (the hostfile decides the node
count); `preflight` checks the hostfile, the machine rank 0 starts on, the executables, the master address and
port before anything starts. `python -m mm_ds.runtime.distributed.launch KEY=VALUE...` is the launcher scripts' preflight.

A launcher hands a remote node's ranks only part of the launching shell's environment
(mm_ds/runtime/distributed/environment.py FORWARDED is added on every path), so nothing a rank decides collectively
may come from it.
"""

from __future__ import annotations

import errno
import os
import socket
import sys

from ...config import ConfigError, LaunchConfig, apply_overrides, from_dict
from . import hostfile, runners, stop

# Which launcher's variables make a process a rank: one table (mm_ds/runtime/distributed/bringup.py LAUNCHERS).
from .bringup import RANK_VARS, SRUN_STEP_VARS, is_loopback, under_launcher  # noqa: F401
from .environment import forwarded
from .runners import bin_path as _bin
from .srun import MARKED

ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "rank.py")
"""What every rank runs: a script path, since DeepSpeed's slurm runner drops `--module` (mm_ds/rank.py)."""


def resolve(launch: LaunchConfig) -> LaunchConfig:
    """The settings complete, as far as they can be known without a network: `launch.nodes` from the hostfile when
    unset (all its hosts), the node rank within them, DeepSpeed's runner by name. In place, once, on the machine
    that starts the launch (only it reads the hostfile); returns `launch`."""
    if launch.nodes is None:
        launch.nodes = len(hostfile.read(launch.hostfile)) if launch.hostfile and launch.launcher != "none" else 1
    launch.check()
    runners.runner(launch)
    return launch


def _starts_every_node(launch: LaunchConfig) -> bool:
    """deepspeed starts every node from here through its runner (not one node's ranks, not only this machine's)."""
    return (launch.launcher == "deepspeed" and bool(launch.hostfile) and launch.node_rank is None
            and (launch.nodes > 1 or launch.force_multi))


def master_addr(launch: LaunchConfig) -> str:
    """`launch.master_addr`, or when empty: 127.0.0.1 on one node; under deepspeed with a hostfile its first host
    by name, where rank 0 runs, which every node resolves itself (DeepSpeed's runners would otherwise ask that host
    for `hostname -I` and take the first address, often a docker bridge); else empty, found at start: mpirun's
    rank 0 tells the others its `hostname -I` (DeepSpeed's MPI discovery), srun's ranks take the allocation's
    first node."""
    resolve(launch)
    if launch.master_addr or launch.nodes == 1:
        return launch.master_addr or "127.0.0.1"
    if launch.launcher == "deepspeed" and launch.hostfile:
        return runners.host_name(hostfile.read(launch.hostfile)[0].name)
    return ""


def command(launch: LaunchConfig, argv: list[str]) -> list[str]:
    """The command line that runs `python -m mm_ds.cli ARGV` on `launch.ranks` ranks per node."""
    # OpenMPI binds each rank to one core when it starts two or fewer: a rank's share of the node's cores
    # (mm_ds.runtime.distributed.dist.set_threads) instead.
    ranks = {"deepspeed": [ENTRY], "mpirun": ["--bind-to", "none", sys.executable, ENTRY],
             "srun": [sys.executable, ENTRY]}
    head = launcher_command(launch)
    return [*head, *ranks[launch.launcher], *argv]


def rank_command(launch: LaunchConfig, what: str | os.PathLike) -> list[str]:
    """The command that runs `mm_ds/rank.py WHAT` (a resolved run directory) on every rank of `launch`; under
    launch.launcher=none, one process here."""
    if launch.launcher == "none":
        return [sys.executable, ENTRY, str(what)]
    return command(launch, [str(what)])


def launcher_command(launch: LaunchConfig) -> list[str]:
    """The launcher's part of `command`, before what each rank runs (the launcher scripts run their own)."""
    resolve(launch)
    addr = master_addr(launch)
    if launch.launcher == "deepspeed":
        where = [*(["--master_addr", addr] if addr else []), "--master_port", str(launch.master_port)]
        return [_bin("deepspeed"), *_deepspeed_nodes(launch), *where]
    if launch.launcher == "mpirun":
        mpirun = _bin("mpirun")
        env = [*(["-x", f"MASTER_ADDR={addr}"] if addr else []), "-x", f"MASTER_PORT={launch.master_port}"]
        env += [a for name, _ in sorted(os.environ.items()) if forwarded(name) for a in ("-x", name)]
        if launch.hostfile:
            env += ["--hostfile", launch.hostfile, "-npernode", str(launch.ranks)]
        elif launch.nodes > 1:
            raise ConfigError(f"launch.nodes={launch.nodes} under mpirun needs launch.hostfile (HOST slots=N lines)")
        # By absolute path, with its install root: the other nodes' daemons start from the same Open MPI.
        return [mpirun, "--prefix", runners.mpirun_prefix(mpirun), "-n", str(launch.world_size), *env]
    if launch.launcher == "srun":
        return [_bin("srun"), "--nodes", str(launch.nodes), "--ntasks-per-node", str(launch.ranks),
                "--ntasks", str(launch.world_size), *runners.srun_cpus(launch.ranks), "--kill-on-bad-exit=1"]
    raise ConfigError(f"launch.launcher={launch.launcher!r} cannot start {launch.world_size} ranks; "
                      f"use deepspeed, mpirun or srun")


def _deepspeed_nodes(launch: LaunchConfig) -> list[str]:
    """deepspeed's arguments for the nodes: this machine's ranks, one node's of a `--no_ssh` start, or every node
    through its runner (mm_ds/runtime/distributed/runners.py runner_args)."""
    if not launch.hostfile:
        if launch.nodes > 1:
            raise ConfigError(f"launch.nodes={launch.nodes} under deepspeed needs launch.hostfile (HOST slots=N lines)")
        return ["--num_gpus", str(launch.ranks)]
    counts = ["--hostfile", launch.hostfile, "--num_nodes", str(launch.nodes), "--num_gpus", str(launch.ranks)]
    if launch.node_rank is not None:
        return [*counts, "--launcher", launch.ds_launcher, "--no_ssh", "--node_rank", str(launch.node_rank)]
    if launch.nodes == 1 and not launch.force_multi:  # its ranks here (check_hosts: this is that node, or run_here)
        return [*counts, "--no_ssh_check"]
    hosts = hostfile.select(hostfile.read(launch.hostfile), launch.nodes, launch.ranks, launch.hostfile)
    return runners.runner_args(launch, hosts) + (["--force_multi"] if launch.nodes == 1 else [])


def preflight(launch: LaunchConfig, port: bool = True, here: bool | None = None) -> list[str]:
    """Fail before any rank starts: hostfile lines, ranks vs. slots, the machine rank 0 starts on, the master
    address and port, the executables. `port=False` (`--check`): the port is not bound (it need only be free when
    the ranks start). `here` (default: `port`): the launch starts from this machine, so the addresses it needs must
    resolve here; else (`--check`, perhaps on a login node) one that does not is a note, not a failure. Returns
    those notes: what was not checked."""
    resolve(launch)
    if launch.launcher == "none":
        return []
    notes = check_addresses(launch, check_hosts(launch), port, port if here is None else here)
    check_tools(launch)
    return notes


def check_addresses(launch: LaunchConfig, hosts: list[hostfile.Host], port: bool, here: bool) -> list[str]:
    """The master address resolves (and its port binds, when rank 0 starts here and `port`), and the openmpi
    runner's node addresses; what does not resolve is a note unless the launch starts `here`."""
    addr, notes = master_addr(launch), []
    if launch.launcher != "srun" and addr:  # else found at start (the allocation's first node, or rank 0's)
        try:
            socket.getaddrinfo(addr, None)
        except OSError as e:
            if here:
                raise ConfigError(f"launch.master_addr={addr!r} does not resolve ({e}); give rank 0's address") from None
            notes.append(f"master address {addr} not checked: not resolvable from here")
        else:
            # Rank 0 runs here on one node, or on node 0 of a --no_ssh start; a runner's start may be elsewhere.
            # The other --no_ssh nodes only need the address to resolve (node 0 may already be listening).
            check_master(addr, launch.master_port, must_be_local=launch.nodes == 1 or launch.node_rank == 0,
                         bind=port and launch.node_rank in (None, 0))
    if _starts_every_node(launch) and launch.ds_launcher == "openmpi":
        try:
            runners.node_addresses(hosts)
        except ConfigError:
            if here:
                raise
            notes.append("the openmpi runner's node addresses not checked: the hostfile's names do not resolve here")
    return notes


def check_hosts(launch: LaunchConfig) -> list[hostfile.Host]:
    """What needs no network: the hostfile (its lines, nodes and slots), a master address that is not loopback on
    several nodes, and rank 0's machine. Returns the hosts the launch uses (none without a hostfile)."""
    resolve(launch)
    hosts = []
    if launch.hostfile:
        if launch.launcher == "srun":
            raise ConfigError("launch.hostfile is for deepspeed and mpirun; under srun the SLURM allocation "
                              "names the nodes (unset launch.hostfile)")
        hosts = hostfile.select(hostfile.read(launch.hostfile), launch.nodes, launch.ranks, launch.hostfile)
    elif launch.nodes > 1 and launch.launcher in ("deepspeed", "mpirun"):
        raise ConfigError(f"launch.nodes={launch.nodes} under {launch.launcher} needs launch.hostfile (HOST slots=N "
                          f"lines)")
    addr = master_addr(launch)
    if launch.nodes > 1 and addr and is_loopback(addr) and not (hosts and all(is_loopback(h.name) for h in hosts)):
        # Loopback reaches rank 0 from every node only when every node is this machine (a hostfile of
        # localhost/127.x lines): otherwise each other node dials itself until the 30-minute store timeout.
        fix = f"e.g. launch.master_addr={hosts[0].name} (the hostfile's first host)" if hosts else \
            "launch.master_addr=NODE0"
        raise ConfigError(f"launch.master_addr={addr} is loopback, but launch.nodes={launch.nodes}: the other nodes' "
                          f"ranks would dial their own machine and wait 30 minutes. Give rank 0's address that the "
                          f"other nodes reach, {fix}, or leave launch.master_addr empty for mm-ds to choose")
    if (launch.launcher == "deepspeed" and hosts and launch.nodes == 1 and launch.node_rank is None
            and not launch.run_here and not launch.force_multi and not is_this_machine(hosts[0].name)):
        raise ConfigError(f"launch.hostfile={launch.hostfile} gives the one node (launch.nodes=1) as {hosts[0].name!r}, "
                          f"but deepspeed runs a one-node launch's ranks on the machine it starts on, "
                          f"{socket.gethostname()!r}, which is not {hosts[0].name!r}: start it on {hosts[0].name}, set "
                          f"launch.nodes to the number of the hostfile's hosts to use, or launch.run_here=true to run "
                          f"the ranks here")
    return hosts


def is_this_machine(name: str) -> bool:
    """`name` (a hostfile entry) is this machine: loopback, its host name, or an address it can bind."""
    name = runners.host_name(name)
    if is_loopback(name) or name.split(".")[0] == socket.gethostname().split(".")[0]:
        return True
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
    except OSError:
        return False  # what does not resolve here is not here
    for family, _, _, _, where in found:
        if is_loopback(where[0]):
            return True
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind((where[0], 0))
                return True
            except OSError:
                continue
    return False


def check_tools(launch: LaunchConfig) -> None:
    """The launcher's executables are here, and for a runner's start from here the runner's (runners.check_tools).
    mm-ds's own mpirun command speaks Open MPI (-x, -npernode, --prefix)."""
    _bin(launch.launcher)
    if _starts_every_node(launch):
        runners.check_tools(launch)
    if launch.launcher == "mpirun" and "Open MPI" not in runners.version(_bin("mpirun"), "--version"):
        raise ConfigError(f"launch.launcher=mpirun starts Open MPI's mpirun (-x, -npernode, --prefix), but "
                          f"{_bin('mpirun')} is not Open MPI's; put Open MPI's first on PATH, or use "
                          f"launch.launcher=deepspeed with launch.ds_launcher=mpich")


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


def describe(launch: LaunchConfig) -> str:
    """The launch in one line, for `--check`: launcher and runner, nodes x ranks = world size, rank 0's address."""
    resolve(launch)
    if launch.launcher == "none":
        return "none: this process, world size 1"
    how = {"deepspeed": "deepspeed on this machine", "mpirun": "mpirun (Open MPI)", "srun": "srun, in the allocation"}
    way = (f"deepspeed through DeepSpeed's {launch.ds_launcher} runner" if _starts_every_node(launch) else
           f"deepspeed --no_ssh, node {launch.node_rank}'s ranks (the same command on every node)"
           if launch.launcher == "deepspeed" and launch.node_rank is not None else how[launch.launcher])
    spans = launch.launcher == "mpirun" or launch.launcher == "deepspeed" and launch.nodes > 1  # the hostfile's hosts
    hosts = hostfile.read(launch.hostfile)[:launch.nodes] if launch.hostfile and spans else []
    on = f" on {', '.join(h.name for h in hosts[:8])}{', ...' if len(hosts) > 8 else ''}" if hosts else ""
    addr = master_addr(launch) or {"mpirun": "rank 0's `hostname -I` (found at start)",
                                   "srun": "the allocation's first node"}.get(launch.launcher, "")
    return (f"{way}: {launch.nodes} node(s) x {launch.ranks} rank(s) = world size {launch.world_size}{on}; "
            f"master {addr}:{launch.master_port}")


def runner_env(launch: LaunchConfig) -> dict[str, str]:
    """What the launcher process needs in its environment beyond this shell's. MASTER_ADDR/PORT reach the ranks of
    srun and of DeepSpeed's slurm runner this way (their command lines carry no address). DeepSpeed's runners start
    pdsh, mpirun and srun by name: this Python's folder goes first on PATH, so that they start the ones mm-ds
    checked. And the environment file they forward to the other nodes (runners.env_file)."""
    if launch.launcher == "none":
        return {}
    addr = master_addr(launch)
    master = {**({"MASTER_ADDR": addr} if addr else {}), "MASTER_PORT": str(launch.master_port)}
    env = dict(master)
    if launch.launcher == "deepspeed":
        here, path = os.path.dirname(sys.executable), os.environ.get("PATH", "")
        if here not in path.split(os.pathsep):
            env["PATH"] = f"{here}{os.pathsep}{path}"
        if _starts_every_node(launch):
            left_out = runners.unpassable(launch)
            if runners.runner(launch).env_file:
                env["DS_ENV_FILE"] = runners.env_file(master, left_out)
            if left_out:
                print(f"[mm-ds] warning: DeepSpeed's {launch.ds_launcher} runner cannot pass these to the other nodes "
                      f"as they are (their values need quotes, which reach the ranks): {', '.join(left_out)}; set "
                      f"them in each node's own environment, or start with launch.launcher=mpirun (-x passes any "
                      f"value)", file=sys.stderr, flush=True)
    return env


def process_env() -> dict[str, str]:
    """The environment of every process mm-ds starts (a launcher, a rank of launcher none, `mm-ds prepare`): this
    process's, with what mm-ds adds where the user set nothing (the user's value wins), and unbuffered output (a log
    shows a rank's lines as they come). The one place that sets it: `launch_env` starts from it."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")  # mpirun as root (containers)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("MM_DS_LAUNCH_ROOT", str(os.getpid()))  # ranks exit when it dies (mm_ds/runtime/distributed/watchdog.py)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch_env(launch: LaunchConfig) -> dict[str, str]:
    """The launcher's environment (`runner_env`) over this process's (`process_env`); the rest as each launcher
    forwards it: nothing collective depends on it (mm_ds/runtime/distributed/environment.py)."""
    env = process_env()
    env.pop(MARKED, None)  # an outer launch's mark is not this one's
    own = runner_env(resolve(launch))
    if "MASTER_ADDR" in own:
        own[MARKED] = own["MASTER_ADDR"]  # srun's ranks keep what mm-ds chose (srun.py srun_master)
    return env | own


def relaunch(launch: LaunchConfig, argv: list[str], grace_s: float | None = None) -> int:
    """Start the ranks of `mm-ds ARGV` under the launcher and wait for them. A stop signal received here is passed
    on to the launcher (mm_ds/runtime/distributed/stop.py: it runs in a session of its own); the ranks save and leave
    within `grace_s` (train.stop_grace_s) and this returns stop.EXIT_CODE."""
    cmd = command(launch, argv)
    print("[mm-ds] launching:", " ".join(cmd), flush=True)
    return stop.run_child(cmd, grace_s or stop.GRACE_S, env=launch_env(launch))


def main(argv: list[str] | None = None) -> int:
    """`python -m mm_ds.runtime.distributed.launch KEY=VALUE...`: the launcher scripts' preflight of `launch.*` settings
    (the keys, types and checks of `mm-ds STAGE launch.KEY=VALUE`); prints the launch (`describe`) to stderr, and with
    --command the launcher's command as mm-ds runs it, one argument a line, after `env` and what its environment
    needs: the scripts run it with their rank program."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mm_ds.runtime.distributed.launch", description="check launch settings before starting")
    p.add_argument("settings", nargs="*", metavar="KEY=VALUE", help="launch.* settings, e.g. hostfile=hosts ranks=8")
    p.add_argument("--command", action="store_true", help="print the launcher's command, one argument a line")
    p.add_argument("--check", action="store_true", help="as `--check` checks: the port is not bound, and an "
                   "address that does not resolve here is a note (the scripts' CHECK=1)")
    a = p.parse_args(argv)
    try:
        data = apply_overrides({}, [s.removeprefix("launch.") for s in a.settings])
        cfg = resolve(from_dict(LaunchConfig, data, prefix="launch."))
        notes = preflight(cfg, port=not a.check)
        cmd = ["env", *(f"{k}={v}" for k, v in runner_env(cfg).items()), *launcher_command(cfg)] if a.command else []
    except ConfigError as e:
        print(f"mm-ds: error: {e}", file=sys.stderr)
        return 2
    print("\n".join([f"[mm-ds] launch: {describe(cfg)}", *(f"[mm-ds] note: {n}" for n in notes)]), file=sys.stderr)
    if cmd:
        print("\n".join(cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())

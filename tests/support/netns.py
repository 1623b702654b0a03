"""Emulated nodes for multi-node tests: one network namespace per node, on one machine (root only).

Each node gets its own network namespace, its own host name (a UTS namespace per process started there) and
its own /etc/hosts (`ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts). The nodes are joined by a
bridge in a namespace of its own (a switch), each by a veth pair whose node end is named like a server's NIC
(INTERFACE: not eth0, which DeepSpeed's openmpi runner assumes) on a private /24 that exists only inside the
namespaces, so a process on one node reaches another only by that node's address: dialing 127.0.0.1 for another
node fails as it would on a cluster. Every node's /etc/hosts maps its own name to 127.0.1.1, as Debian and
Ubuntu install it, and the other nodes' names to their addresses.

Processes start with `env -i` plus what a launcher gives a remote node (`remote_env`), never the test's
environment. The launchers' tools are stood in by tests/standins (ssh, pdsh, srun, scontrol, sinfo, hydra's
mpirun), which start processes on the nodes of the map `write_map` writes, as the real tools would (each says
what it emulates and what not); OpenMPI's mpirun is the real one, its daemons started through the ssh stand-in.
`down` kills every process in the namespaces and removes them and their /etc/netns entries; the `nodes` fixture
calls it also when a test fails.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from standins import cluster

VENV_BIN = Path(sys.executable).parent
MM_DS = [sys.executable, "-m", "mm_ds.cli"]
"""`mm-ds` as a user types it, by this interpreter (its console script may have been installed for another)."""
STANDINS = Path(__file__).resolve().parents[1] / "standins"
"""ssh, pdsh, srun, scontrol, sinfo; hydra/ holds hydra's mpirun (and mpiname), kept apart from OpenMPI's."""
INTERFACE = "ens3"
LOGIN_PATH = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORWARDED_PREFIXES = ("PYTHON", "NCCL")
"""What DeepSpeed's pdsh runner forwards of the launching shell (EXPORT_ENVS and the accelerator's), in
the test's environment; the rest (UCX, MV2, MLFLOW) is not set here."""


class Unavailable(Exception):
    """Network namespaces cannot be made here (not root, no `ip`/`unshare`, or the kernel refuses)."""


@dataclass(frozen=True)
class Node:
    rank: int
    name: str
    """Its host name (and its name in hostfiles)."""
    ns: str
    addr: str


def login_env(**extra: str) -> dict[str, str]:
    """What a login on a node starts with (ssh, or a shell where `--no_ssh` commands are typed): PATH with the
    venv first, as a user's profile would put it, HOME and LANG; plus `extra`."""
    return {"PATH": LOGIN_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"} | extra


def remote_env(**extra: str) -> dict[str, str]:
    """A login's environment plus the PYTHON*/NCCL* variables of the test's that a pdsh launch forwards."""
    return login_env(**{k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}) | extra


class Nodes:
    """`n` emulated nodes; `up()` makes them, `down()` removes them (idempotent)."""

    def __init__(self, n: int = 2):
        tag = f"{os.getpid() % 10000:04d}{random.randrange(16 ** 3):03x}"  # unique per run and per test
        net = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"
        self.tag = tag
        self.nodes = [Node(k, f"mmds{tag}n{k}", f"mmds-{tag}-{k}", f"{net}.{k + 1}") for k in range(n)]
        self.switch = f"mmds-{tag}-sw"
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def __getitem__(self, k: int) -> Node:
        return self.nodes[k]

    # ------------------------------------------------------------ set-up and tear-down

    def up(self) -> Nodes:
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            raise Unavailable("network namespaces need root (ip netns add)")
        for tool in ("ip", "unshare", "hostname"):
            if not shutil.which(tool):
                raise Unavailable(f"`{tool}` not found (iproute2 / util-linux)")
        try:
            for node in self.nodes:
                self._ip("netns", "add", node.ns)
                self._made.append(node.ns)
                self._ip("-n", node.ns, "link", "set", "lo", "up")
                hosts = Path("/etc/netns") / node.ns / "hosts"
                hosts.parent.mkdir(parents=True, exist_ok=True)
                hosts.write_text("127.0.0.1 localhost\n" + "".join(
                    f"{'127.0.1.1' if other is node else other.addr} {other.name}\n" for other in self.nodes))
            self._ip("netns", "add", self.switch)
            self._made.append(self.switch)
            self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.switch, "link", "set", "br0", "up")
            for node in self.nodes:  # each node's NIC, cabled to a port of the switch's bridge
                port = f"p{node.rank}"
                self._ip("-n", node.ns, "link", "add", INTERFACE, "type", "veth", "peer", "name", port,
                         "netns", self.switch)
                self._ip("-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", INTERFACE)
                self._ip("-n", node.ns, "link", "set", INTERFACE, "up")
                self._ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        except (OSError, subprocess.CalledProcessError) as e:
            self.down()
            detail = getattr(e, "stderr", "") or e
            raise Unavailable(f"cannot make network namespaces here: {str(detail).strip()}") from None
        return self

    def down(self) -> None:
        self.kill_all()
        for ns in self._made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self._made, self.procs = [], []

    def kill_all(self) -> None:
        """Every process this test started, and anything still inside the nodes (daemonised mpirun helpers,
        orphaned ranks): only ours, by process group and by namespace."""
        for p in self.procs:  # what we started, and their process groups
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for ns in self._made:
            for _ in range(20):
                pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.1)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    # ------------------------------------------------------------ running things on a node

    def command(self, node: Node, argv: list[str], env: dict[str, str]) -> list[str]:
        """`argv` on `node`: in its namespace, under its host name, with exactly `env`."""
        return cluster.on_node({}, {"name": node.name, "ns": node.ns}, argv, env)

    def start(self, node: Node, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
        f = open(log, "w")
        p = subprocess.Popen(self.command(node, argv, env), stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                             start_new_session=True)
        f.close()
        self.procs.append(p)
        return p

    def hostfile(self, path: Path, slots: int = 2) -> Path:
        path.write_text("".join(f"{node.name} slots={slots}\n" for node in self.nodes))
        return path

    def write_map(self, path: Path, login: dict[str, str], **extra) -> Path:
        """The map the stand-ins read (tests/standins/cluster.py): the nodes, a login's environment, and `extra`
        (cpus, gpus, pmi, mpi, broken, kill_wait_s)."""
        hide = str(Path(sys.prefix).resolve())  # the Python environment, hidden on a broken node
        path.write_text(json.dumps({"nodes": [{"name": n.name, "ns": n.ns, "addr": n.addr} for n in self.nodes],
                                    "login_env": login, "hide": hide, "gpus": 2} | extra))
        return path


def nodes_or_skip(count: int):
    """A pytest fixture body: `count` namespace nodes up for the test, down after; the test skips (saying why) where
    namespaces cannot be made."""
    import pytest

    n = Nodes(count)
    try:
        n.up()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        yield n
    finally:
        n.down()


def python_without_openmpi(where: Path) -> str:
    """A Python environment as on an MPICH site: this one's packages, but no Open MPI `mpirun` beside the
    interpreter (this virtual environment has the `openmpi` package, which mm-ds would find first). Returns its
    interpreter."""
    real = Path(sys.prefix).resolve()
    (where / "bin").mkdir(parents=True, exist_ok=True)
    (where / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    (where / "lib").symlink_to(real / "lib")
    (where / "pyvenv.cfg").write_text((real / "pyvenv.cfg").read_text())
    return str(where / "bin" / "python")


def cluster_env(cluster_map: Path, hydra: bool = False, **extra: str) -> dict[str, str]:
    """A shell's environment on the node where a launcher is started: what a pdsh launch forwards (the test's
    PYTHON*/NCCL*), the stand-ins first on PATH (hydra's mpirun before OpenMPI's when `hydra`), the map they
    read; plus `extra`."""
    path = ":".join([str(STANDINS), *([str(STANDINS / "hydra")] if hydra else []), LOGIN_PATH])
    return remote_env(PATH=path, **{cluster.MAP: str(cluster_map)}, **extra)


@dataclass
class Launched:
    codes: list[int | None]
    """Each command's exit code; None: still running at the bound (it was killed)."""
    output: str
    wall_s: float

    @property
    def hung(self) -> bool:
        return any(c is None for c in self.codes)


def launch(nodes: Nodes, commands: dict[int, tuple[list[str], dict]], logs: Path, timeout_s: float, cwd: Path) -> Launched:
    """Start each node's command (node index -> (argv, env)), wait for all (bounded), return what happened; a
    launch still running at the bound has everything in the namespaces killed."""
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    procs = {k: nodes.start(nodes[k], argv, env, logs / f"node{k}.log", cwd) for k, (argv, env) in commands.items()}
    codes = wait_all(list(procs.values()), timeout_s)
    wall = time.monotonic() - started
    if any(c is None for c in codes):
        nodes.kill_all()
    outs = {k: (logs / f"node{k}.log").read_text(errors="replace") for k in procs}
    text = "\n".join(f"----- node {k} (exit {c}):\n{outs[k]}" for k, c in zip(procs, codes))
    return Launched(codes, text, wall)


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int | None]:
    """Exit codes of `procs` once all have ended, or None for those still running after `timeout_s` (a hang)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.5)
    return [p.poll() for p in procs]

"""Emulated nodes for multi-node tests: one network namespace per node, on one machine (root only).

Each node gets its own network namespace, its own host name (a UTS namespace per process started there) and
its own /etc/hosts (`ip netns exec` mounts /etc/netns/NS/hosts over /etc/hosts). The nodes are joined by a veth
pair on a private /24 that exists only inside the namespaces, so a process on one node reaches another only by
that node's address: dialing 127.0.0.1 for another node fails as it would on a cluster. Every node's /etc/hosts
maps its own name to 127.0.1.1, as Debian and Ubuntu install it, and the other nodes' names to their addresses.

Processes start with `env -i` plus what a launcher gives a remote node (`remote_env`), never the test's
environment. `rsh_agent` writes an ssh stand-in for mpirun (OpenMPI's `plm_rsh_agent`): it enters the named
host's namespace with a login-like environment, as ssh would. `down` kills every process in the namespaces and
removes them and their /etc/netns entries; the `nodes` fixture calls it also when a test fails.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
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
            a, b = self.nodes[:2]  # a veth pair joins two nodes (enough for these tests)
            va, vb = f"mv{self.tag}a", f"mv{self.tag}b"
            self._ip("link", "add", va, "type", "veth", "peer", "name", vb)
            for node, dev in ((a, va), (b, vb)):
                self._ip("link", "set", dev, "netns", node.ns)
                self._ip("-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", dev)
                self._ip("-n", node.ns, "link", "set", dev, "up")
        except (OSError, subprocess.CalledProcessError) as e:
            self.down()
            detail = getattr(e, "stderr", "") or e
            raise Unavailable(f"cannot make network namespaces here: {str(detail).strip()}") from None
        return self

    def down(self) -> None:
        for p in self.procs:  # what we started, and their process groups
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for ns in self._made:  # anything still inside (daemonised mpirun helpers, orphaned ranks)
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
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._made, self.procs = [], []

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)

    # ------------------------------------------------------------ running things on a node

    def command(self, node: Node, argv: list[str], env: dict[str, str]) -> list[str]:
        """`argv` on `node`: in its namespace, under its host name, with exactly `env`."""
        return ["ip", "netns", "exec", node.ns, "unshare", "--uts", "--", "/bin/sh", "-c",
                'hostname "$0" && exec env -i "$@"', node.name, *[f"{k}={v}" for k, v in env.items()], *argv]

    def start(self, node: Node, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
        f = open(log, "w")
        p = subprocess.Popen(self.command(node, argv, env), stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                             start_new_session=True)
        f.close()
        self.procs.append(p)
        return p

    def hostfile(self, path: Path, slots: int = 1) -> Path:
        path.write_text("".join(f"{node.name} slots={slots}\n" for node in self.nodes))
        return path

    def rsh_agent(self, path: Path, env: dict[str, str]) -> Path:
        """An ssh stand-in for mpirun: `AGENT HOST COMMAND...` runs COMMAND as a remote shell would, in HOST's
        namespace under its host name, with `env` only (what a login on that node starts with)."""
        cases = "".join(f"  {node.name}) ns={node.ns} ;;\n" for node in self.nodes)
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        path.write_text(f"""#!/bin/sh
# ssh stand-in (tests/netns.py): HOST COMMAND... -> COMMAND in HOST's network namespace, stripped environment
while [ "${{1#-}}" != "$1" ]; do shift; done  # ssh options, if any
host=$1; shift
case "$host" in
{cases}  *) echo "rsh agent: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec env -i "$@"' "$host" \\
    {assigns} /bin/sh -c "$*"
""")
        path.chmod(0o755)
        return path


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int | None]:
    """Exit codes of `procs` once all have ended, or None for those still running after `timeout_s` (a hang)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.5)
    return [p.poll() for p in procs]

"""What each launcher needs and is given: DeepSpeed's multi-node runners as a table, the executables, the files a
launch writes for them, and the environment they carry to the other nodes.

`deepspeed --hostfile H --launcher NAME` (deepspeed/launcher/runner.py main, 0.19.8) reads the hostfile, applies
--include/--exclude and then --num_nodes/--num_gpus, and hands the hosts to its runner (multinode_runner.py):
- pdsh starts DeepSpeed's per-node launcher on each host over ssh, and takes --num_nodes/--num_gpus.
- openmpi, mpich, impi and mvapich start every rank with `mpirun` over the *whole* hostfile (their resource pool,
  not the hosts the counts chose), and their validate_args refuse --num_nodes/--num_gpus: they get a hostfile of
  exactly the chosen nodes with `slots=<ranks per node>`, written by `exact_hostfile`.
- slurm runs `srun -n WORLD`: it takes --num_nodes (srun --nodes) and --num_gpus (--gpus-per-node), and is given
  --ntasks-per-node (else srun may place more tasks on a node than it has GPUs, and `local_rank % devices` puts two
  ranks on one GPU) and each task's CPUs.
Every runner asks the first host for `hostname -I` over ssh when it has no --master_addr, and takes the first field
(often a docker bridge): mm-ds gives it the hostfile's first host by name (mm_ds/runtime/distributed/launch.py master_addr).

What reaches the other nodes' ranks: variables with DeepSpeed's prefixes (NCCL, PYTHON, UCX, MV2, MLFLOW), and the
lines of its environment file (`DS_ENV_FILE`, else `.deepspeed_env` in ~ and the working directory). mm-ds writes one
per launch (`env_file`) and points DS_ENV_FILE at it (an absolute name: `os.path.join(dir, name)` returns it): the
forwarded variables (mm_ds/runtime/distributed/environment.py FORWARDED), the user's environment file's lines, and
MASTER_ADDR/PORT (the MPI runners pass the ranks no address). The slurm runner's srun hands its tasks the runner's
whole environment: nothing to write.

The files live in a per-user folder of the temporary directory, named by their content, so a launch that starts
again finds the same file, and two launches never write one another's. Only the runner reads them, on this machine.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...config import ConfigError, LaunchConfig, did_you_mean
from .environment import forwarded
from .hostfile import Host


@dataclass(frozen=True)
class Runner:
    """One of DeepSpeed's multi-node runners, as mm-ds must drive it."""

    counts: bool
    """It takes --num_nodes/--num_gpus; else a hostfile of exactly the chosen nodes (`exact_hostfile`)."""
    needs: tuple[str, ...]
    """Executables on the machine the launch starts from: what the runner starts (its `backend_exists` included),
    and ssh for DeepSpeed's check that the first host answers."""
    open_mpi: bool | None = None
    """Whether the `mpirun` found must be Open MPI's (True) or must not be (False: the runner passes it MPICH's
    -ppn, -genv, -hosts); None: it starts no mpirun."""
    env_file: bool = True
    """It forwards what DeepSpeed's environment file lists (slurm: srun passes the whole environment instead)."""
    passes: str = "argv"
    """How its exports reach the ranks: `argv` (mpirun's -x, -genv, -env: as they are), `shell` (pdsh's `export K=V;`:
    DeepSpeed's double quotes work there), `srun` (`--export=ALL,K=V,...`: a comma ends a value)."""


RUNNERS = {
    "pdsh": Runner(counts=True, needs=("pdsh", "ssh"), passes="shell"),
    "openmpi": Runner(counts=False, needs=("mpirun", "ompi_info", "ssh"), open_mpi=True),
    "mpich": Runner(counts=False, needs=("mpirun", "ssh"), open_mpi=False),
    "impi": Runner(counts=False, needs=("mpirun", "ssh"), open_mpi=False),
    "mvapich": Runner(counts=False, needs=("mpirun", "mpiname", "ssh"), open_mpi=False),
    "slurm": Runner(counts=True, needs=("srun", "sinfo"), env_file=False, passes="srun"),
}
"""DeepSpeed 0.19.8's runners (deepspeed.launcher.runner.LAUNCHER_CLASSES; tests/test_ds_runners.py keeps them one)."""


def runner(launch: LaunchConfig) -> Runner:
    """The row of `launch.ds_launcher`; a ConfigError naming the key for a name DeepSpeed does not know."""
    if launch.ds_launcher not in RUNNERS:
        raise ConfigError(f"launch.ds_launcher={launch.ds_launcher!r} is not one of DeepSpeed's runners"
                          f"{did_you_mean(launch.ds_launcher, RUNNERS)}; choose {', '.join(RUNNERS)}")
    return RUNNERS[launch.ds_launcher]


# ---------------------------------------------------------------- executables

def find_bin(name: str) -> str | None:
    """`name` next to this Python (the virtual environment's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.path.exists(here) else shutil.which(name)


def bin_path(name: str) -> str:
    found = find_bin(name)
    if not found:
        raise ConfigError(f"launcher executable {name!r} not found next to {sys.executable} or on PATH; "
                          f"install it or set launch.launcher=none with launch.ranks=1")
    return found


def check_tools(launch: LaunchConfig) -> None:
    """The executables a DeepSpeed runner starts on this machine are here, and its mpirun is of the MPI it speaks."""
    row = runner(launch)
    missing = [name for name in row.needs if not find_bin(name)]
    if missing:
        raise ConfigError(f"launch.ds_launcher={launch.ds_launcher} needs {', '.join(missing)} on this machine, where "
                          f"deepspeed starts the nodes: not found next to {sys.executable} or on PATH; install "
                          f"{'them' if len(missing) > 1 else 'it'}, or choose another launch.ds_launcher (or "
                          f"launch.launcher=mpirun or srun)")
    if row.open_mpi is not None:
        mpirun = find_bin("mpirun")
        is_open = "Open MPI" in version(mpirun, "--version")
        if is_open != row.open_mpi:
            want = "Open MPI's" if row.open_mpi else "MPICH's (or Intel MPI's, MVAPICH's)"
            raise ConfigError(f"launch.ds_launcher={launch.ds_launcher}: the mpirun found ({mpirun}) is "
                              f"{'Open MPI' if is_open else 'not Open MPI'}, but this runner passes it {want} "
                              f"flags; use launch.ds_launcher={'mpich' if is_open else 'openmpi'}, or put the right "
                              f"mpirun first on PATH")
    if launch.ds_launcher == "mvapich" and "MVAPICH2-GDR" not in version(find_bin("mpiname"), "-a"):
        raise ConfigError("launch.ds_launcher=mvapich: DeepSpeed's mvapich runner starts only under MVAPICH2-GDR "
                          "(`mpiname` does not report it here); use launch.ds_launcher=mpich or openmpi")


def version(exe: str, flag: str) -> str:
    try:
        return subprocess.run([exe, flag], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def mpirun_prefix(mpirun: str) -> str:
    """Open MPI's install root for `mpirun --prefix`: the folder above the one holding the real mpirun. With it the
    daemons on the other nodes start from the same Open MPI and find its libraries, whatever a remote shell's
    PATH and LD_LIBRARY_PATH are."""
    return str(Path(os.path.realpath(mpirun)).parent.parent)


def srun_cpus(ranks_per_node: int) -> list[str]:
    """`--cpus-per-task`: the batch job's own, else this node's CPUs of the allocation shared by its tasks (srun
    gives a task one CPU otherwise, where the allocation was sized in tasks)."""
    per_task, on_node = os.environ.get("SLURM_CPUS_PER_TASK", ""), os.environ.get("SLURM_CPUS_ON_NODE", "")
    if per_task.isdigit():
        return [f"--cpus-per-task={per_task}"]
    return [f"--cpus-per-task={max(1, int(on_node) // ranks_per_node)}"] if on_node.isdigit() else []


# ---------------------------------------------------------------- what DeepSpeed's runner is given

def runner_args(launch: LaunchConfig, hosts: list[Host]) -> list[str]:
    """deepspeed's arguments when its runner starts every node from here (no --node_rank): the hosts, the runner,
    `--launcher_args` for the mpirun or srun it runs (one word: DeepSpeed's parser would take a separate
    `--cpus-per-task=N` for an unknown option of its own), and for slurm `--no_ssh_check` (srun reaches the
    nodes; ssh to them need not work)."""
    row = runner(launch)
    if row.counts:
        where = ["--hostfile", launch.hostfile, "--num_nodes", str(launch.nodes), "--num_gpus", str(launch.ranks)]
    else:
        where = ["--hostfile", exact_hostfile(hosts, launch.ranks)]
    flags = {"openmpi": lambda: openmpi_args(hosts),
             "slurm": lambda: [f"--ntasks-per-node={launch.ranks}", *srun_cpus(launch.ranks)]}.get(launch.ds_launcher)
    extra = [f"--launcher_args={' '.join(flags())}"] if flags else []
    return [*where, "--launcher", launch.ds_launcher, *extra, *(["--no_ssh_check"] if "ssh" not in row.needs else [])]


def openmpi_args(hosts: list[Host]) -> list[str]:
    """What DeepSpeed's openmpi runner passes its mpirun: no binding (it would bind each of two or fewer ranks to
    one core; each rank sizes its threads to its share instead), Open MPI's root for the other nodes' daemons, and
    the network of its TCP transport. That runner adds `--mca btl_tcp_if_include eth0` unless told an include list
    (an exclude list does not stop it, and Open MPI refuses both at once), and many hosts have no eth0: each node's
    interface is named by the address its hostfile name has, as a /32, which also leaves out lo and docker0."""
    return ["--bind-to", "none", "--prefix", mpirun_prefix(bin_path("mpirun")),
            "--mca", "btl_tcp_if_include", ",".join(f"{a}/32" for a in node_addresses(hosts))]


def node_addresses(hosts: list[Host]) -> list[str]:
    """Each host's IPv4 address as this machine resolves its name. A name that is this machine's loopback here
    (Debian's `127.0.1.1 <own name>`) is the address this machine reaches the other hosts from."""
    found = {h.name: ipv4(host_name(h.name)) for h in hosts}
    missing = [n for n, ip in found.items() if ip is None]
    if missing:
        raise ConfigError(f"launch.ds_launcher=openmpi: Open MPI's TCP transport is told each node's network by the "
                          f"address its hostfile name has, but {', '.join(missing)} does not resolve to an IPv4 address "
                          f"here; list addresses in the hostfile, or use launch.launcher=mpirun")
    outside = [ip for ip in found.values() if not ipaddress.ip_address(ip).is_loopback]
    return [source_address(outside[0]) if ipaddress.ip_address(ip).is_loopback and outside else ip
            for ip in found.values()]


def host_name(entry: str) -> str:
    """The machine of a hostfile entry: pdsh and ssh take `user@host`."""
    return entry.rpartition("@")[2]


def ipv4(name: str) -> str | None:
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError):
        return None


def source_address(ip: str) -> str:
    """The address this machine sends from to reach `ip` (a routing decision; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
            return s.getsockname()[0]
        except OSError:
            return ip


# ---------------------------------------------------------------- files a launch writes

def exact_hostfile(hosts: list[Host], ranks: int) -> str:
    """A hostfile of exactly `hosts`, `ranks` slots each (for the runners that take no counts)."""
    return launch_file("hosts", "".join(f"{h.name} slots={ranks}\n" for h in hosts))


DS_EXPORTS = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")
"""The prefixes DeepSpeed's runners export from the runner's own environment (EXPORT_ENVS, and CUDA's NCCL)."""
PASSES = {"argv": re.compile(r"[\w@%+=:,./-]*"), "srun": re.compile(r"[\w@%+=:./-]*"),
          "shell": re.compile(r'([^"$`\\\s]([^"$`\\\n]*[^"$`\\\s])?)?')}
"""The values each way of passing exports carries as they are. MultiNodeRunner.add_export puts a value with other
characters than word characters and `@%+=:,./-` in double quotes (and strips its ends): a shell (pdsh) removes them,
unless the value holds what expands inside them; mpirun's -x and srun's --export take them literally."""


def unpassable(launch: LaunchConfig) -> list[str]:
    """The variables meant for the other nodes (forwarded, or exported by DeepSpeed itself) whose values this
    launch's runner cannot pass on as they are."""
    row = runner(launch)
    return [n for n, v in sorted(os.environ.items()) if (n.startswith(DS_EXPORTS) or row.env_file and forwarded(n))
            and not PASSES[row.passes].fullmatch(v)]


def env_file(master: dict[str, str], left_out: list[str]) -> str:
    """The environment file for DeepSpeed's runner: the forwarded variables of this shell but `left_out`, then the
    lines of the user's own environment file (they win, as in DeepSpeed), then `master` (MASTER_ADDR/PORT)."""
    lines = [f"{n}={v}" for n, v in sorted(os.environ.items()) if forwarded(n) and n not in left_out]
    name = os.environ.get("DS_ENV_FILE", ".deepspeed_env")  # what DeepSpeed would read, where it would read it
    for path in dict.fromkeys(os.path.realpath(os.path.join(d, name)) for d in (os.path.expanduser("~"), ".")):
        if os.path.isfile(path):
            lines += Path(path).read_text().splitlines()
    lines += [f"{k}={v}" for k, v in master.items()]
    return launch_file("env", "".join(f"{line}\n" for line in lines))


def launch_file(kind: str, text: str) -> str:
    """`text` in this user's folder of launch files, named by its content; written unless already there."""
    folder = Path(tempfile.gettempdir()) / f"mm-ds-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not path.is_file() or path.read_text() != text:
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as f:
            f.write(text)
        os.replace(f.name, path)
    return str(path)

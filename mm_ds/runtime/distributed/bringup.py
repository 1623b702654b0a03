"""Bring-up, decided from strings: which rank this process is, where the ranks meet, and what to say when they
do not all come. mm_ds/runtime/distributed/rendezvous.py connects (the store, the process group); this module holds
its rules, but for where an srun step's ranks meet (mm_ds/runtime/distributed/srun.py).

Every launcher names a rank's place with its own variables, and a rank may carry several launchers' sets at
once: an srun task under `MpiDefault=pmi2` (or Cray PMI) has PMI_RANK/PMI_SIZE beside SLURM_PROCID; a rank that
mpirun starts inside an allocation inherits the SLURM variables of the srun step that started mpirun's daemons.
`LAUNCHERS` lists the sets in the order that settles this: a launcher's own set before the ones it inherits.
Rank, world and local rank come from the variables themselves; MPI is asked only for the rendezvous address,
and only where the launcher gives none.

Each rank decides from the same strings (the launcher's variables, `scontrol`'s output), never from how a name
resolves on its node: Debian maps a node's own name to 127.0.1.1, so resolution differs between nodes.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from dataclasses import dataclass

import torch

from ...config import ConfigError
from . import hostfile
from .srun import is_ip, is_loopback, slurm_hosts, srun_master


@dataclass(frozen=True)
class Launcher:
    """The variables one launcher sets in every rank it starts."""
    name: str
    rank: str
    world: str
    local_rank: str
    local_world: tuple[str, ...]
    """Ranks on this node: the first of these that is set. A per-node list ("2(x3),1", SLURM's) is read at `node`."""
    master: str
    """Rank 0's address when MASTER_ADDR is not set: "given" (the launcher always sets it), "first node" (the
    step's first node, where rank 0 runs), "mpi" (rank 0's host name, told to the others through MPI)."""
    node: str = ""
    """The variable holding this node's index in a per-node list."""
    yields_to: tuple[str, str] = ()
    """(rank, world) variables that, when set and different, show that another launcher started this rank inside
    this one: hydra's mpiexec inside an allocation starts its proxies as an srun step, whose SLURM variables its
    ranks inherit (one task a node), while PMI_RANK/PMI_SIZE are theirs."""


LAUNCHERS = (
    Launcher("deepspeed/torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"), "given"),
    Launcher("OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             ("OMPI_COMM_WORLD_LOCAL_SIZE",), "mpi"),
    Launcher("MVAPICH", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
             ("MV2_COMM_WORLD_LOCAL_SIZE",), "mpi"),
    Launcher("srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
             ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"), "first node", node="SLURM_NODEID",
             yields_to=("PMI_RANK", "PMI_SIZE")),
    Launcher("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", ("MPI_LOCALNRANKS",), "mpi"),
)
"""A launcher's own set first: those that only the innermost launcher sets (RANK is always set explicitly;
OMPI_COMM_WORLD_* and MV2_COMM_WORLD_* only by mpirun), then SLURM's (which a rank may inherit), then PMI's
(which srun's pmi2 and Cray PMI also set, with the same values)."""
SRUN = LAUNCHERS[3]

LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
    "SLURM_NODEID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "MASTER_ADDR", "MASTER_PORT", "MM_DS_MASTER_ADDR",
)
"""Every variable bring-up reads (`given_env`): each launcher's set above, the step's nodes, the address."""
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMI_RANK")
"""Rank variables that only a launcher sets in the processes it starts: one of them makes a process a rank. SLURM's
needs its step (`SRUN_STEP_VARS`): the batch script has SLURM_PROCID too."""
SRUN_STEP_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
"""Set in every task of an `srun` job step (not in the sbatch script itself, which has no SLURM_STEP_NUM_TASKS)."""
def given_env() -> dict[str, str]:
    """This process's launcher variables (`LAUNCHER_VARS`): what every decision below is made from."""
    return dict((k, os.environ[k]) for k in LAUNCHER_VARS if k in os.environ)


def launcher_of(given: dict[str, str]) -> Launcher | None:
    """The launcher whose variables describe this process (`LAUNCHERS`' order), None outside any."""
    for row in LAUNCHERS:
        if row.rank in given and row.world in given:
            inner = [given.get(v) for v in row.yields_to]
            if inner and all(inner) and inner != [given[row.rank], given[row.world]]:
                continue
            return row
    return None


def under_launcher() -> bool:
    """This process is a rank that a launcher started (else mm-ds starts the ranks itself). `place` then finds
    its launcher's set, or says which variable of it is missing."""
    given = given_env()
    return any(v in given for v in RANK_VARS) or all(v in given for v in SRUN_STEP_VARS)


@dataclass(frozen=True)
class Place:
    """Where this rank stands in the launch, and where rank 0 listens."""
    launcher: str
    rank: int
    world: int
    local_rank: int
    local_world: int | None
    """Ranks on this node; None where the launcher does not say."""
    master_addr: str | None
    """None: rank 0's host name is to be told through MPI (`dist`)."""
    master_port: int
    note: str = ""
    """What rank 0 says about the address (an inherited MASTER_ADDR it did not use)."""


def place(given: dict[str, str]) -> Place | None:
    """This rank's place from its launcher's variables (None outside any launcher). Raises ConfigError where
    the variables cannot describe a working launch; every rank raises the same, from the same strings."""
    row = launcher_of(given)
    if row is None:
        partial = [r for r in LAUNCHERS if r.rank in RANK_VARS and r.rank in given]
        if partial:
            raise ConfigError(f"{partial[0].rank} is set but {partial[0].world} is not: a {partial[0].name} rank "
                              f"needs both (is another launcher's variable left in the environment?)")
        return None
    node = given.get(row.node, "") if row.node else ""
    rank, world = _number(given, row.rank), _number(given, row.world)
    local_rank = _number(given, row.local_rank) if row.local_rank in given else None
    local_world = next((n for v in row.local_world if v in given and (n := per_node(given[v], node))), None)
    if not 0 <= rank < world:
        raise ConfigError(f"{row.name}: {row.rank}={rank} is not below {row.world}={world}")
    if local_rank is None:
        local_rank = rank % local_world if local_world else 0
    port = _number(given, "MASTER_PORT") if "MASTER_PORT" in given else 29500  # DeepSpeed's default, as mpirun's
    addr, note = given.get("MASTER_ADDR"), ""
    if row.master == "first node":
        addr, note = srun_master(given)
    elif row.master == "given" and not addr:
        raise ConfigError(f"{row.name}: {row.rank} is set but MASTER_ADDR is not; the launcher must give rank 0's "
                          f"address (launch.master_addr)")
    return Place(row.name, rank, world, local_rank, local_world, addr or None, port, note)


def _number(given: dict[str, str], var: str) -> int:
    try:
        return int(given[var])
    except ValueError:
        raise ConfigError(f"{var}={given[var]!r} is not a number (set by the launcher?)") from None


def per_node(spec: str, node: str = "") -> int | None:
    """Tasks on this node from SLURM's per-node form ("8", "8(x4)", "3,1", "2(x2),1"), at index `node` (this
    node's SLURM_NODEID); None when it cannot be read."""
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(set(counts)) == 1:
        return counts[0]
    return counts[int(node)] if node.isdigit() and int(node) < len(counts) else None


def told_through_mpi(here: Place) -> str:
    """Rank 0's host name, through MPI: the launcher gave no MASTER_ADDR (mpirun without `-x MASTER_ADDR`). Only
    the address: rank, world and local rank are the launcher's own variables."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise ConfigError(f"{here.launcher} gave no MASTER_ADDR and mpi4py is not installed to ask rank 0's host: "
                          f"give rank 0's address (launch.master_addr, MASTER_ADDR)") from None
    comm = MPI.COMM_WORLD
    if (comm.Get_rank(), comm.Get_size()) != (here.rank, here.world):
        raise ConfigError(f"{here.launcher} started this process as rank {here.rank} of {here.world}, but MPI "
                          f"(mpi4py) sees rank {comm.Get_rank()} of {comm.Get_size()}: mpi4py is built for another "
                          f"MPI than the launcher's. Give rank 0's address instead (launch.master_addr, MASTER_ADDR)")
    return comm.bcast(socket.gethostname() if here.rank == 0 else None, root=0)


# ---------------------------------------------------------------- where rank 0 listens

def listen_on(addr: str, resolved: list[tuple], spans_nodes: bool) -> tuple[int, str, str]:
    """(family, address to bind, why it is not MASTER_ADDR's first address or "") for rank 0's store. `resolved`:
    getaddrinfo(MASTER_ADDR). An IP literal binds that address, and so does a world on one node. When the world
    spans nodes and MASTER_ADDR is a name, the other nodes may reach it at another address than its first here:
    a multi-homed host lists several, and Debian maps a node's own name to 127.0.1.1. Rank 0 then listens on
    every interface (as torch's own store would)."""
    family, where = resolved[0][0], resolved[0][4][0]
    ips = sorted({r[4][0] for r in resolved})
    if not spans_nodes or is_ip(addr) or is_loopback(addr):
        return family, where, ""
    if len(ips) == 1 and not ipaddress.ip_address(where.split("%")[0]).is_loopback:
        return family, where, ""
    why = (f"is {where} on rank 0's node (its /etc/hosts), which other nodes cannot reach" if len(ips) == 1 else
           f"resolves to {', '.join(ips)} on rank 0's node; other nodes may reach it at any of them")
    six = any(r[0] == socket.AF_INET6 for r in resolved)
    return (socket.AF_INET6, "::", why) if six else (socket.AF_INET, "0.0.0.0", why)


# ---------------------------------------------------------------- whether every rank came

def launch_hosts(launch) -> list[str] | None:
    """The launch's nodes in order, to name those whose ranks never came: the srun step's, else the hostfile's."""
    given = given_env()
    if launcher_of(given) is SRUN and "SLURM_STEP_NODELIST" in given:
        return slurm_hosts(given["SLURM_STEP_NODELIST"])
    try:
        return [h.name for h in hostfile.read(launch.hostfile)[:launch.nodes]] if launch.hostfile else None
    except (OSError, ConfigError):
        return None


def verdict(records: list[dict | None], waited_s: float, hosts: list[str] | None) -> str:
    """What stops the launch, "" when nothing does. `records`: each rank's join record (None: it never joined);
    `hosts`: the launch's nodes in order, where known (the step's, or the hostfile's), to name the missing."""
    missing = [r for r, rec in enumerate(records) if rec is None]
    if missing:
        return missing_message(records, missing, waited_s, hosts)
    return device_problem(records)


def missing_message(records, missing: list[int], waited_s: float, hosts: list[str] | None) -> str:
    joined = [(r, rec) for r, rec in enumerate(records) if rec is not None]
    per_node = {rec.get("local_world") for _, rec in joined} - {None}
    nodes = {}
    if len(per_node) == 1:  # every launcher here places ranks node by node: node = rank // ranks a node
        per = per_node.pop()
        for r in missing:
            nodes.setdefault(r // per, []).append(r)
        named = [f"node {k}{f' ({hosts[k]})' if hosts and k < len(hosts) else ''}: {spans(rs)}"
                 for k, rs in sorted(nodes.items())]
        where = f"{'; '.join(named)} (placing {per} rank{'s' if per > 1 else ''} a node)"
    else:
        where = spans(missing)
    came = {}
    for r, rec in joined:
        came.setdefault(rec["host"], []).append(r)
    seen = ", ".join(f"{spans(rs)} on {h}" for h, rs in came.items())
    return (f"{len(missing)} of {len(records)} ranks never joined the rendezvous in {waited_s:.0f} s: {where}. "
            f"Their node's launcher output says why (the Python environment or mm-ds missing there, an import "
            f"error, a node the launcher never reached). Joined: {seen}. launch.rendezvous_timeout_s sets the wait")


def device_problem(records: list[dict]) -> str:
    """Two ranks of one node on one GPU (NCCL stops "duplicate GPU"): the same device UUID, or, where no UUID is
    known, more ranks on a node than the devices each sees when each sees several (`local_rank % count` then
    repeats). One device a task (srun --gpus-per-task=1) is fine."""
    by_host = {}
    for r, rec in enumerate(records):
        if rec.get("device"):
            by_host.setdefault(rec["host"], []).append((r, rec["device"]))
    for host, ranks in by_host.items():
        taken = {}
        for r, d in ranks:
            if d.get("uuid"):
                taken.setdefault(d["uuid"], []).append(r)
        shared = [rs for rs in taken.values() if len(rs) > 1]
        count = min(d["count"] for _, d in ranks)
        crowded = not taken and count > 1 and len(ranks) > count
        if shared or crowded:
            what = (f"{' and '.join(spans(rs) for rs in shared)} take the same GPU" if shared else
                    f"{len(ranks)} ranks share the {count} GPUs each of them sees")
            return (f"node {host}: {what} (NCCL would stop with \"duplicate GPU\"). Start as many ranks on a node "
                    f"as it has GPUs (launch.ranks; srun --ntasks-per-node=N with --gpus-per-node=N), or give each "
                    f"task one GPU (srun --gpus-per-task=1)")
    return ""


def spans(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    out, start = [], None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(f"{start}-{r}" if r != start else str(r))
            start = None
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(out)}"


# ---------------------------------------------------------------- a rank's own process

def set_threads(local_world: int) -> int:
    """Size torch's thread pools to this rank's share of the node: the CPUs it may run on (its affinity: what the
    launcher gave it, `srun --cpus-per-task`'s count when given) over the ranks sharing them. One rank's BLAS
    and OpenMP threads must not fight another's (8 GPU ranks each starting all-core pools did). A user's
    OMP_NUM_THREADS wins (torch already read it). SLURM_CPUS_PER_TASK is the rank's own in an srun task only:
    ranks that deepspeed or mpirun start inside a batch job inherit the job's, the CPUs of them all."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    srun_task = all(v in os.environ for v in SRUN_STEP_VARS)
    per_task = os.environ.get("SLURM_CPUS_PER_TASK", "") if srun_task else ""
    share = min(cpus, int(per_task)) if per_task.isdigit() else cpus // max(1, local_world)
    torch.set_num_threads(max(1, share))
    return torch.get_num_threads()


def local_world_size() -> int | None:
    """Ranks on this node, as the launcher says (torchrun/srun: LOCAL_WORLD_SIZE, deepspeed: LOCAL_SIZE,
    mpirun: OMPI_COMM_WORLD_LOCAL_SIZE, MPICH: MPI_LOCALNRANKS); None when it does not."""
    for var in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def skip_shm_comm_build() -> None:
    """On CPU, DeepSpeed's communication backend JIT-compiles its shared-memory op (C++, ~25 s on 2 cores,
    again for every new virtual environment) at start-up. Only `inference_all_reduce` (tensor-parallel
    inference) uses it; training collectives go through torch.distributed (gloo). Marking the op
    incompatible skips the build; DeepSpeed keeps `__compatible_ops__` as one dict so that edits persist."""
    import deepspeed.ops

    ops = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(ops, dict):
        ops["deepspeed_shm_comm"] = False


def keep_freed_memory() -> None:
    """CPU training allocates and frees the same large tensors every step (gradients, ZeRO's flat
    partitions, attention scores). glibc hands blocks over 32 MiB back to the kernel on free, so each step
    faults them in again, page by page; on a VM that was ~10% of a base-shape step. Keep freed memory in the
    heap instead (RSS then stays at the step's high-water mark). MM_DS_MALLOC=system opts out; a no-op
    without glibc."""
    if os.environ.get("MM_DS_MALLOC") == "system":
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    mallopt(M_MMAP_MAX, 0)  # no mmap for large blocks: they come from (and return to) the heap
    mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1)  # never shrink the heap (2 GiB of free top before trimming)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""Distributed bring-up, and the only place in mm-ds that calls a collective.

On CUDA the process group is NCCL, which takes device tensors only; gloo (CPU) also takes host tensors. A
collective on a tensor made on the host therefore passes every CPU test and stops a GPU run at its first
update. So every collective goes through this module, which puts its tensors on the accelerator's current
device (`device()`), and tests/test_dist.py scans the package so that no other module touches
`torch.distributed` or `deepspeed.comm`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import torch

from ..config import ConfigError
from . import stop
from .launch import SRUN_STEP_VARS, is_loopback

# ---------------------------------------------------------------- rank and device


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if is_initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if is_initialized() else 1


def backend() -> str:
    return torch.distributed.get_backend() if is_initialized() else "none"


def device() -> torch.device:
    """The accelerator device of this rank: what NCCL needs every collective's tensors on."""
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


# ---------------------------------------------------------------- collectives (device tensors only)

_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise reduction of a list of numbers over all ranks (float64). A world of one returns them."""
    if not is_initialized():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device())
    torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, _OPS[op]))
    return t.cpu().tolist()


def all_reduce_tensor(t: torch.Tensor, op: str = "sum") -> list[float]:
    """Element-wise reduction of a 1-D tensor over all ranks, read back as numbers: one collective and one
    host read (the loop's log window, which keeps its values on the device until then)."""
    t = t.to(device=device(), dtype=torch.float64)
    if is_initialized():
        torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, _OPS[op]))
    return t.cpu().tolist()


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is true on at least one."""
    return bool(all_reduce([1.0 if flag else 0.0], "max")[0])


def all_reduce_start(t: torch.Tensor, op: str = "max"):
    """Start an element-wise reduction of `t`, a tensor on this rank's device, in place over all ranks without
    waiting; returns the work to `.wait()` for (None in a world of one). NCCL's wait makes the current stream wait,
    not the host: mm_ds/runtime/boundary.py's lagged agreement reads the result an update later."""
    if t.device != device():
        raise ValueError(f"all_reduce_start takes a tensor on {device()} (NCCL takes device tensors), got {t.device}")
    if not is_initialized():
        return None
    return torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, _OPS[op]), async_op=True)


def broadcast_object(obj, src: int = 0):
    """`obj` as rank `src` has it, on every rank (pickled; small objects only)."""
    if not is_initialized():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src, device=device())
    return box[0]


_STORE = None  # rank 0's rendezvous store (`_bind_rendezvous`)


def shared_add(key: str, amount: int = 1) -> int:
    """Add `amount` to the counter `key` that every rank of the launch shares, and return its new value (`amount`
    0 reads it). It lives in rank 0's rendezvous store: no collective, so ranks call it whenever they like and
    none waits for another (mm_ds/pipeline/pack.py's queue of independent jobs). Needs the process group (`init`)."""
    store = _STORE or torch.distributed.distributed_c10d._get_default_store()  # when DeepSpeed made the group
    return int(store.add(key, amount))


class OtherRankFailed(RuntimeError):
    """Raised by `on_rank0` and `on_every_rank` on the ranks whose own work did not fail: the failed one reports
    why."""


def on_rank0(work, what: str):
    """Collective: `work()` on rank 0 while the others wait, then its result on every rank. When it raises,
    every rank raises: rank 0 its own error, the others OtherRankFailed naming `what`. A plain barrier after
    rank-0 work would leave them waiting for a rank that left (under NCCL until the 30-minute timeout), and
    a terminal that merges every rank's output names the error once."""
    outcome, error = None, None
    if rank() == 0:
        try:
            outcome = (True, work())
        except Exception as e:  # noqa: BLE001  re-raised below, once every rank knows
            outcome, error = (False, None), e
    ok, value = broadcast_object(outcome)
    if error is not None:
        raise error
    if not ok:
        raise OtherRankFailed(f"rank {rank()} stopped: rank 0 failed {what} (rank 0's output says why)")
    return value


def on_every_rank(work, what: str):
    """Collective: `work()` on every rank (a check each rank makes of what it sees), then whether it failed on
    any. A rank that raised re-raises; the others raise OtherRankFailed naming `what`, instead of waiting in the
    next collective for a rank that left (a file another node cannot see, a parent one node cannot read)."""
    value, error = None, None
    try:
        value = work()
    except Exception as e:  # noqa: BLE001  re-raised below, once every rank knows
        error = e
    if any_rank(error is not None):
        if error is not None:
            raise error
        raise OtherRankFailed(f"rank {rank()} stopped: another rank failed {what} (its output says why)")
    return value


def barrier() -> None:
    if is_initialized():
        if device().type == "cuda":  # NCCL's barrier guesses the device otherwise (and warns)
            torch.distributed.barrier(device_ids=[device().index or 0])
        else:
            torch.distributed.barrier()


# ---------------------------------------------------------------- bring-up and tear-down


def init() -> tuple[int, int, int]:
    """(rank, local_rank, world_size). Outside any launcher, runs as a world of one."""
    import deepspeed

    from .launch import under_launcher
    if under_launcher():  # a rank of a launch: a stop signal during start-up is kept for the loop (mm_ds/runtime/stop.py)
        stop.install()
    adopt_env()  # srun / mpirun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* from the launcher's own variables
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ and "PMI_RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
    if torch.cuda.is_available():
        set_device(local_rank)  # before the process group: NCCL binds to the current device
    if not is_initialized():
        if not torch.cuda.is_available():
            skip_shm_comm_build()
        _bind_rendezvous()
        deepspeed.init_distributed(verbose=False)
    r, world = rank(), world_size()
    from .watchdog import start as watch_launcher
    watch_launcher(r)  # a SIGKILLed launcher must not leave this rank running (mm_ds/runtime/watchdog.py)
    set_threads(local_world_size() or world)
    if not torch.cuda.is_available():
        keep_freed_memory()
    return r, local_rank, world


def set_device(local_rank: int) -> int:
    """Make this rank's GPU current: its local rank among the devices it can see. Under `srun --gpus-per-task=1`
    (or `--gpu-bind`) a task sees one device while SLURM_LOCALID counts the node's tasks; LOCAL_RANK is then
    made that index too, since DeepSpeed's engine takes LOCAL_RANK as its device (and checks it against
    OMPI_COMM_WORLD_LOCAL_RANK)."""
    index = local_rank % max(1, torch.cuda.device_count())
    if index != local_rank:
        os.environ["LOCAL_RANK"] = str(index)
        if "OMPI_COMM_WORLD_LOCAL_RANK" in os.environ:
            os.environ["OMPI_COMM_WORLD_LOCAL_RANK"] = str(index)
    torch.cuda.set_device(index)
    return index


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


def launched() -> bool:
    """A rank of a launched world (not a test calling the CLI in-process): the process is the rank's own."""
    return is_initialized() and "RANK" in os.environ


def finish(rc: int) -> int:
    """After a rank's command succeeded: wait for the others, then tear the process group down. Left to
    interpreter exit, rank 0's rendezvous store could vanish under another rank's live store threads,
    which then abort ("terminate called without an active exception") after the work is done."""
    if not launched():
        return rc
    finish_wandb()  # os._exit below skips W&B's exit hook: a live run would lose its last data
    barrier()
    torch.distributed.destroy_process_group()
    # gloo's worker threads can still touch Python objects during interpreter finalization and abort a rank
    # whose work is done (seen under mpirun too). Everything is written and synced by now: leave without
    # finalization, after MPI_Finalize where DeepSpeed's MPI discovery initialised MPI (mpirun reports a
    # rank that exits without it as failed).
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(rc)


def leave(rc: int) -> int:
    """After a rank's command failed: exit with `rc` at once. No barrier (the other ranks may have left, or wait
    in a collective that this rank will never join), and no interpreter finalization, where gloo's threads,
    whose peers are gone, abort the rank ("terminate called without an active exception", SIGABRT instead of
    the error's exit code; seen in 1 of 3 runs of tests/test_rank0_failures.py)."""
    if not launched():
        return rc
    finish_wandb()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def finish_wandb() -> None:
    """Finish the W&B run DeepSpeed's monitor started on this rank (rank 0), if any, so that its data is kept."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        try:
            wandb.run.finish()
        except Exception as e:  # noqa: BLE001  the run's own work is done and saved; say so and go on
            print(f"[mm-ds] rank {rank()}: finishing the W&B run failed: {e}", file=sys.stderr, flush=True)


def adopt_env() -> None:
    """Give torch.distributed its env:// variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) under
    `srun` and `mpirun`. Under `deepspeed` they are already set; outside any launcher nothing happens."""
    env = os.environ
    if "RANK" in env:
        return
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        # mpi4py finds rank, world and local rank; DeepSpeed's discovery would also reset the port to
        # 29500 and the address to rank 0's first `hostname -I`: keep what the launcher exported.
        from deepspeed.comm import mpi_discovery
        addr, port = env.get("MASTER_ADDR"), int(env.get("MASTER_PORT", 29500))
        mpi_discovery(distributed_port=port, verbose=False)
        if addr:
            env["MASTER_ADDR"] = addr
        env.setdefault("LOCAL_WORLD_SIZE", env.get("OMPI_COMM_WORLD_LOCAL_SIZE", env.get("MPI_LOCALNRANKS", "")))
        if not env["LOCAL_WORLD_SIZE"]:
            del env["LOCAL_WORLD_SIZE"]
        return
    if all(v in env for v in SRUN_STEP_VARS):
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env["SLURM_STEP_NUM_TASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_NTASKS_PER_NODE", ""))
        if per_node.split("(")[0].split(",")[0].isdigit():  # "8(x4)" or "2,1"
            env["LOCAL_WORLD_SIZE"] = per_node.split("(")[0].split(",")[0]
        if "MASTER_ADDR" not in env:
            env["MASTER_ADDR"] = slurm_first_host()
        env.setdefault("MASTER_PORT", "29500")


def slurm_first_host() -> str:
    """The first node of the job (rank 0's), from SLURM_STEP_NODELIST / SLURM_JOB_NODELIST."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST", os.environ.get("SLURM_JOB_NODELIST", ""))
    if not nodelist or os.environ.get("SLURM_STEP_NUM_NODES", os.environ.get("SLURM_NNODES", "1")) == "1":
        return "127.0.0.1"
    scontrol = shutil.which("scontrol")
    if scontrol:
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    return nodelist.split(",")[0].split("[")[0]  # "node[1-4]" without scontrol: best effort


def skip_shm_comm_build() -> None:
    """On CPU, DeepSpeed's communication backend JIT-compiles its shared-memory op (C++, ~25 s on 2 cores,
    again for every new virtual environment) at start-up. Only `inference_all_reduce` (tensor-parallel
    inference) uses it; training collectives go through torch.distributed (gloo). Marking the op
    incompatible skips the build; DeepSpeed keeps `__compatible_ops__` as one dict so that edits persist."""
    import deepspeed.ops

    ops = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(ops, dict):
        ops["deepspeed_shm_comm"] = False


_RENDEZVOUS_SOCKET = None
_SEEN_AS = "mm_ds/master_addr_seen_from_other_nodes"


def _bind_rendezvous() -> None:
    """env:// rendezvous that listens only where it must. torch's own TCPStore server binds every interface
    (`::`) whatever MASTER_ADDR says; here rank 0 binds the listening socket itself, on MASTER_ADDR, and hands it
    to the store (`master_listen_fd`), then DeepSpeed adopts the process group. When the world spans nodes and
    MASTER_ADDR, a name, resolves to loopback here (Debian and Ubuntu map a machine's own name to 127.0.1.1 in
    /etc/hosts), the other nodes still resolve it to this node's network address: rank 0 then listens on every
    interface, as torch's store would."""
    global _RENDEZVOUS_SOCKET, _STORE
    import socket

    from deepspeed.accelerator import get_accelerator
    from torch.distributed.constants import default_pg_timeout

    env = os.environ
    if not all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        return  # another rendezvous (e.g. MPI discovery inside DeepSpeed): leave it to DeepSpeed
    r, world, addr, port = int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])
    local = local_world_size()
    fd = None
    if r == 0:
        family, _, _, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        if (local or 0) < world and _loopback(where[0]) and not is_loopback(addr):
            print(f"[mm-ds] MASTER_ADDR={addr} is {where[0]} on rank 0's node (its /etc/hosts), which other nodes "
                  f"cannot reach: rank 0 listens on every interface", flush=True)
            where = ("::" if family == socket.AF_INET6 else "0.0.0.0", port)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(where)
        except OSError as e:
            raise ConfigError(f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT={addr}:{port} ({e}); choose a free "
                              f"launch.master_port, and an address of rank 0's machine as launch.master_addr") from None
        sock.listen(max(128, world))
        _RENDEZVOUS_SOCKET, fd = sock, sock.fileno()  # kept open for the life of the process group
    store = _STORE = torch.distributed.TCPStore(addr, port, world, r == 0, default_pg_timeout, master_listen_fd=fd)
    backend = get_accelerator().communication_backend_name()
    if backend == "gloo" and local is not None and local < world and not is_loopback(addr):
        _gloo_interface(store, addr, default_pg_timeout)
    torch.distributed.init_process_group(backend, store=store, rank=r, world_size=world, timeout=default_pg_timeout)


def _gloo_interface(store, addr: str, timeout) -> None:
    """gloo advertises to its peers the address this machine's host name resolves to: 127.0.1.1 on Debian-style
    hosts, which every other node dials as its own loopback. Unless GLOO_SOCKET_IFNAME names the interface,
    take the one this node reaches MASTER_ADDR through; on rank 0's node, where MASTER_ADDR itself may be
    loopback, the one holding the address the other nodes reached it at (their ranks put it in the store)."""
    import socket

    master_ip = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]
    with socket.socket(socket.AF_INET6 if ":" in master_ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_ip, 9))  # sends nothing: the kernel picks the route and this end's address
        here = s.getsockname()[0]
    if not _loopback(here):
        store.set(_SEEN_AS, master_ip)  # every rank off rank 0's node, whatever it decides below
    try:
        first = socket.getaddrinfo(socket.gethostname(), None)[0][4][0]
    except OSError:
        first = "127.0.0.1"  # gloo falls back to loopback then
    if os.environ.get("GLOO_SOCKET_IFNAME") or not _loopback(first):
        return  # the user's choice, or gloo's own is an address other nodes can reach
    if _loopback(here):
        store.wait([_SEEN_AS], timeout)
        here = store.get(_SEEN_AS).decode()
    import psutil

    names = [n for n, addrs in psutil.net_if_addrs().items() if any(a.address.split("%")[0] == here for a in addrs)]
    if names:
        os.environ["GLOO_SOCKET_IFNAME"] = names[0]
    else:
        print(f"[mm-ds] gloo: no interface holds {here}; set GLOO_SOCKET_IFNAME to the one other nodes reach",
              file=sys.stderr, flush=True)


def _loopback(ip: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


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
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

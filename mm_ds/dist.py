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

from .config import ConfigError
from .launch import SRUN_STEP_VARS

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


def broadcast_object(obj, src: int = 0):
    """`obj` as rank `src` has it, on every rank (pickled; small objects only)."""
    if not is_initialized():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=src, device=device())
    return box[0]


class OtherRankFailed(RuntimeError):
    """Raised by `on_rank0` on the ranks that waited while rank 0's own work failed: rank 0 reports why."""


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

    adopt_env()  # srun / mpirun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* from the launcher's own variables
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ and "PMI_RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before the process group: NCCL binds to the current device
    if not is_initialized():
        if not torch.cuda.is_available():
            skip_shm_comm_build()
        _bind_rendezvous()
        deepspeed.init_distributed(verbose=False)
    r, world = rank(), world_size()
    from .watchdog import start as watch_launcher
    watch_launcher(r)  # a SIGKILLed launcher must not leave this rank running (mm_ds/watchdog.py)
    if not torch.cuda.is_available():
        # CPU ranks share the cores: one rank's BLAS threads must not fight another's.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
        keep_freed_memory()
    return r, local_rank, world


def finish(rc: int) -> int:
    """After a rank's command succeeded: wait for the others, then tear the process group down. Left to
    interpreter exit, rank 0's rendezvous store could vanish under another rank's live store threads,
    which then abort ("terminate called without an active exception") after the work is done."""
    if not (is_initialized() and "RANK" in os.environ):
        return rc
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


def _bind_rendezvous() -> None:
    """env:// rendezvous that listens only on MASTER_ADDR. torch's own TCPStore server binds every interface
    (`::`) whatever MASTER_ADDR says; here rank 0 binds the listening socket to MASTER_ADDR:MASTER_PORT
    itself and hands it to the store (`master_listen_fd`), then DeepSpeed adopts the process group."""
    global _RENDEZVOUS_SOCKET
    import socket

    from deepspeed.accelerator import get_accelerator
    from torch.distributed.constants import default_pg_timeout

    env = os.environ
    if not all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        return  # another rendezvous (e.g. MPI discovery inside DeepSpeed): leave it to DeepSpeed
    r, world, addr, port = int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])
    fd = None
    if r == 0:
        family, _, _, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(where)
        except OSError as e:
            raise ConfigError(f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT={addr}:{port} ({e}); choose a free "
                              f"launch.master_port, and an address of rank 0's machine as launch.master_addr") from None
        sock.listen(max(128, world))
        _RENDEZVOUS_SOCKET, fd = sock, sock.fileno()  # kept open for the life of the process group
    store = torch.distributed.TCPStore(addr, port, world, r == 0, default_pg_timeout, master_listen_fd=fd)
    torch.distributed.init_process_group(get_accelerator().communication_backend_name(), store=store, rank=r,
                                         world_size=world, timeout=default_pg_timeout)


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

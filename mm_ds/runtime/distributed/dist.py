"""The only place in mm-ds that calls a collective, and a rank's bring-up and tear-down around them (where the
ranks meet: mm_ds/runtime/distributed/rendezvous.py; the rules, from strings: bringup.py).

On CUDA the process group is NCCL, which takes device tensors only; gloo (CPU) also takes host tensors. A
collective on a tensor made on the host therefore passes every CPU test and stops a GPU run at its first
update. So every collective goes through this module, which puts its tensors on the accelerator's current
device (`device()`), and tests/test_dist.py scans the package so that no other module touches
`torch.distributed` or `deepspeed.comm`.
"""

from __future__ import annotations

import os
import sys

import torch

from ...config import LaunchConfig
from . import bringup, rendezvous, stop, watchdog
from .bringup import free_port, keep_freed_memory, local_world_size, set_threads, skip_shm_comm_build  # noqa: F401

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
    not the host: mm_ds/runtime/training/boundary.py's lagged agreement reads the result an update later."""
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




def shared_add(key: str, amount: int = 1) -> int:
    """Add `amount` to the counter `key` that every rank of the launch shares, and return its new value (`amount`
    0 reads it). It lives in rank 0's rendezvous store: no collective, so ranks call it whenever they like and
    none waits for another (mm_ds/pipeline/pack.py's queue of independent jobs). Needs the process group (`init`)."""
    store = rendezvous.store() or torch.distributed.distributed_c10d._get_default_store()  # DeepSpeed's group
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


def init(launch: LaunchConfig | None = None) -> tuple[int, int, int]:
    """(rank, local_rank, world_size). Outside any launcher, runs as a world of one. `launch`: the command's launch
    settings as every rank parses them (its timeouts); None: the defaults."""
    import deepspeed

    launch = launch or LaunchConfig()
    if bringup.under_launcher():  # a rank of a launch: a stop signal during start-up is kept for the loop (stop.py)
        stop.install()
    if not is_initialized():
        here = rendezvous.adopt_env()  # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* from the launcher's own variables
        set_threads(here.local_world or here.world)
        if not torch.cuda.is_available():
            skip_shm_comm_build()
        store = rendezvous.meet(here, launch)  # every rank in rank 0's store, or every rank stops saying why
        if torch.cuda.is_available():
            rendezvous.set_device(here.local_rank)  # before the process group: NCCL binds to the current device
        rendezvous.start_group(store, here, launch)
        deepspeed.init_distributed(verbose=False)  # adopts the process group
    r, world = rank(), world_size()
    watchdog.start(r)  # a SIGKILLed launcher must not leave this rank running (mm_ds/runtime/distributed/watchdog.py)
    if not torch.cuda.is_available():
        keep_freed_memory()
    return r, int(os.environ.get("LOCAL_RANK", 0)), world


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

"""Count what makes a GPU wait for the host, or the other ranks for rank 0, in the training loop (test machinery,
not product code).

On a GPU the host queues kernels ahead of the device and waits only where it asks to:
- a read of a device value: `.item()`, `bool(t)`, `float(t)` (all `aten._local_scalar_dense`), `.tolist()`,
  `.numpy()`, `.cpu()`, ops whose output size depends on the data (`nonzero`, `masked_select`, `unique`, ...), and
  the opposite direction, a tensor made from host values (`torch.tensor(x, device=...)`, `t.new_tensor(n)`),
  whose copy waits for the device too;
- a synchronization: `get_accelerator().synchronize()` (DeepSpeed's), `torch.cuda.synchronize()` /
  `torch.cpu.synchronize()`, and a stream's or an event's `synchronize()`. (`wait_stream`/`wait_event` order
  two streams on the device; the host does not wait, so they are not counted.)
On this CPU nothing waits, and DeepSpeed takes other code paths on a device that runs in step with the host
(`is_synchronized_device()`: no side streams, no events). `AsyncDevice` makes DeepSpeed's CPU accelerator claim
to run behind the host, as CUDA's does, with stand-in streams and events, so that DeepSpeed's CUDA paths run and
their waits are counted.

`HostReads` records, in the training thread, per update, each wait (attributed to the first frame outside torch
and this module: mm_ds, deepspeed, or other), each file opened (`open`, `io.open`, `os.open`) and each collective
(`torch.distributed.*`). A test holds mm-ds's waits to the log and checkpoint updates and names every other one
it allows, with its reason (`summary`'s `allowed`). An event recorded in an earlier update and waited for now is
recorded as "event.synchronize (lagged)": it waits only for work queued an update ago (a finished collective,
say), never drains the queue, and is not a wait. A `.item()` of a tensor an earlier update made is a wait: on
CUDA it synchronizes the stream, everything queued since included.

    python tests/support/host_reads.py CORPUS OUT STAGE DS_CONFIG [key=value ...]   # prints one JSON object (`main`)

It runs the real `engine.train` in a fresh process, as one rank of the world its environment describes (RANK,
WORLD_SIZE, ...: tests/test_host_side.py starts two) or a world of one, with `engine.train_step` wrapped only to
know which update a record belongs to.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import sys
import threading
import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
DATA_DEPENDENT = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
                  aten._unique2.default, aten.unique_consecutive.default, aten.unique_dim.default,
                  aten.repeat_interleave.Tensor,
                  aten.lift_fresh.default}  # a tensor made from host values: a synchronous copy to a GPU
PYTHON_READS = ("tolist", "numpy", "cpu")  # never dispatched as an op on a CPU tensor: patched instead
OPENS = ((builtins, "open"), (io, "open"), (os, "open"))
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "broadcast", "broadcast_object_list", "all_gather",
               "all_gather_into_tensor", "all_gather_object", "reduce_scatter_tensor", "reduce_scatter", "reduce",
               "all_to_all_single", "gather", "scatter", "barrier", "monitored_barrier")
LAGGED = " (lagged)"


def _where() -> tuple[str, str]:
    """(mm_ds | deepspeed | other, 'file:line function') of the first frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = frame.filename
        if "/torch/" in f or f == __file__ or f.startswith("<frozen"):
            continue
        owner = "deepspeed" if "/deepspeed/" in f else "mm_ds" if "/mm_ds/" in f else "other"
        return owner, f"{f.rsplit('/', 2)[-2]}/{f.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"
    return "other", "?"


class HostReads(TorchDispatchMode):
    """Records (update, owner, where, what) for every wait in the thread that enters it (`records`), and the
    same for files opened (`opens`, `what` the path) and collectives (`collectives`, `what` the function)."""

    def __init__(self):
        super().__init__()
        self.update: int | None = None  # set by the wrapped train_step; None: outside the loop
        self.records: list[tuple[int | None, str, str, str]] = []
        self.opens: list[tuple[int | None, str, str, str]] = []
        self.collectives: list[tuple[int | None, str, str, str]] = []
        self.thread = threading.get_ident()
        self._saved: list[tuple[object, str, object]] = []

    def note(self, what: str, into: list | None = None) -> None:
        if threading.get_ident() == self.thread and self.update is not None:
            (self.records if into is None else into).append((self.update, *_where(), what))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in DATA_DEPENDENT:
            self.note(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

    def patch(self, owner, name: str, wrapper) -> None:
        """Replace `owner.name` by `wrapper(original)` until `__exit__`."""
        original = getattr(owner, name)
        setattr(owner, name, wrapper(original))
        self._saved.append((owner, name, original))

    def __enter__(self):
        for name in PYTHON_READS:
            self.patch(torch.Tensor, name, lambda orig, _n=name: self._counted(orig, _n))
        for sync in (torch.cuda, torch.cpu):
            self.patch(sync, "synchronize", lambda orig, _m=sync.__name__: self._counted(orig, f"{_m}.synchronize"))
        for module, name in OPENS:
            self.patch(module, name, lambda orig: self._opened(orig))
        for name in COLLECTIVES:
            if hasattr(torch.distributed, name):
                self.patch(torch.distributed, name, lambda orig, _n=name: self._counted(orig, _n, self.collectives))
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        return super().__exit__(*exc)

    def _counted(self, original, what: str, into: list | None = None):
        def counted(*a, **k):
            self.note(what, into)
            return original(*a, **k)
        return counted

    def _opened(self, original):
        def opened(file, *a, **k):
            if threading.get_ident() == self.thread and not _cpu_accelerator_asks():
                self.note(os.fspath(file) if isinstance(file, (str, os.PathLike)) else repr(file), self.opens)
            return original(file, *a, **k)
        return opened


def _cpu_accelerator_asks() -> bool:
    """Whether DeepSpeed's CPU accelerator opens the file: its memory statistics read /proc (psutil) and its
    `device_count` runs `numactl`, where CUDA's ask the driver. Not a file a GPU run opens."""
    return any(f.filename.endswith("deepspeed/accelerator/cpu_accelerator.py") for f in traceback.extract_stack())


class _Stream:
    """A stream of a device that runs behind the host: the host waits only in `synchronize`."""

    def __init__(self, reads: HostReads, *_, **__):
        self.reads = reads

    def synchronize(self):
        self.reads.note("stream.synchronize")

    def query(self):
        return False  # its work is still queued

    def wait_stream(self, stream):  # device-side ordering
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or _Event(self.reads)
        event.record(self)
        return event


class _Event:
    """An event of that device: `synchronize` waits for the work queued before `record`; when that was an earlier
    update, the wait is a lagged one."""

    def __init__(self, reads: HostReads, *_, **__):
        self.reads, self.recorded_at = reads, None

    def record(self, stream=None):
        self.recorded_at = self.reads.update

    def query(self):
        return False

    def wait(self, stream=None):  # device-side ordering
        pass

    def synchronize(self):
        now, then = self.reads.update, self.recorded_at
        self.reads.note("event.synchronize" + (LAGGED if None not in (now, then) and then < now else ""))

    def elapsed_time(self, end):
        end.synchronize()
        return 0.0


class AsyncDevice:
    """DeepSpeed's CPU accelerator made to claim a device that runs behind the host (as CUDA's does): DeepSpeed then
    takes its GPU code paths (side streams, events, `record_stream`), with `_Stream`/`_Event` stand-ins, and
    every `get_accelerator().synchronize()` is counted. Enter it before the engine is built (ZeRO picks its streams
    then), inside `reads`."""

    def __init__(self, reads: HostReads):
        self.reads = reads

    def __enter__(self):
        from deepspeed.accelerator import get_accelerator

        acc, reads = get_accelerator(), self.reads
        main = _Stream(reads)
        behind = lambda: False  # noqa: E731
        for name in ("is_synchronized_device", "resolves_data_dependency", "handles_memory_backpressure"):
            reads.patch(acc, name, lambda orig: behind)
        reads.patch(type(acc), "Stream", lambda orig: property(lambda self: lambda *a, **k: _Stream(reads)))
        reads.patch(acc, "current_stream", lambda orig: lambda *a, **k: main)
        reads.patch(acc, "default_stream", lambda orig: lambda *a, **k: main)
        reads.patch(type(acc), "Event", lambda orig: property(lambda self: lambda *a, **k: _Event(reads)))
        reads.patch(acc, "synchronize", lambda orig: reads._counted(orig, "synchronize"))

        def record_stream(orig):
            return lambda t, stream: None if isinstance(stream, _Stream) else orig(t, stream)
        reads.patch(torch.Tensor, "record_stream", record_stream)
        return self

    def __exit__(self, *exc):
        return False


def main(argv: list[str]) -> int:
    """CORPUS OUT STAGE DS_CONFIG [key=value ...]: train STAGE (pretrain: MINIJOINT with its secondary head;
    adapt: BL_BASE's Step 2 over its own untrained parent) on a device that runs behind the host (`AsyncDevice`)
    and print {"steps", "log_every", "world", "grad_accum", "checkpoints", "log_dir", "reads", "opens",
    "collectives"} (the last three: lists of [update, owner, where, what])."""
    from mm_ds import config
    from mm_ds.runtime.distributed import dist
    from mm_ds.runtime.training import engine
    from mm_ds.runtime.training.ds_config import split
    from mm_ds.stages import adapt, pretrain

    corpus, out, stage_name, ds_config, *overrides = argv
    dist.init()  # the launcher's world (RANK, WORLD_SIZE, ...), or one of one
    tiny = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64",
            "model.max_positions=32", "data.seq_len=32", f"data.corpus={corpus}", "train.global_batch=8",
            "train.micro_batch=4", "train.steps=6", "train.warmup_steps=1", "train.log_every=3",
            "train.checkpoint_steps=[]", "train.checkpoint_every=1000000", f"ds_config={ds_config}"]
    cfg = config.load("tiny/minijoint", None, tiny + ["model.secondary_head_layer=1"] + overrides)
    if stage_name == "adapt":  # its parent: an untrained MINIJOINT written as built (no engine)
        parent = pretrain.build(config.load("tiny/bl_base", None, tiny))
        parent.cfg.train.steps = 0
        engine.train(parent, Path(out) / "parent", progress=False)
        cfg = config.load("tiny/adapt", None, tiny + ["system=bl_base", f"parent={Path(out) / 'parent'}",
                                                      "lang=xx"] + overrides)
    stage = (pretrain if stage_name == "pretrain" else adapt).build(cfg)
    reads = HostReads()
    inner = engine.train_step

    def train_step(eng, st, step, *a, **k):
        reads.update = step + 1
        return inner(eng, st, step, *a, **k)

    engine.train_step = train_step
    with reads, AsyncDevice(reads):
        engine.train(stage, Path(out) / "run", progress=False)
        reads.update = None
    t = cfg.train
    print(json.dumps({"steps": t.steps, "log_every": t.log_every, "world": dist.world_size(),
                      "grad_accum": split(t.global_batch, t.micro_batch, dist.world_size()).grad_accum,
                      "checkpoints": [s for s in range(1, t.steps + 1) if t.is_checkpoint_step(s)],
                      "log_dir": str(Path(out) / "run" / "logs"),
                      "reads": reads.records, "opens": reads.opens, "collectives": reads.collectives}))
    sys.stdout.flush()
    return dist.finish(0)


def quiet_updates(result: dict) -> list[int]:
    """The updates that neither log nor checkpoint (the last one does both)."""
    return [u for u in range(1, result["steps"] + 1)
            if u % result["log_every"] and u != result["steps"] and u not in result["checkpoints"]]


Allowed = dict[tuple[str, str, str | None], str]
"""{(owner, place, what): reason}: a wait a test names and accepts. `place` is the start of 'file function' (the
record's `where` without its line): 'zero/stage3.py step' is one function, 'zero/utils.py' a whole file; `what`
None is any wait there."""


def allowed_by(allowed: Allowed, owner: str, where: str, what: str) -> str | None:
    """The reason `allowed` gives for this wait, if it names it."""
    place, _, name = where.partition(" ")
    function = f"{place.split(':')[0]} {name}"
    for (o, p, w), reason in allowed.items():
        if o == owner and function.startswith(p) and w in (None, what):
            return reason
    return None


def summary(result: dict, allowed: Allowed | None = None, first_update: Allowed | None = None) -> Counter:
    """(owner, where, what) -> waits per micro-step in the updates that neither log nor checkpoint, but for lagged
    event waits and those `allowed` names; `first_update` names more for the first update only."""
    quiet = quiet_updates(result)
    per = Counter((o, w, what) for u, o, w, what in result["reads"]
                  if u in quiet and not what.endswith(LAGGED) and not allowed_by(allowed or {}, o, w, what)
                  and not (u == 1 and allowed_by(first_update or {}, o, w, what)))
    return Counter({k: v / (len(quiet) * result["grad_accum"]) for k, v in per.items()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Count the training loop's host reads of tensor values: what stalls a GPU (test machinery, not product code).

On a GPU the host queues kernels ahead of the device and only waits when it reads a value back: `.item()`,
`bool(t)`, `float(t)` (all `aten._local_scalar_dense`), `.tolist()`, `.numpy()`, `.cpu()`, and ops whose output
size depends on the data (`nonzero`, `masked_select`, `unique`, ...); and the opposite direction, a tensor made from host values
(`torch.tensor(x, device=...)`, `t.new_tensor(n)`), whose copy waits for the device too. On this CPU nothing waits, but the same
calls happen: this module counts them in the training thread, per update, and attributes each to the first
frame outside torch (mm_ds, deepspeed, or other), so a test can hold mm-ds's own reads to the log and
checkpoint updates and name DeepSpeed's apart.

    python tests/host_reads.py CORPUS OUT STAGE DS_CONFIG   # prints one JSON object (see `main`)

It runs the real `engine.train` in a fresh process (a world of one rank), with `engine.train_step` wrapped only
to know which update a read belongs to.
"""

from __future__ import annotations

import json
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


def _where() -> tuple[str, str]:
    """(mm_ds | deepspeed | other, 'file:line function') of the first frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        f = frame.filename
        if "/torch/" in f or f == __file__:
            continue
        owner = "deepspeed" if "/deepspeed/" in f else "mm_ds" if "/mm_ds/" in f else "other"
        return owner, f"{f.rsplit('/', 2)[-2]}/{f.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"
    return "other", "?"


class HostReads(TorchDispatchMode):
    """Records (update, owner, where, what) for every host read in the thread that enters it."""

    def __init__(self):
        super().__init__()
        self.update: int | None = None  # set by the wrapped train_step; None: outside the loop
        self.records: list[tuple[int | None, str, str, str]] = []
        self.thread = threading.get_ident()
        self._saved = {}

    def note(self, what: str) -> None:
        if threading.get_ident() == self.thread and self.update is not None:
            self.records.append((self.update, *_where(), what))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in DATA_DEPENDENT:
            self.note(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in PYTHON_READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def read(t, *a, _name=name, _original=original, **k):
                self.note(_name)
                return _original(t, *a, **k)
            setattr(torch.Tensor, name, read)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)


def main(argv: list[str]) -> int:
    """CORPUS OUT STAGE DS_CONFIG [key=value ...]: train STAGE (pretrain: MINIJOINT with its secondary head;
    adapt: BL_BASE's Step 2 over its own untrained parent) and print {"steps", "log_every", "checkpoints", "reads":
    [[update, owner, where, what], ...]}."""
    from mm_ds import config
    from mm_ds.runtime import engine
    from mm_ds.stages import adapt, pretrain

    corpus, out, stage_name, ds_config, *overrides = argv
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
    with reads:
        engine.train(stage, Path(out) / "run", progress=False)
    reads.update = None
    t = cfg.train
    print(json.dumps({"steps": t.steps, "log_every": t.log_every, "grad_accum": 2,
                      "checkpoints": [s for s in range(1, t.steps + 1) if t.is_checkpoint_step(s)],
                      "reads": reads.records}))
    sys.stdout.flush()
    from mm_ds.runtime import dist
    return dist.finish(0)


def summary(result: dict) -> Counter:
    """(owner, where, what) -> reads per micro-step in updates that neither log nor checkpoint."""
    quiet = [u for u in range(1, result["steps"] + 1)
             if u % result["log_every"] and u not in result["checkpoints"]]
    per = Counter((o, w, what) for u, o, w, what in result["reads"] if u in quiet)
    return Counter({k: v / (len(quiet) * result["grad_accum"]) for k, v in per.items()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

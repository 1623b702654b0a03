"""What the training loop learns about its updates, kept on the device and read back only at log and checkpoint
updates.

On a GPU every read of a device value on the host (`.item()`, `.tolist()`, a collective whose result is read)
waits for the device to finish everything queued before it. Reading the loss, the non-finite flags and the
plateau signal after every update would stall the device once per update. So each update only *adds* to
device tensors here, and `read` brings everything back in one collective and one host read, at the updates
where the loop needs it anyway: a log row, a checkpoint (never saved with an unnoticed non-finite update in
it), the last update. What happened in between is then handled update by update, exactly as if it had been
read at once: skips are counted, a non-finite update that was applied anyway stops the run naming its step,
and the plateau schedule (mm_ds/runtime/training/phases.py) sees each update's loss; its switch takes effect after the read.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..checkpointing.rundir import writing
from ..distributed import dist
from . import compiled
from .ds_config import MONITORS


@dataclass
class Settled:
    """One read of the window: per pending update its step, the loss keys that were non-finite on some rank,
    whether it was skipped, and its mean loss over ranks and micro-steps; with `logs`, the row's means."""

    steps: list[int]
    bad_heads: list[list[str]]
    skipped: list[bool]
    losses: list[float]
    logs: dict[str, float] = field(default_factory=dict)


class LogWindow:
    """Device-side sums of the per-update logs since the last row, and per-update flags since the last read."""

    def __init__(self, grad_accum: int):
        self.grad_accum = grad_accum
        self.sums: dict[str, torch.Tensor] = {}
        self.kept: torch.Tensor | int = 0  # updates whose logs count (not skipped, finite), on the device
        self.pending: list[tuple[int, list[str], torch.Tensor]] = []  # (step, loss keys, flags + loss)
        self.updates, self.data_time = 0, 0.0
        self.started, self.compiling, self.compile_s = time.perf_counter(), compiled.seconds(), 0.0

    def add(self, step: int, sums: dict[str, torch.Tensor], skipped: bool | torch.Tensor, data_time: float) -> None:
        """Update `step` ran: its summed micro-step logs (device tensors) and whether it was skipped (a host
        bool from DeepSpeed's own optimizers, or a device flag from `engine.skip_nonfinite`)."""
        keys = sorted(k for k in sums if k.startswith("loss"))
        ref = sums[keys[0]] if keys else torch.zeros((), dtype=torch.float64)
        bad = torch.stack([~torch.isfinite(sums[k]) for k in keys]).double() if keys else ref.new_zeros(0)
        # Never a tensor made from a host value here: that copy would wait for the device.
        skip = (skipped.double().reshape(1) if torch.is_tensor(skipped) else ref.new_zeros(1) + float(skipped))
        loss = sums.get("loss", ref.new_zeros(())).detach().double().reshape(1)
        self.pending.append((step, keys, torch.cat([bad, skip, loss])))
        if skipped is not True:  # a host True: nothing of this update counts, and nothing need be computed
            ok = (bad.sum() + skip.sum()).eq(0)
            for k, v in sums.items():
                v = torch.where(ok, v.detach().double(), 0.0)
                self.sums[k] = self.sums[k] + v if k in self.sums else v
            self.kept = self.kept + ok.double()
        self.updates += 1
        self.data_time += data_time

    def read(self, row: bool) -> Settled:
        """Collective (every rank, at the same updates): the pending updates' flags, and with `row` the log
        row's means (losses per micro-step; accuracies over masked tokens or examples), in one all-reduce."""
        sizes = [len(t) for _, _, t in self.pending]
        keys = sorted(self.sums) if row else []
        parts = [t for _, _, t in self.pending]
        world = dist.world_size()
        if row:
            kept = torch.as_tensor(self.kept, dtype=torch.float64)
            parts += [torch.stack([self.sums[k] for k in keys] + [kept.to(self.sums[keys[0]].device) if keys
                                                                   else kept]).reshape(-1)]
            # Each rank's compile seconds in its own slot (a fill, not a copy from the host): every rank waits
            # for the slowest one's compile at its next collective, so the row leaves out the longest.
            compiling = parts[-1].new_zeros(world)
            compiling[dist.rank()] = compiled.seconds() - self.compiling
            parts.append(compiling)
        flat = dist.all_reduce_tensor(torch.cat(parts)) if parts else []  # sums over ranks: flags count ranks
        settled, at = Settled([], [], [], []), 0
        for (step, lkeys, _), n in zip(self.pending, sizes):
            vals = flat[at:at + n]
            at += n
            settled.steps.append(step)
            settled.bad_heads.append([k for k, f in zip(lkeys, vals[:-2]) if f > 0])
            settled.skipped.append(vals[-2] > 0)
            settled.losses.append(vals[-1] / (world * self.grad_accum))
        self.pending = []
        if row:
            vals = dict(zip(keys, flat[at:at + len(keys)]))
            n_micro = max(1.0, flat[at + len(keys)]) * self.grad_accum  # kept updates, over every rank
            settled.logs = {k: v / n_micro for k, v in vals.items() if k.startswith("loss")}
            denom = vals.get("masked_tokens", vals.get("examples"))
            for k, v in vals.items():
                if k.startswith("correct") and denom:
                    settled.logs["acc" + k[len("correct"):]] = v / denom
            self.compile_s = max(flat[-world:])
            if self.compile_s > 0:
                settled.logs["compile_s"] = self.compile_s
        return settled

    def seconds(self) -> float:
        """The window's training time: its wall time less the longest a rank spent compiling in it (train.compile;
        known after the row's `read`)."""
        return time.perf_counter() - self.started - self.compile_s

    def reset(self) -> None:
        """A row was written: the next window starts now (pending flags are kept: `read` clears them)."""
        self.sums, self.kept, self.updates, self.data_time = {}, 0, 0, 0.0
        self.started, self.compiling, self.compile_s = time.perf_counter(), compiled.seconds(), 0.0


def nonfinite_skips(settled: Settled, count: int, budget: int, fp16: bool, last_checkpoint: str | None,
                    say) -> int:
    """Handle the read updates in order, as the loop once did after each: returns the new count of skipped
    non-finite updates. Raises FloatingPointError when one was applied anyway (nothing can undo it) or when the
    skips exceed train.max_nonfinite_steps."""
    for step, bad_heads, skipped in zip(settled.steps, settled.bad_heads, settled.skipped):
        if not bad_heads and (not skipped or fp16):
            continue  # fp16 loss scaling skips overflowing updates while it calibrates: not a fault
        heads = ", ".join(h for h in bad_heads if h != "loss") or ("loss" if bad_heads else "none (the loss is "
                                                                   "finite; the gradients are not)")
        if not skipped:
            raise FloatingPointError(f"non-finite loss at step {step + 1} (head(s): {heads}) and DeepSpeed applied "
                                     f"the update anyway (no gradient-norm check: zero_optimization."
                                     f"compute_grad_norm is off?); the weights are garbage from there. Stopped. "
                                     f"Last good checkpoint: {last_checkpoint or 'none'}; resume from it with "
                                     f"--resume.")
        count += 1
        where = (f"step {step + 1} (head(s): {heads}); {count} non-finite update(s) so far, budget "
                 f"train.max_nonfinite_steps={budget}")
        if count > budget:
            raise FloatingPointError(f"non-finite loss or gradients at {where}: stopped instead of training on "
                                     f"garbage. Last good checkpoint: {last_checkpoint or 'none'}. Lower train.lr, "
                                     f"enable gradient_clipping in the DeepSpeed config or check the data, then "
                                     f"--resume (or raise train.max_nonfinite_steps).")
        say(f"[mm-ds] skipped the update of {where}")
    return count


class RowWriter:
    """Rank 0's writer of log rows: logs/train.jsonl and the monitors the engine config enables (CSV, TensorBoard,
    W&B, Comet: DeepSpeed's, built here instead of in the engine), on a thread of its own. The training thread only
    queues a row, so it never opens a file or waits for a shared file system, and no other rank waits for rank 0's
    writes. The first write that fails stops the writer; `flush` and `close` raise its error (the loop calls them
    inside `dist.on_rank0` at each checkpoint and at the end, so every rank stops with rank 0's reason)."""

    def __init__(self, path: Path | None, ds_cfg: dict):
        """`path`: logs/train.jsonl; None (the ranks other than 0): a writer that writes nothing."""
        from deepspeed.monitor.config import get_monitor_config
        from deepspeed.monitor.monitor import MonitorMaster

        self.path, self.monitor, self.error = path, None, None
        self.rows: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="mm-ds log rows", daemon=True)
        if path is None:
            return
        blocks = {k: v for k, v in ds_cfg.items() if k in MONITORS}
        if any(b.get("enabled") for b in blocks.values()):  # W&B's run starts here, on the main thread
            self.monitor = MonitorMaster(get_monitor_config(blocks))
        self.thread.start()

    def put(self, row: dict) -> None:
        if self.path is not None:
            self.rows.put(row)

    def _run(self) -> None:
        while True:
            row = self.rows.get()
            try:
                if row is not None and self.error is None:
                    self._write(row)
            except Exception as e:  # noqa: BLE001  raised in the training thread by flush/close
                self.error = e
            finally:
                self.rows.task_done()
            if row is None:
                return

    def _write(self, row: dict) -> None:
        if self.monitor is not None:
            self.monitor.write_events([(f"train/{k}", v, row["step"]) for k, v in row.items()
                                       if k not in ("step", "total_steps", "tokens")])
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def flush(self) -> None:
        """Wait until every queued row is written; raise the writer's error, if any."""
        self.rows.join()
        if self.error is not None:
            raise self.error

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, end the thread, raise the writer's error. With `timeout` (the loop failed), wait
        at most that long and raise nothing: the loop's own error is the one to report."""
        if self.thread.is_alive():  # (never started on the ranks other than 0)
            self.rows.put(None)
            self.thread.join(timeout)
        if timeout is None and self.error is not None:
            raise self.error

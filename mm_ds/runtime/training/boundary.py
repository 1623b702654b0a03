"""What the ranks agree on at each update boundary without waiting for the device: a stop signal seen on any rank
(mm_ds/runtime/distributed/stop.py), and a time-based resume checkpoint due on rank 0's clock (rank-local clocks differ,
so one rank decides for all).

    the lag        after update n every rank starts a MAX all-reduce of [its first stop signal, rank 0's "a resume
                   checkpoint is due"] and reads the one it started after update n-1 (`LaggedMax`). Every rank reads
                   the same values after the same update, so all save and leave after the same update, and no
                   collective waits on a rank that got no signal: every rank runs the same one every update. A
                   signal is carried by the boundary of the update it arrives in (`stop.in_flight`) and acted on
                   after the next update: the run stops after the update in which the signal was seen, or the one
                   after.
    the host wait  `LaggedMax.read`: on CUDA an event recorded an update earlier, right after the all-reduce and
                   its copy to pinned host memory (the device is at most that update behind, the next one queued:
                   no drain); on gloo the work's wait. The one host wait outside log and checkpoint updates.
    at a stop      one blocking all-reduce (a checkpoint update): whether the save fits the grace left (the last
                   save's measured seconds against train.stop_grace_s less the time since the signal, on every
                   rank), and the update the signal was seen in, for rank 0's line.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import faults
from ..checkpointing import checkpoint as ckpt_io
from ..distributed import dist, stop, watchdog


class LaggedMax:
    """Agreement one update late: `exchange(values)`, called by every rank at the same boundaries, starts this
    boundary's element-wise MAX all-reduce of `values` (small integers) and returns the previous boundary's
    result, the same on every rank (None at the first call); `read` is its host wait (see the module)."""

    def __init__(self, n: int):
        self.values = torch.zeros(n, dtype=torch.float64, device=dist.device())
        self.cuda = self.values.device.type == "cuda"
        self.host = torch.zeros(n, dtype=torch.float64, pin_memory=self.cuda)
        self.pending = None

    def exchange(self, values: list[float]) -> list[float] | None:
        previous = self.read() if self.pending is not None else None
        for i, v in enumerate(values):
            self.values[i].fill_(float(v))  # a kernel argument: no host-to-device copy to wait for
        work, event = dist.all_reduce_start(self.values, "max"), None
        if self.cuda:
            if work is not None:
                work.wait()  # NCCL: the current stream waits for the all-reduce; the host does not
            self.host.copy_(self.values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.pending = (work, event)
        return previous

    def read(self) -> list[float]:
        """The pending exchange's result: the lagged host wait."""
        work, event = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
            return self.host.tolist()
        if work is not None:
            work.wait()
        return self.values.tolist()

    def close(self) -> None:
        if self.pending is not None:
            self.read()


def _code(seen: stop.Seen | None) -> float:
    return float(getattr(signal, seen.name)) if seen else 0.0


def _name(code: float) -> str | None:
    return signal.Signals(int(code)).name if code else None


@dataclass(frozen=True)
class Agreed:
    """What every rank read at a boundary."""
    stop: str | None = None
    """The stop signal's name: the ranks save and leave after this update."""
    resume: bool = False
    """Rank 0's clock says a resume checkpoint is due (train.resume_every_minutes)."""


@dataclass(frozen=True)
class StopPlan:
    """At a stop, the same on every rank."""
    save: bool
    seen: int
    """The update the signal was seen in (the earliest over the ranks)."""
    last_save_s: float
    grace_left_s: float


class Boundary:
    """A stage's update boundaries (engine.train's loop): `at_start`, then after each update `after_update` (the
    agreement), `kind` and `save` (the checkpoint, timed), and at a stop `stopped` (rank 0's line; raise it)."""

    def __init__(self, engine, run_dir: Path, cfg, rank: int, last_save_s: float | None = None):
        self.engine, self.run_dir, self.train, self.stage, self.rank = engine, run_dir, cfg.train, cfg.stage, rank
        self.flags = LaggedMax(2)
        self.last_save_s = last_save_s
        """Seconds the last checkpoint took to save (at first: the resumed one's, from its client state)."""
        self.saved_at = self.requested_at = time.monotonic()
        self.last = ckpt_io.latest_tag(run_dir)
        """The newest published checkpoint's tag."""
        self.plan: StopPlan | None = None
        watchdog.set_grace(self.train.stop_grace_s)  # a lost launcher stops this rank with the stage's grace

    def at_start(self, step: int) -> str | None:
        """Collective, before the first update: a stop signal seen on any rank during start-up (nothing to save)."""
        if faults.ARMED:  # a test's stop signal (MM_DS_SIGNAL_AT); never in a production run
            faults.at_boundary(step, self.rank, self.stage)
        stop.in_flight = step + 1
        return _name(dist.all_reduce([_code(stop.requested())], "max")[0])

    def after_update(self, done: int) -> Agreed:
        if faults.ARMED:
            faults.at_boundary(done, self.rank, self.stage)
        stop.in_flight = done + 1  # before the flag is read: a signal from here on is this update's or the next's
        now, every = time.monotonic(), self.train.resume_every_minutes * 60
        due = self.rank == 0 and every > 0 and now - max(self.saved_at, self.requested_at) >= every
        if due:
            self.requested_at = now  # asked once: the save comes after the next boundary
        got = self.flags.exchange([_code(stop.requested()), float(due)])
        return Agreed() if got is None else Agreed(_name(got[0]), got[1] > 0)

    def kind(self, done: int, agreed: Agreed) -> str | None:
        """The checkpoint to save after update `done`: `curve` (the paper's checkpoint_steps, checkpoint_every and
        the last step: never removed), `resume` (time or update based, or a stop: the newest train.keep_resume
        kept), or None."""
        if self.train.is_checkpoint_step(done):
            return "curve"
        every = self.train.resume_every
        return "resume" if agreed.stop or agreed.resume or every and done % every == 0 else None

    def save(self, done: int, agreed: Agreed, client: dict, meta: dict) -> dict:
        """Collective: the checkpoint of update `done` (`meta["kind"]`), unless a stop's plan skips it; the log row's
        fields: what it cost (save_s)."""
        if agreed.stop:
            self.plan = self.plan_stop()
            if not self.plan.save:
                return {}
        t0 = time.monotonic()
        ckpt_io.save(self.engine, self.run_dir, done, client | {"last_save_s": self.last_save_s}, meta,
                     keep_resume=self.train.keep_resume)
        self.last_save_s, self.saved_at, self.last = time.monotonic() - t0, time.monotonic(), ckpt_io.tag_for(done)
        return {"save_s": round(self.last_save_s, 3)}

    def plan_stop(self) -> StopPlan:
        """Collective, at a stop: save only when the last save's seconds fit the grace left on every rank (a rank
        that got no signal counts from now); unknown (no save timed yet), it saves."""
        seen, now = stop.requested(), time.monotonic()
        left = self.train.stop_grace_s - (now - seen.at if seen else 0.0)
        est = self.last_save_s or 0.0
        big = 1e12  # min over ranks of the update the signal was seen in, through a max
        over, first, est, neg_left = dist.all_reduce([est - left, big - seen.update if seen else 0.0, est, -left],
                                                     "max")
        return StopPlan(est == 0 or over <= 0, int(big - first) if first else 0, est, -neg_left)

    def stopped(self, done: int, signame: str) -> stop.Stopped:
        """At a stop, after the save: the exception every rank raises, its message the line rank 0 prints (the CLI
        exits with stop.EXIT_CODE)."""
        saved = self.last if self.plan and self.plan.save else None
        return stop.Stopped(signame, stop_line(signame, done, self.plan, saved, self.last, self.last_save_s))

    def close(self) -> None:
        """Wait for the last boundary's all-reduce, which every rank started."""
        self.flags.close()


def stop_line(signame: str, done: int, plan: StopPlan | None, saved: str | None, last: str | None,
              seconds: float | None = None) -> str:
    """Rank 0's one line at a stop."""
    head = f"[mm-ds] stopped by {signame} at update {done}"
    if plan is None:
        what = f"before any update of this run: nothing to save since {last or 'the start'}"
    else:
        head += f" (seen in update {plan.seen})"
        what = (f"saved {saved} in {seconds:.1f} s" if saved else
                f"not saved: the last save took {plan.last_save_s:.1f} s, more than the {plan.grace_left_s:.1f} s "
                f"of train.stop_grace_s left; updates after {last or 'the start'} are lost")
    more = f" ({stop.ignored()} later signal(s) ignored)" if stop.ignored() else ""
    return f"{head}; {what}{more}; resume with: {stop.resume_line()}"

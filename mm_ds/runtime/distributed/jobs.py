"""The queue of independent pieces of work that the ranks of a launch share, and the one loop every rank runs over
it (`serve`): Step 3's single-device runs (mm_ds/pipeline/pack.py), Step 4's units (mm_ds/pipeline/evaluation.py),
the alignment check's Step-2 runs (mm_ds/eval/align_spread.py).

Ranks take pieces one at a time from counters in rank 0's rendezvous store (`dist.shared_add`): no collective, so a
rank that finishes early takes the next piece and none waits for another in a collective (NCCL's times out after
30 minutes, while one finetuning takes hours). Which piece a rank runs comes from the store, one source for all
ranks; what a piece does decides no collective.

    claim      the next piece, unless the queue is stopped, a stop signal reached this rank, or one reached another
               rank (a key in the store every rank polls)
    run        `do(i, halted)`: done, failed (counted; the rank takes the next) or stopped (a stop reached it);
               an exception means this rank cannot go on: no rank takes another piece
    report     after every rank has left the queue (`drain`: polling the store, not a collective), one all-reduce of
               what happened: a stop anywhere raises `Stopped` on every rank (exit 75: the same command resumes),
               a rank that broke raises its error there and `OtherRankFailed` on the others
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from ...config import ConfigError
from . import dist, stop
from .dist import OtherRankFailed


class RankLost(OtherRankFailed):
    """A rank stopped answering while the others waited for it to finish its jobs."""


BEAT_S = 30.0
"""How often a rank that holds a queue tells the others it is alive (a thread: its work may hold it for long)."""
SILENT_S = 600.0
"""A rank that has not done so for this long is gone (its node lost): the ranks waiting for it stop waiting."""


class Queue:
    """Jobs 0..n-1, taken one at a time by the ranks of a launch from counters in rank 0's store
    (`dist.shared_add`, no collective): a rank that finishes early takes the next job, and no rank waits in a
    collective while another works. `stop`: no rank takes another (a failure that dooms the rest). Outside a
    process group (a world of one in the driver) the counters are this object's own."""

    made = itertools.count()  # every rank makes the same queues in the same order: their keys agree

    def __init__(self, name: str, n: int):
        self.key, self.n, self.own = f"mm_ds/queue/{name}.{next(Queue.made)}", n, {}
        self.beating: threading.Event | None = None

    def _add(self, what: str, amount: int = 1) -> int:
        if dist.is_initialized():
            return dist.shared_add(f"{self.key}/{what}", amount)
        self.own[what] = self.own.get(what, 0) + amount
        return self.own[what]

    def claim(self) -> int | None:
        if self.beating is None and dist.is_initialized():
            self.beating = threading.Event()
            threading.Thread(target=self._beat, args=(dist.rank(),), daemon=True, name="mm-ds queue").start()
        if self._add("stop", 0):
            return None
        i = self._add("next") - 1
        return i if i < self.n else None

    def _beat(self, rank: int) -> None:
        try:
            while not self.beating.wait(BEAT_S):
                self._add(f"beat{rank}")
        except Exception:  # noqa: BLE001  the store is gone: the launch is ending
            return

    def stop(self) -> None:
        self._add("stop")

    def drain(self, every_s: float = 1.0) -> None:
        """After this rank's last job: wait until every rank has left the queue, polling the store (a collective
        here could wait hours for the last long run and time out); a rank silent for SILENT_S is taken for lost."""
        rank, world = dist.rank(), dist.world_size()
        if self.beating is not None:
            self.beating.set()
        self._add(f"left{rank}")
        self._add("left")
        heard: dict[int, tuple[int, float]] = {}
        checked = time.monotonic()
        while self._add("left", 0) < world:
            time.sleep(every_s)
            if time.monotonic() - checked < BEAT_S:
                continue
            checked = time.monotonic()
            for r in (r for r in range(world) if not self._add(f"left{r}", 0)):
                beat = self._add(f"beat{r}", 0)
                if heard.get(r, (None,))[0] != beat:
                    heard[r] = (beat, checked)
                elif checked - heard[r][1] > SILENT_S:
                    raise RankLost(f"rank {r} has not been heard of for {SILENT_S:.0f} s (its node lost?); the "
                                     f"runs it had are resumed by the next `mm-ds run`")


DONE, FAILED, STOPPED = "done", "failed", "stopped"
"""What one piece of a queue came to (`serve`'s `do`)."""


def serve(name: str, n: int, do: Callable[[int, Callable[[], bool]], str], what: str = "piece") -> dict[str, int]:
    """Every rank of a launch (or this process alone): claim pieces 0..n-1 of the queue `name`, run each with
    `do(i, halted)` (`halted()`: a stop reached another rank), report (see the module). Returns what the pieces came
    to, summed over the ranks: {done, failed}; `what` names a piece in the messages. Raises `stop.Stopped` after a
    stop, this rank's error or `OtherRankFailed` after a rank broke."""
    queue, rank = Queue(name, n), dist.rank()
    halt, count, error = f"{queue.key}/stop-signal", {DONE: 0, FAILED: 0, STOPPED: 0}, None

    def halted() -> bool:
        return dist.is_initialized() and dist.shared_add(halt, 0) > 0

    try:
        with stop.handling():  # a stop signal only sets a flag: the piece in hand ends as `do` decides
            while not (count[STOPPED] or stop.requested() or halted()) and (i := queue.claim()) is not None:
                state = do(i, halted)
                count[state] += 1
                if state == STOPPED and dist.is_initialized():
                    dist.shared_add(halt)  # every rank passes the stop on to what it runs
    except Exception as e:  # noqa: BLE001  this rank cannot go on; raised below, once no rank works on
        queue.stop()
        error = ConfigError(f"rank {rank}: {type(e).__name__}: {e}")
        error.__cause__ = e
    queue.drain()
    done, failed, broken, stopped, signalled = (int(x) for x in dist.all_reduce(
        [count[DONE], count[FAILED], error is not None, count[STOPPED], stop.requested() is not None]))
    if stopped or signalled:  # what was in hand saved or is redone; the same command resumes the rest
        seen = stop.requested()
        said = f"{name} stopped: {stopped} {what}(s) stopped, {failed} failed, {done} done"
        raise stop.Stopped(seen.name if seen else None, said)
    if error is not None:
        raise error
    if broken:
        raise OtherRankFailed(f"rank {rank} stopped: another rank failed in {name} (its output says why)")
    return {DONE: done, FAILED: failed}

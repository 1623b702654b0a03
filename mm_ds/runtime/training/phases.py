"""Multi-depth Step 2 (paper §7): which mini-model depth each update of Step 2 runs at.

A multi-depth MINIJOINT mini-model holds the mini-models of several depths over one embedding table; Step 2
trains the target embeddings over the shallowest first, then the deeper ones, the table carried over. Two
schedules (mm_ds.config.MiniConfig):

    fixed shares   mini.depth_shares=[1, 1, 2]: depth i gets share_i / sum of the updates (empty: equal; 0 skips
                   a depth). The phase of an update is a function of its step alone.
    plateau        mini.plateau_window=W, mini.plateau_delta=X: move to the next depth once the best target MLM
                   loss of the last W updates is not X below the best before them (in this phase); the
                   deepest depth runs to the end. Losses are read at log and checkpoint updates (every
                   train.log_every): a switch takes effect after the read that found the plateau.

The state (`state_dict`) goes into every checkpoint, so a resumed run switches where the uninterrupted one did.
"""

from __future__ import annotations

from typing import Callable


class DepthSchedule:
    def __init__(self, depths: tuple[int, ...], steps: int, shares: list[float] = (), window: int = 0,
                 delta: float = 0.0):
        if list(depths) != sorted(set(depths)) or not depths:
            raise ValueError(f"depths {depths} must be distinct and ascending")
        if shares and len(shares) != len(depths):
            raise ValueError(f"mini.depth_shares={list(shares)} has {len(shares)} entries for the {len(depths)} "
                             f"depths {list(depths)} of this mini-model; give one share per depth, shallowest first")
        self.depths, self.steps, self.window, self.delta = tuple(depths), steps, window, delta
        shares = list(shares) or [1.0] * len(depths)
        total, acc, self.ends = sum(shares), 0.0, []
        for s in shares:  # the step each fixed phase ends before
            acc += s
            self.ends.append(round(steps * acc / total))
        self.ends[-1] = steps  # whatever the rounding
        self.starts = [0]  # plateau: the step each phase entered so far began at
        self.best, self.recent = float("inf"), []

    @property
    def plateau(self) -> bool:
        return self.window > 0

    def phase_for(self, step: int) -> int:
        """Index into `depths` of update `step` (0-based). Plateau: the current phase (steps run in order)."""
        if self.plateau:
            return len(self.starts) - 1
        return next((i for i, end in enumerate(self.ends) if step < end), len(self.depths) - 1)

    def depth_for(self, step: int) -> int:
        return self.depths[self.phase_for(step)]

    def observe(self, settled, end: int) -> None:
        """The updates `settled` (mm_ds.runtime.training.train_log.Settled: steps, mean losses, skips; the same on every
        rank) ran, the last of them update `end` - 1: maybe switch (plateau). The loop reads losses only at log and
        checkpoint updates (a read on the host waits for the device), so a plateau found at an earlier update
        of the batch takes effect at `end`; the rest of the batch belongs to the old phase and is not observed."""
        if not self.plateau or len(self.starts) == len(self.depths):
            return
        for step, loss, skipped in zip(settled.steps, settled.losses, settled.skipped):
            if skipped:
                continue
            self.recent.append(loss)
            if len(self.recent) <= self.window:
                continue
            self.best = min(self.best, self.recent.pop(0))  # the best before the window
            if min(self.recent) > self.best - self.delta:
                self.starts.append(end)
                self.best, self.recent = float("inf"), []
                return

    def phases_until(self, step: int) -> list[tuple[int, int, int]]:
        """(depth, first step, end step) of the phases of updates [0, step), empty phases left out."""
        if self.plateau:
            bounds = [min(a, step) for a in self.starts] + [step]
        else:
            bounds = [0] + [min(e, step) for e in self.ends[:-1]] + [step]
        return [(d, a, b) for d, a, b in zip(self.depths, bounds, bounds[1:]) if b > a]

    def flops_until(self, step: int, per_update: Callable[[int], float]) -> float:
        """FLOPs of updates [0, step): each phase at its own depth (`per_update(depth)`, formula A3)."""
        return sum(per_update(d) * (b - a) for d, a, b in self.phases_until(step))

    def state_dict(self) -> dict:
        return {"depths": list(self.depths), "starts": list(self.starts), "best": self.best,
                "recent": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        if list(state["depths"]) != list(self.depths):
            raise ValueError(f"the checkpoint's depth schedule runs over depths {state['depths']}, this stage's "
                             f"over {list(self.depths)}: resume with the configuration it was written with")
        self.starts, self.best, self.recent = list(state["starts"]), state["best"], list(state["recent"])


def schedule_for(depths: tuple[int, ...], steps: int, mini) -> DepthSchedule | None:
    """The schedule of a Step 2 over a model with heads after `depths` (ascending; the last is its top), from
    `mini` (MiniConfig): None for one depth. ValueError names the mini.* key that does not fit."""
    if len(depths) == 1:
        if mini.depth_shares or mini.plateau_window:
            raise ValueError("mini.depth_shares / mini.plateau_window schedule the depths of a multi-depth "
                             "mini-model (system=minijoint@1+2+4), but this Step 2 runs over a model with one "
                             "head; drop them")
        return None
    return DepthSchedule(depths, steps, mini.depth_shares, mini.plateau_window, mini.plateau_delta)

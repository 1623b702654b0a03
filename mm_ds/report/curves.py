"""A curve (one system's scores per Step-2 checkpoint for a task and language) and when it first reaches a
target (§3): the first checkpoint scoring >= target, linearly interpolated (step, FLOPs, days) from the checkpoint
before it; the bounds are those two checkpoints (Table A4). A curve that dips below the target again keeps its
first crossing."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from statistics import mean
from typing import Iterable, Sequence

from .records import Result


@dataclass(frozen=True)
class Point:
    step: float
    flops: float
    v100_days: float


@dataclass(frozen=True)
class Crossing:
    """When a curve first reaches `target`; estimate None means never."""
    target: float
    estimate: Point | None
    lower: Point | None = None  # last checkpoint below the target (step 0 if the first checkpoint already hits)
    upper: Point | None = None  # first checkpoint at or above it

    @property
    def reached(self) -> bool:
        return self.estimate is not None


Key = tuple[str, str, str]  # (task, lang, system)


def group_curves(results: Iterable[Result], warnings: list[str]) -> dict[Key, list[Result]]:
    """Step-sorted curve per (task, lang, system); repeated steps are averaged, with a warning."""
    by_step: dict[Key, dict[int, list[Result]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_step[(r.task, r.lang, r.system)][r.step].append(r)
    curves = {}
    for key, steps in by_step.items():
        curve = []
        for step in sorted(steps):
            rs = steps[step]
            if len(rs) > 1:
                warnings.append(f"{'/'.join(key)} step {step}: {len(rs)} records for one checkpoint; "
                                "averaged them (expected one per checkpoint, already averaged over seeds)")
            curve.append(rs[0] if len(rs) == 1 else Result(
                rs[0].system, rs[0].task, rs[0].lang, step, mean(r.flops for r in rs), mean(r.v100_days for r in rs),
                mean(r.score for r in rs), rs[0].n))
        curves[key] = curve
    return curves


def _point(r: Result) -> Point:
    return Point(r.step, r.flops, r.v100_days)


def time_to_target(curve: Sequence[Result], target: float) -> Crossing:
    pts = sorted(curve, key=lambda r: r.step)
    for i, r in enumerate(pts):
        if r.score >= target or math.isclose(r.score, target, rel_tol=1e-9, abs_tol=1e-12):
            hit = _point(r)
            if i == 0:
                # Nothing was measured before the first checkpoint, so there is nothing to interpolate from:
                # report the first checkpoint itself, bracketed by (step 0, first) as in Table A4's "0.2 (0.0-0.2)".
                return Crossing(target, hit, hit if r.step == 0 else Point(0, 0.0, 0.0), hit)
            prev = pts[i - 1]
            frac = min(max((target - prev.score) / (r.score - prev.score), 0.0), 1.0)
            est = Point(*(a + frac * (b - a) for a, b in zip(
                (prev.step, prev.flops, prev.v100_days), (r.step, r.flops, r.v100_days))))
            return Crossing(target, est, _point(prev), hit)
    return Crossing(target, None)

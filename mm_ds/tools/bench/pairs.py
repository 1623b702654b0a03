"""`mm-ds bench`'s ratio targets, timed in pairs: both sides of a ratio built at once and stepped in turn.

The bench machine's speed drifts even when nothing else runs (three quiet runs of 2026-11-26: matmul probes of
114-196 GFLOP/s within a run, docs/results.md). Timed one after the other, a minute apart, the two sides of a
ratio inherit that drift: Step 1 against transformers read 1.24x, 1.54x and 1.46x in those runs, Step 2's mini
vs full 2.26x, 2.04x and 2.61x. So each ratio target builds both of its sides and alternates their updates,
A B B A A B ..., every update timed to its end: a slow spell of the machine then slows both sides alike, and
neither always goes first after the other's step. The ratio is of the two sides' median step times. Each side gets
one warm-up update more than the stage table's: with one, the first timed update was still the slowest of every side
in three quiet runs (7-40% above the others, 2026-11-26), so the median of three leaned on it. The stage table
beside it keeps each stage timed alone (its memory peak is its own there).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from typing import Callable

from ...runtime.training import compiled
from ...runtime.training import engine as eng
from ...runtime.training.prefetch import Prefetcher
from .peer import PeerSteps, release_free_memory

# target -> (its numerator: an mm-ds bench stage; its denominator: who, and which bench stage)
PAIRS = {
    "a3_speedup": ("adapt_mini", ("mm-ds", "adapt_full")),
    "peer_pretrain": ("pretrain", ("transformers", "pretrain")),
    "peer_adapt_mini": ("adapt_mini", ("transformers", "adapt_mini")),
}

EXTRA_WARMUP = 1  # per side, beyond the preset's (module docstring)
Step = Callable[[int], tuple[float, float, float, float]]  # update -> (wall s, batch s, CPU s, loss)


def alternate(steppers: dict[str, Step], warmup: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """Run `warmup + steps` updates of every stepper, in turn and in alternating order (A B, B A, A B ...);
    per stepper the timed updates' wall, batch and CPU seconds, and every update's loss. One stepper: the
    plain timing loop."""
    names = list(steppers)
    raw = {n: {"step_times": [], "data_times": [], "cpu_times": [], "losses": []} for n in names}
    for step in range(warmup + steps):
        for name in (names if step % 2 == 0 else names[::-1]):
            wall, data, cpu, loss = steppers[name](step)
            raw[name]["losses"].append(loss)
            if step >= warmup:
                raw[name]["step_times"].append(wall)
                raw[name]["data_times"].append(data)
                raw[name]["cpu_times"].append(cpu)
    return raw


class EngineSteps:
    """A bench stage's engine as `engine.train` builds it (`engine.build_engine`); a call runs one
    `engine.train_step`, the function `engine.train` loops over, and times it. On a GPU its batches come as
    `engine.train` gives them, built ahead on a thread and pinned (`Prefetcher`); on CPU the step builds them."""

    def __init__(self, stage: eng.Stage, world: int, rank: int):
        self.stage, self.rank = stage, rank
        self.built = eng.build_engine(stage, world)
        self.built.engine.train()
        self.ahead = None
        if self.built.engine.device.type == "cuda":
            self.ahead = Prefetcher(stage.batches, rank, self.built.geo, 0, stage.cfg.train.steps,
                                    ahead=stage.cfg.data.prefetch, pin=True)

    def __call__(self, step: int) -> tuple[float, float, float, float]:
        """One update: its wall seconds (less any compiling in it: train.compile, as the log rows count), batch
        seconds, CPU seconds and loss."""
        t0, c0, k0 = time.perf_counter(), time.process_time(), compiled.seconds()
        with contextlib.redirect_stdout(sys.stderr) if self.built.compiled else contextlib.nullcontext():
            logs, data, _ = eng.train_step(self.built.engine, self.stage, step, self.rank, self.built.geo,
                                           self.ahead.get if self.ahead else None)  # compile lines: to the log
        loss = float(logs["loss"])  # a host read: the update is timed to its end
        return time.perf_counter() - t0 - (compiled.seconds() - k0), data, time.process_time() - c0, loss

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        if self.built.compiled is not None:
            compiled.release(self.built.engine.module)
        self.built.engine = None


def measure(builder, mcfg, stages: list[str], warmup: int, steps: int, rank: int, world: int, peer_ok: bool,
            log) -> dict:
    """Every ratio target whose sides the run has (`stages`, the peer): per side its median step time and
    tokens/s, and the ratio of the numerator's tokens/s to the denominator's."""
    out, warmup = {}, warmup + EXTRA_WARMUP
    for target, (num, (who, den)) in PAIRS.items():
        if num not in stages or den not in stages or (who == "transformers" and not peer_ok):
            continue
        release_free_memory()
        names = (f"mm-ds {num}", f"{who} {den}")
        log(f"{target}: {names[0]} and {names[1]} in alternating updates ...")
        stage = builder.timed(num, warmup + steps)
        steppers = {names[0]: EngineSteps(stage, world, rank)}
        try:
            if who == "mm-ds":
                steppers[names[1]] = EngineSteps(builder.timed(den, warmup + steps), world, rank)
            else:  # the peer on the same batches, as in the stage table
                steppers[names[1]] = PeerSteps(den, mcfg, stage.cfg.model.num_layers, stage.batches,
                                               builder.micro_batch)
            raw = alternate(steppers, warmup, steps)
        finally:
            for s in steppers.values():
                s.close()
        tokens = builder.micro_batch * builder.seq
        sides = {}
        for name in names:
            t = statistics.median(raw[name]["step_times"])
            sides[name] = {"step_time_s": t, "tokens_per_s": tokens / t, "step_times": raw[name]["step_times"]}
        out[target] = {"sides": sides, "ratio": sides[names[0]]["tokens_per_s"] / sides[names[1]]["tokens_per_s"]}
    return out


def table(pairs: dict) -> str:
    lines = ["ratios, both sides stepped in turn (the targets use these; bench_pairs.py):",
             "| ratio | side | step s (med) | tokens/s | ratio |", "|---|---|---:|---:|---:|"]
    for target, p in pairs.items():
        for i, (name, s) in enumerate(p["sides"].items()):
            first = i == 0
            ratio = f"{p['ratio']:.2f}x" if first else ""
            lines.append(f"| {target if first else ''} | {name} | {s['step_time_s']:.3f} | {s['tokens_per_s']:.0f} "
                         f"| {ratio} |")
    return "\n".join(lines)

"""Fault points: where a test kills a rank, the launcher or a save in progress, makes a loss non-finite, or
dumps the weights a resume loaded. Each point is inert unless its variable is set. This is the one module
that reads these variables, once per process, at import (the ranks inherit them from the job's command):

    MM_DS_KILL_AT=STEP[:RANK]          after update STEP, SIGKILL rank RANK (default 0): a lost node
    MM_DS_KILL_AT=STEP:launcher        after update STEP, rank 0 SIGKILLs its launcher (the `deepspeed`
                                       runner, or `mm-ds` itself for launch.launcher=none)
    MM_DS_KILL_IN_SAVE=STEP[:RANK][:PHASE]  SIGKILL inside checkpoint.save of STEP at PHASE (SAVE_PHASES)
    MM_DS_KILL_STAGE=STAGE             the two above fire only in this stage (pipeline runs)
    MM_DS_NAN_AT=STEP[,STEP...][:RANK[:HEAD]]  make update STEP's loss non-finite on RANK (default: all
                                       ranks); HEAD (e.g. loss_secondary) names the head that "diverged"
    MM_DS_DUMP_RESUMED=PATH            rank 0 saves its weights (torch.save) right after a universal load
    MM_DS_DUMP_FROZEN=DIR              after the last update, rank 0 saves the live module's frozen parameters
                                       as the engine holds them (bf16 under bf16) to DIR/STAGE.SYSTEM.LANG.pt
    MM_DS_TRACE_HASHES=FILE            every file a process hashes (checking a checkpoint or writing its manifest)
                                       is appended to FILE as "RANK PATH": a test counts who reads what
    MM_DS_SIGNAL_AT=STEP:RANK:SIG[:DELAY][,...]  at the boundary after update STEP (the start step: before the
                                       first update of the run, fresh or resumed), rank RANK sends itself SIG (e.g.
                                       SIGTERM), DELAY seconds later from a timer thread (the rank meanwhile goes on,
                                       e.g. into a collective): a stop (mm_ds/runtime/distributed/stop.py)
    MM_DS_SIGNAL_IN_SAVE=STEP:RANK:PHASE:SIG[:DELAY][,...]  the same inside checkpoint.save of STEP (`*`: every
                                       save; `stop`: a save while this process stops, i.e. a second signal)
    MM_DS_SLOW=SECONDS[:STEP[:RANK[:PHASE]]]  sleep SECONDS at the boundary after update STEP (every update when
                                       absent) on RANK (every rank), or at save PHASE: a long update, a late rank

The harness that sets them (seeded faults on tiny runs of every stage kind, the checks after each crash,
bitwise comparison with an uninterrupted run) is tests/fault_harness.py; its full sweep:

    python tests/fault_harness.py --full
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Mapping

SAVE_PHASES = ("after-engine-save", "after-meta", "after-manifest", "before-rename", "before-latest")
"""Points inside checkpoint.save: every rank after DeepSpeed wrote its files; then rank 0 only: after
mm_ds.json, after manifest.json, after verification (before the rename), after the rename (before `latest`)."""


@dataclass(frozen=True)
class Armed:
    """The fault points an environment arms; None: inert."""

    kill_at: tuple[int, int | str] | None = None  # (step, rank or "launcher")
    kill_in_save: tuple[int, int, str] | None = None  # (step, rank, phase)
    stage: str | None = None
    nan_at: tuple[frozenset[int], int | None, str] | None = None  # (steps, rank or all, head)
    dump_resumed: str | None = None
    dump_frozen: str | None = None
    trace_hashes: str | None = None
    signal_at: tuple[tuple[int, int, str, float], ...] = ()  # (step, rank, signal, delay)
    signal_in_save: tuple[tuple[int | str | None, int, str, str, float], ...] = ()  # (step/stop/*, rank, phase, sig, delay)
    slow: tuple[float, int | None, int | None, str | None] | None = None  # (seconds, step, rank, save phase)

    def __bool__(self) -> bool:
        return bool(self.signal_at or self.signal_in_save) or any(v is not None for v in (
            self.kill_at, self.kill_in_save, self.nan_at, self.dump_resumed, self.dump_frozen, self.trace_hashes,
            self.slow))


def read(env: Mapping[str, str]) -> Armed:
    """The fault points armed by `env`. A malformed value raises ValueError naming the variable."""

    def number(var: str, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{var}={env[var]!r}: {text!r} is not a number (forms: mm_ds/runtime/faults.py)") from None

    a = {}
    if spec := env.get("MM_DS_KILL_AT"):
        at, _, who = spec.partition(":")
        a["kill_at"] = (number("MM_DS_KILL_AT", at), who if who == "launcher" else number("MM_DS_KILL_AT", who or "0"))
    if spec := env.get("MM_DS_KILL_IN_SAVE"):
        at, rank, phase = (spec.split(":") + ["", ""])[:3]
        phase = phase or SAVE_PHASES[0]
        if phase not in SAVE_PHASES:
            raise ValueError(f"MM_DS_KILL_IN_SAVE={spec!r}: phase {phase!r} is not one of {', '.join(SAVE_PHASES)}")
        a["kill_in_save"] = (number("MM_DS_KILL_IN_SAVE", at), number("MM_DS_KILL_IN_SAVE", rank or "0"), phase)
    if spec := env.get("MM_DS_NAN_AT"):
        steps, _, rest = spec.partition(":")
        who, _, head = rest.partition(":")
        a["nan_at"] = (frozenset(number("MM_DS_NAN_AT", s) for s in steps.split(",")),
                       number("MM_DS_NAN_AT", who) if who else None, head)
    return Armed(**a, **_stops(env), stage=env.get("MM_DS_KILL_STAGE") or None,
                 dump_resumed=env.get("MM_DS_DUMP_RESUMED") or None,
                 dump_frozen=env.get("MM_DS_DUMP_FROZEN") or None,
                 trace_hashes=env.get("MM_DS_TRACE_HASHES") or None)


def _stops(env: Mapping[str, str]) -> dict:
    """MM_DS_SIGNAL_AT, MM_DS_SIGNAL_IN_SAVE and MM_DS_SLOW (`read`'s)."""

    def signame(var: str, name: str) -> str:
        if not isinstance(getattr(signal, name, None), signal.Signals):
            raise ValueError(f"{var}={env[var]!r}: {name!r} is not a signal name (e.g. SIGTERM)")
        return name

    def fields(var: str, spec: str, n: int) -> list[str]:
        parts = spec.split(":")
        if len(parts) < n:
            raise ValueError(f"{var}={env[var]!r}: expected at least {n} ':'-separated fields (forms: "
                             f"mm_ds/runtime/faults.py)")
        return parts

    def num(var: str, text: str, kind=int):
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"{var}={env[var]!r}: {text!r} is not a number (forms: mm_ds/runtime/faults.py)") from None

    a = {}
    if spec := env.get("MM_DS_SIGNAL_AT"):
        at = [fields("MM_DS_SIGNAL_AT", one, 3) for one in spec.split(",")]
        a["signal_at"] = tuple((num("MM_DS_SIGNAL_AT", p[0]), num("MM_DS_SIGNAL_AT", p[1]),
                                signame("MM_DS_SIGNAL_AT", p[2]), num("MM_DS_SIGNAL_AT", (p + ["0"])[3], float))
                               for p in at)
    for one in filter(None, env.get("MM_DS_SIGNAL_IN_SAVE", "").split(",")):
        p = fields("MM_DS_SIGNAL_IN_SAVE", one, 4)
        if p[2] not in SAVE_PHASES:
            raise ValueError(f"MM_DS_SIGNAL_IN_SAVE={one!r}: phase {p[2]!r} is not one of {', '.join(SAVE_PHASES)}")
        a["signal_in_save"] = a.get("signal_in_save", ()) + ((
            None if p[0] == "*" else p[0] if p[0] == "stop" else num("MM_DS_SIGNAL_IN_SAVE", p[0]),
            num("MM_DS_SIGNAL_IN_SAVE", p[1]), p[2], signame("MM_DS_SIGNAL_IN_SAVE", p[3]),
            num("MM_DS_SIGNAL_IN_SAVE", (p + ["0"])[4], float)),)
    if spec := env.get("MM_DS_SLOW"):
        p = spec.split(":") + ["", "", ""]
        if p[3] and p[3] not in SAVE_PHASES:
            raise ValueError(f"MM_DS_SLOW={spec!r}: phase {p[3]!r} is not one of {', '.join(SAVE_PHASES)}")
        a["slow"] = (num("MM_DS_SLOW", p[0], float), num("MM_DS_SLOW", p[1]) if p[1] else None,
                     num("MM_DS_SLOW", p[2]) if p[2] else None, p[3] or None)
    return a


POINTS = read(os.environ)
ARMED = bool(POINTS)
"""False in every production run: callers on the hot path may skip a point on it."""


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def after_step(step: int, rank: int, stage: str | None = None) -> None:
    """MM_DS_KILL_AT: called by the loop after update `step` (and its checkpoint, if any)."""
    if POINTS.kill_at is None or POINTS.stage not in (None, stage) or step != POINTS.kill_at[0]:
        return
    who = POINTS.kill_at[1]
    if who == "launcher":
        if rank == 0:
            _kill_launcher()
            # Stay put, as a rank busy in a long step would, until the watchdog (mm_ds/runtime/distributed/watchdog.py)
            # stops the rank: its SIGTERM (a stop), or its SIGKILL. Without the pause a tiny run could finish before
            # its look.
            from .distributed import stop  # a stdlib-only leaf: no cycle, and imported only when a test fires
            deadline = time.monotonic() + 60
            while stop.requested() is None and time.monotonic() < deadline:
                time.sleep(0.05)
    elif rank == who:
        _die()


def in_save(step: int, rank: int, phase: str, stage: str | None = None) -> None:
    """MM_DS_KILL_IN_SAVE, MM_DS_SIGNAL_IN_SAVE, MM_DS_SLOW with a phase: called by checkpoint.save at each of
    SAVE_PHASES."""
    if POINTS.stage not in (None, stage):
        return
    if POINTS.kill_in_save == (step, rank, phase):
        _die()
    for at, who, where, name, delay in POINTS.signal_in_save:
        if (who, where) == (rank, phase) and (at in (None, step) or at == "stop" and _stopping()):
            _signal(name, delay)
    if (w := POINTS.slow) and w[3] == phase and w[1] in (None, step) and w[2] in (None, rank):
        time.sleep(w[0])


def at_boundary(step: int, rank: int, stage: str | None = None) -> None:
    """MM_DS_SIGNAL_AT, MM_DS_SLOW: called by the loop after update `step` (0: before the first), before the ranks'
    agreement (mm_ds/runtime/training/boundary.py)."""
    if POINTS.stage not in (None, stage):
        return
    for at, who, name, delay in POINTS.signal_at:
        if (at, who) == (step, rank):
            _signal(name, delay)
    if (w := POINTS.slow) and w[3] is None and w[1] in (None, step) and w[2] in (None, rank):
        time.sleep(w[0])


def _stopping() -> bool:
    from .distributed import stop  # a stdlib-only leaf: no cycle, and imported only when a test's point is armed

    return stop.requested() is not None


def _signal(name: str, delay: float) -> None:
    """This process sends itself `name`, now or `delay` seconds later from a timer thread, and says so (a test
    checks that it arrived)."""

    def send():
        os.write(2, f"[mm-ds fault] pid {os.getpid()} sends itself {name}\n".encode())
        os.kill(os.getpid(), getattr(signal, name))

    if delay <= 0:
        send()
        return
    import threading

    timer = threading.Timer(delay, send)
    timer.daemon = True
    timer.start()


def poison(out: dict, step: int, rank: int) -> dict:
    """MM_DS_NAN_AT: the forward outputs of update `step` (1-based) with a non-finite loss."""
    if POINTS.nan_at is None:
        return out
    steps, who, head = POINTS.nan_at
    if step not in steps or (who is not None and rank != who):
        return out
    out = dict(out)
    nan = float("nan")
    out["loss"] = out["loss"] * nan
    if head and head in out:
        out[head] = out[head] * nan
    return out


def hashing(path, rank: int) -> None:
    """MM_DS_TRACE_HASHES: mm_ds/runtime/checkpointing/sums.py is about to hash `path` on `rank`."""
    if POINTS.trace_hashes:
        with open(POINTS.trace_hashes, "a") as f:
            f.write(f"{rank} {path}\n")


def after_universal_load(engine) -> None:
    """MM_DS_DUMP_RESUMED: rank 0's weights as a universal checkpoint restored them, for a test to compare."""
    if POINTS.dump_resumed and engine.global_rank == 0:
        import torch

        weights = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
        torch.save(weights, POINTS.dump_resumed)


def after_training(engine, name: str) -> None:
    """MM_DS_DUMP_FROZEN: the frozen parameters the engine trained beside, for a test to compare with the parent's
    (final/ cannot show them: it is written from the fp32 copy in frozen/). Every rank calls it: under ZeRO 3
    the parameters are gathered first."""
    if not POINTS.dump_frozen:
        return
    import deepspeed
    import torch

    frozen = [(k, p) for k, p in engine.module.named_parameters() if not p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in frozen],
                                           enabled=bool(frozen) and engine.zero_optimization_partition_weights()):
        if engine.global_rank == 0:
            os.makedirs(POINTS.dump_frozen, exist_ok=True)
            torch.save({k: p.detach().cpu().clone() for k, p in frozen}, os.path.join(POINTS.dump_frozen, f"{name}.pt"))


def _kill_launcher() -> None:
    """SIGKILL the `deepspeed` runner above this rank (else the outermost launcher process): what a killed
    job or a lost login does. The ranks must then go too (mm_ds.runtime.distributed.watchdog)."""
    from .distributed.watchdog import launcher_chain  # a stdlib-only leaf: no cycle, and imported only when a test fires

    chain = launcher_chain(os.getpid())
    runner = [pid for pid, _, cmd in chain if "bin/deepspeed" in cmd]
    if runner or chain:
        os.kill(runner[0] if runner else chain[-1][0], signal.SIGKILL)
    else:  # no launcher: this process is the job
        _die()


if __name__ == "__main__":  # the sweep's old entry point
    sys.exit("the fault sweep moved out of the package: python tests/fault_harness.py [--full]")

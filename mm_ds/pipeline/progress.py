"""What `mm-ds run` shows while it works. The driver process follows the files its stage runs write: a line
when a stage starts and when it ends (with its time and its logs), a compact line now and then while it
trains (step/total, loss, tokens/s, ETA, from the stage's logs/train.jsonl), and evaluation progress (results
written so far). Ranks only write files and their own logs; nothing here talks to them, so it works the same
for one launch per stage and for one job that runs every stage."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime.checkpointing import checkpoint
from ..runtime.checkpointing.rundir import train_log
from ..runtime.distributed import stop
from ..runtime.distributed.launch import process_env
from .evaluation import results_written

INTERVAL_S = 20.0
"""Seconds between two progress lines of one stage: enough to see it move, few enough for a CI log."""


_speaker = "mm-ds run"


@contextlib.contextmanager
def speaking_as(command: str):
    """Within it, `say` names `command`: `mm-ds extend` runs its stages through the pipeline too."""
    global _speaker
    before, _speaker = _speaker, command
    try:
        yield
    finally:
        _speaker = before


def say(msg: str) -> None:
    print(f"[{_speaker}] {msg}", flush=True)


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def last_row(path: Path) -> dict | None:
    """The last complete line of a JSONL file that a rank may be appending to."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def train_line(row: dict) -> str:
    """From a train.jsonl row; its total_steps is the stage's own count (finetuning's comes from epochs)."""
    step, total = int(row["step"]), int(row["total_steps"])
    parts = [f"step {step}/{total}"]
    if "loss" in row:
        parts.append(f"loss {row['loss']:.3f}")
    if row.get("tokens_per_s"):
        parts.append(f"{row['tokens_per_s'] / 1e3:.1f}k tok/s")
    if row.get("step_time_s") and step < total:
        parts.append(f"ETA {clock((total - step) * row['step_time_s'])}")
    return "  ".join(parts)


@dataclass
class Watched:
    name: str
    run_dir: Path
    log: Path
    index: int = 0
    """Its place among the stage runs this `mm-ds run` starts, and their number."""
    of: int = 1
    started: float | None = None
    shown: float = 0.0
    last_step: int = -1


class Follow:
    """Stage runs in the order they will run (one job runs them in order: the first without final/ is the
    one running), and optionally the evaluation's unit list."""

    def __init__(self, stages: list[Watched], eval_spec: Path | None = None, interval_s: float = INTERVAL_S,
                 others: list = ()):
        """`others`: what runs after the stages, before the evaluation, each with a `poll(now)` (a pack of
        single-device runs: mm_ds/pipeline/pack.py Watch)."""
        self.stages, self.eval_spec, self.interval_s, self.others = stages, eval_spec, interval_s, list(others)
        self.current: Watched | None = None
        self.eval_shown, self.eval_done = 0.0, -1
        self.broken = False

    def poll(self, now: float | None = None) -> None:
        """Never raises: what is shown must not stop what runs (a file read mid-write is read next time)."""
        try:
            self._poll(time.monotonic() if now is None else now)
        except Exception as e:  # noqa: BLE001
            if not self.broken:
                say(f"(progress display: {type(e).__name__}: {e}; the run goes on)")
            self.broken = True

    def _poll(self, now: float) -> None:
        running = next((s for s in self.stages if not (s.run_dir / checkpoint.FINAL / checkpoint.MANIFEST).is_file()),
                       None)
        if self.current is not None and running is not self.current:
            self.finished(self.current, now)
        if running is not None and running is not self.current:
            self.start(running, now)
        self.current = running
        if running is not None:
            self.train_progress(running, now)
            return
        for other in self.others:
            other.poll(now)
        if self.eval_spec is not None:
            self.eval_progress(now)

    def start(self, s: Watched, now: float) -> None:
        s.started = now
        say(f"{s.name}: started ({s.index + 1}/{s.of}); its log: {s.log}")

    def finished(self, s: Watched, now: float) -> None:
        took = f" in {clock(now - s.started)}" if s.started is not None else ""
        say(f"{s.name}: done{took}; training log: {train_log(s.run_dir)}")

    def train_progress(self, s: Watched, now: float) -> None:
        row = last_row(train_log(s.run_dir))
        if row is None or "total_steps" not in row or row["step"] == s.last_step or now - s.shown < self.interval_s:
            return
        s.last_step, s.shown = row["step"], now
        say(f"  {s.name}  {train_line(row)}")

    def eval_progress(self, now: float) -> None:
        if now - self.eval_shown < self.interval_s:
            return
        try:
            spec = json.loads(self.eval_spec.read_text())
        except (OSError, ValueError):
            return  # not listed yet (a one-job run lists its units once Step 2 is done)
        done = results_written(spec)
        if done != self.eval_done:
            self.eval_done, self.eval_shown = done, now
            say(f"evaluation: {done}/{len(spec['units'])} units have results")



class StageFailed(RuntimeError):
    """A process `mm-ds run` started failed; the message names its log and shows its last lines."""


def run_logged(cmd: list[str], log: Path, follow: Follow | None = None, env: dict[str, str] | None = None,
               grace_s: float = stop.GRACE_S) -> None:
    """Run `cmd` with all its output (the ranks' and DeepSpeed's) in `log`, in `env` (a launcher's: `launch_env`; by
    default `process_env`); `follow` shows progress meanwhile. It
    runs in a session of its own; a stop signal received here is passed on to it (mm_ds/runtime/distributed/stop.py),
    and once it has ended (its ranks saved, within `grace_s` and a margin) raised here as `stop.Stopped`, as is its own
    exit code stop.EXIT_CODE (a signal that reached the ranks only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = process_env() if env is None else env
    with open(log, "a") as f, stop.forwarding():
        start = f.tell()  # the log keeps earlier attempts: only this one's lines are shown
        proc = stop.start_child(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            rc = stop.wait_child(proc, grace_s, (follow or Follow([])).poll, every_s=1.0)
        except BaseException:  # an error of ours: the launcher and its ranks stop with us
            proc.terminate()
            proc.wait()
            raise
    if rc == stop.EXIT_CODE:
        seen = stop.requested()
        raise stop.Stopped(seen.name if seen else None, f"stopped by {seen.name if seen else 'a signal to its ranks'}"
                                                         f"; its output is in {log}")
    if proc.returncode != 0:
        raise failure_of(f"`{' '.join(cmd)}`", proc.returncode, log, start)


def failure_of(what: str, code: int, log: Path, offset: int) -> StageFailed:
    """`what` failed with `code`: the log, its last lines from `offset` (this attempt's), and what to do."""
    with open(log, errors="replace") as f:
        f.seek(offset)
        lines = f.read().splitlines(keepends=True)
    # A rank's error (cli.main's one line) before the last lines: many ranks' launcher lines can push it out.
    errors = [line for line in lines[:-15] if " error: " in line and "mm-ds " in line][-3:]
    shown = "".join(errors + (["...\n"] if errors else []) + lines[-15:])
    return StageFailed(f"{what} failed with exit code {code}; its output is in {log}:\n{shown}\nFix the cause and "
                       f"re-run the same `mm-ds run` command: finished stage runs are skipped and interrupted ones "
                       f"resume")

"""One job format and one executor: a job is a list of typed work items that the ranks of one launch run in order.

    Training     a data-parallel stage run (mm_ds/stages/resolve.py `StageRun`): rank 0 resolves it when it is
                 reached (its parent has only just been trained), then every rank trains it from its run directory
                 (mm_ds/stages/runner.py); skipped when its final/ verifies
    Pack         single-device stage runs, several at once on the launch's devices (mm_ds/pipeline/pack.py)
    Evaluation   Step 4's units (mm_ds/pipeline/evaluation.py)
    Alignment    the alignment check's Step-2 runs (mm_ds/eval/align_spread.py)

The last three share one rank-side queue loop (mm_ds/runtime/distributed/jobs.py `serve`: claim, run, report, stop on
any rank's failure or stop signal). A job is written as JSON (`write`) and run by `mm_ds/rank.py JOB.json` on every
rank (`execute`). `mm-ds run` decides in one place (pipeline/run.py `launch_items`) whether its items run in one
launch (`mode: one_job`) or each in a launch of its own (`per_stage`, where a stage run is resolved by `mm-ds run`
itself and its ranks start from the run directory).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import typing
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..eval.align_spread import Alignment, run_alignment
from ..runtime.checkpointing import checkpoint
from ..runtime.distributed import dist, stop
from ..stages.resolve import StageRun, resolve
from ..stages.runner import train_run
from .evaluation import Evaluation, run_evaluation
from .pack import Pack, complete, run_pack

FORMAT = "mm-ds-job/1"


@dataclass(frozen=True)
class Training:
    """The work item of one data-parallel stage run."""
    run: StageRun


KINDS = {"stage": Training, "pack": Pack, "evaluation": Evaluation, "alignment": Alignment}
"""A work item's kind, as the job file names it -> its type."""


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return str(value) if isinstance(value, Path) else value


def _typed(cls, data: dict):
    """`cls` from its JSON: Paths, tuples and nested dataclasses as its fields declare them."""
    hints = typing.get_type_hints(cls)

    def as_type(value, hint):
        origin = typing.get_origin(hint)
        if dataclasses.is_dataclass(hint):
            return _typed(hint, value)
        if hint is Path:
            return Path(value)
        if origin is tuple and isinstance(value, list):
            inner = typing.get_args(hint)[0]
            return tuple(as_type(v, inner) for v in value)
        return value

    return cls(**{k: as_type(v, hints[k]) for k, v in data.items()})


def write(path: Path, items: list) -> Path:
    """A job file of `items` (work items, in the order the ranks run them)."""
    kinds = {cls: kind for kind, cls in KINDS.items()}
    job = {"format": FORMAT, "items": [{"kind": kinds[type(i)], **_plain(i)} for i in items]}
    with checkpoint.writing(path, then="re-run the same command"):
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_json_atomic(path, job)
    return path


def read(path: Path) -> list:
    """The work items of a job file."""
    try:
        job = json.loads(Path(path).read_text())
        if job.get("format") != FORMAT:
            raise ValueError(f"format {job.get('format')!r}, expected {FORMAT!r}")
        return [_typed(KINDS[item.pop("kind")], item) for item in job["items"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a job file mm-ds wrote ({type(e).__name__}: {e}); re-run the same "
                          f"`mm-ds run` command") from None


def is_job(path: str | Path) -> bool:
    """`path` names a job file (what `mm_ds/rank.py` is given, besides a run directory)."""
    try:
        return json.loads(Path(path).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def execute(path: str | Path) -> int:
    """Every rank of a launch: the job's items in order. Rank 0 reads the job for all (it decides every
    collective that follows); a stop signal between two items starts no other."""
    dist.init()
    items = dist.on_rank0(lambda: read(path), f"reading {path}")
    for item in items:
        if dist.any_rank(stop.requested() is not None):  # a stop while the last one published: start no other
            name = stop.requested().name if stop.requested() else None
            raise stop.Stopped(name, f"[mm-ds] stopped by {name or 'a stop signal on another rank'} between two "
                                     f"steps; resume with: the same `mm-ds run` command")
        RUN[type(item)](item)
        gc.collect()
    return 0


def run_training(item: Training) -> None:
    """Every rank: a stage run that is not complete, resolved by rank 0 now and trained from its run directory."""
    run = item.run
    # Rank 0 decides for all: a rank that looked for itself could see a stage that rank 0 has just finished alone
    # (an extraction) as complete, skip its barrier, and deadlock the job.
    done, resume = dist.on_rank0(lambda: state(run.out), f"looking at {run.out}")
    if done:
        return
    print(f"[mm-ds run] stage: mm-ds {' '.join(run.argv + (['--resume'] if resume else []))}", flush=True)
    dist.on_rank0(lambda: resolve(run, resume, launching=False, world=dist.world_size(),
                                  resume_with="the same `mm-ds run` command"), f"resolving the stage run {run.out}")
    train_run(run.out)


def state(run_dir: Path) -> tuple[bool, bool]:
    """(complete, has checkpoints) of a stage's run directory."""
    try:
        return complete(run_dir), bool(checkpoint.list_checkpoints(run_dir))
    except OSError as e:
        raise checkpoint.CheckpointError(f"cannot read {run_dir} ({type(e).__name__}: {e}); make the run tree "
                                         f"readable on rank 0's node, then re-run the same command") from e


RUN = {Training: run_training, Pack: run_pack, Evaluation: lambda item: run_evaluation(item), Alignment: run_alignment}
"""What every rank does with a work item of each type."""

"""Step 4 for a recipe: its evaluation units, each unit's result kept under OUT/eval/ by its inputs, and the queue the
ranks of a launch share. One unit is scored by mm_ds/eval/transfer.py; this module decides which, where and when.

At the paper's scale that is 4 systems x 14 languages x ~29 checkpoints x 5 seeds over four test sets, so the work
is cut into independent units (one checkpoint, or the source language, or a control, with all its seeds) that the
ranks of a launch share, each on its rank's device: they take pieces one at a time from a queue
(mm_ds/runtime/distributed/jobs.py `serve`), a piece being the units that swap in one Step-2 checkpoint (one per task,
and its control), which is read and hashed once for all of them. A unit's result is a file under OUT/eval/ keyed by a
fingerprint of its inputs (manifests of the checkpoints, the task file) and of how it was scored (device type and
precision: bf16 autocast on GPUs, fp32 on CPU): an interrupted evaluation resumes, a finished one is not redone,
and a result scored on another kind of device is scored again, so that one table never mixes precisions.

The work item (`Evaluation`) holds the unit groups (`units_for`'s arguments: a task, a language, a primary model's
finetuned models, a Step-2 run), not the units: which checkpoints a Step-2 run has is read when the item runs
(in a one-job run, after Step 2 wrote them), by rank 0 for every rank.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import ConfigError
from ..data.tasks import find_local, get_task, hub_source, is_hub
from ..eval.transfer import Unit, run_unit, scored_with, units_for
from ..runtime.checkpointing import checkpoint
from ..runtime.distributed import dist
from ..runtime.distributed.jobs import DONE, serve


@dataclass(frozen=True)
class Evaluation:
    """The work item of Step 4 (mm_ds/pipeline/jobs.py): its unit groups, the task data, where results go."""
    data_root: str
    results: str
    """OUT/eval/: one file per unit."""
    groups: tuple[dict, ...]
    """Keyword arguments of `eval.transfer.units_for`, in order."""
    progress: str = ""
    """Where the units are listed once known (OUT/logs/eval-units.json), for `mm-ds run` to follow."""


PROGRESS = "eval-units.json"
"""Beside the job files (OUT/logs/): an evaluation's units, once listed, for `mm-ds run` to follow."""


def expand(groups) -> list[Unit]:
    """The units of `groups` (a Step-2 run's checkpoints as they are now)."""
    return [u for g in groups for u in units_for(**g)]


# ---------------------------------------------------------------- a unit's result, kept by its inputs

def unit_fingerprint(unit: Unit, data_root: str, base: Path, how: str | None) -> str:
    """Changes when any input of the unit changes: the manifests (sha256 of every weight file) of the
    finetuned models and of the Step-2 checkpoint, the task file's size and time (the hub's dataset, config
    and split for data root `hub`), and `how` it is scored (`scored_with`). Paths count relative to `base`
    (the run tree), so a run tree moved elsewhere keeps its results."""
    base = base.resolve()

    def rel(p) -> str:
        p = Path(p).resolve()
        return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)

    fields = asdict(unit) | {"finetuned": [rel(r) for r in unit.finetuned],
                             "adapted": rel(unit.adapted) if unit.adapted else None, "scored_with": how}
    fields["kind"] = fields.pop("condition")  # its name when earlier results were hashed: they stay current
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for run in (*unit.finetuned, *([unit.adapted] if unit.adapted else [])):
        man = checkpoint.manifest_of(run)
        h.update(man.read_bytes() if man.is_file() else b"-")
    spec = get_task(unit.task)
    if is_hub(data_root):  # the hub's name for the split; its revision is the datasets cache's business
        h.update(repr(hub_source(spec, unit.split, unit.lang)).encode())
    else:
        f = find_local(spec, unit.split, unit.lang, data_root)
        h.update(f"{rel(f)}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode())
    return h.hexdigest()


def _result_path(results: Path, unit: Unit) -> Path:
    return results / f"{unit.name}.json"


def _saved(results: Path, unit: Unit, data_root: str) -> dict | None:
    """The unit's result file ({fingerprint, scored_with, rows}) when its inputs are current."""
    try:
        saved = json.loads(_result_path(results, unit).read_text())
        how = saved.get("scored_with")
    except (OSError, ValueError, AttributeError):
        return None
    return saved if saved.get("fingerprint") == unit_fingerprint(unit, data_root, results.parent, how) else None


def cached(results: Path, unit: Unit, data_root: str, how: str) -> list[dict] | None:
    """The unit's rows when its result is current and was scored `how` (`scored_with`); else None."""
    saved = _saved(results, unit, data_root)
    return saved["rows"] if saved is not None and saved["scored_with"] == how else None


def eval_jobs(units: list[Unit]) -> list[list[int]]:
    """What a rank takes at once (`run_units`): the units that swap in the same Step-2 checkpoint (one per task
    covering its language, and the control) together, so that it is read and hashed once; the others alone."""
    jobs: dict = {}
    for i, unit in enumerate(units):
        jobs.setdefault(unit.adapted or i, []).append(i)
    return list(jobs.values())


def run_units(units: list[Unit], data_root: str, results: Path, device="cpu", say=print) -> None:
    """Every unit without a current result, written to results/, scored on this kind of device: under a launch,
    this rank's share, taking pieces (`eval_jobs`) from the queue the ranks share until none is left
    (mm_ds/runtime/distributed/jobs.py `serve`: a failure stops every rank from taking more and is raised once all stopped)."""
    jobs, how = eval_jobs(units), scored_with(device)
    rank, world, t0, last = dist.rank(), dist.world_size(), time.monotonic(), [0.0]

    def do(j: int, halted) -> str:
        for unit in (units[i] for i in jobs[j]):
            if cached(results, unit, data_root, how) is None:
                rows = run_unit(unit, data_root, device)
                checkpoint.write_json_atomic(_result_path(results, unit), {
                    "fingerprint": unit_fingerprint(unit, data_root, results.parent, how), "scored_with": how,
                    "rows": rows})
        if rank == 0 and time.monotonic() - last[0] > 10:  # progress from the shared files
            last[0] = time.monotonic()
            done = sum(_result_path(results, u).is_file() for u in units)
            say(f"[mm-ds] evaluation: {done}/{len(units)} units done ({world} rank(s)), {last[0] - t0:.0f} s")
        return DONE

    results.mkdir(parents=True, exist_ok=True)
    serve("eval", len(jobs), do)
    if rank == 0:
        say(f"[mm-ds] evaluation: {len(units)} units done ({world} rank(s)), {time.monotonic() - t0:.0f} s")


def collect(units: list[Unit], data_root: str, results: Path) -> list[dict]:
    """Every unit's rows, in unit order; a unit without a current result, or results scored on different
    kinds of device (`scored_with`), are an error naming them."""
    rows, by_how = [], {}
    for unit in units:
        saved = _saved(results, unit, data_root)
        if saved is None:
            raise ConfigError(f"evaluation {unit.name} has no current result in {results}; re-run the same "
                              f"command (finished units are kept)")
        rows += saved["rows"]
        by_how.setdefault(saved["scored_with"], []).append(unit.name)
    if len(by_how) > 1:
        mix = "; ".join(f"{how}: {len(names)} (e.g. {names[0]})" for how, names in by_how.items())
        raise ConfigError(f"the results in {results} were scored on different kinds of device and precision ({mix}), "
                          f"which one table must not mix; re-run the evaluation where the rest should be scored "
                          f"(it scores again whatever another kind of device scored)")
    return rows


# ---------------------------------------------------------------- the work item

def run_evaluation(item: Evaluation, say=print) -> None:
    """Step 4 on every rank of a launch (or in this process, a world of one): rank 0 lists the units (the
    Step-2 runs' checkpoints as they are now) for every rank and into `item.progress`, then each rank scores its
    share on its device."""
    def listed() -> list[Unit]:
        units = expand(item.groups)
        if item.progress:
            path = Path(item.progress)
            with checkpoint.writing(path, then="re-run the same command"):
                path.parent.mkdir(parents=True, exist_ok=True)
                checkpoint.write_json_atomic(path, {"results": item.results, "units": [asdict(u) for u in units]})
        return units

    units = dist.on_rank0(listed, f"listing the evaluation units into {item.progress or 'memory'}")
    device = dist.device() if dist.is_initialized() else default_device()
    if dist.rank() == 0:
        say(f"[mm-ds] evaluation: {len(units)} units on {dist.world_size()} rank(s), {scored_with(device)}")
    run_units(units, item.data_root, Path(item.results), device, say=say)


def default_device() -> str:
    """The device this process scores on outside a launch: a GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def units_from_progress(spec: dict) -> list[Unit]:
    """The units an evaluation listed (`run_evaluation`'s progress file)."""
    return [Unit(**{**u, "systems": tuple(u["systems"]), "finetuned": tuple(u["finetuned"])}) for u in spec["units"]]


def results_written(spec: dict) -> int:
    """How many units of an evaluation's progress file have a result file (current or not): progress, not
    correctness."""
    return sum(_result_path(Path(spec["results"]), u).is_file() for u in units_from_progress(spec))

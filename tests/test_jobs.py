"""One job format and one rank-side queue loop (mm_ds/pipeline/jobs.py, mm_ds/runtime/distributed/jobs.py `serve`):
every kind of work item survives its file; the loop counts what its pieces came to, stops on a stop signal or a broken
rank, and is the only loop over a queue in the package."""

import ast
import signal
from pathlib import Path

import pytest

from mm_ds.config import ConfigError
from mm_ds.eval.align_spread import Alignment
from mm_ds.pipeline import jobs
from mm_ds.pipeline.evaluation import Evaluation
from mm_ds.pipeline.pack import Pack
from mm_ds.runtime.distributed import stop
from mm_ds.runtime.distributed.jobs import DONE, FAILED, STOPPED, serve
from mm_ds.stages.resolve import StageRun

PACKAGE = Path(__file__).resolve().parents[1] / "mm_ds"


def test_every_kind_of_work_item_comes_back_from_its_file(tmp_path):
    items = [jobs.Training(StageRun("adapt", tmp_path / "adapt", "tiny/adapt", ("lang=t1", "train.steps=3"),
                                    "adapt/bl_base/t1")),
             Pack("step3", ({"name": "a", "out": "A", "argv": ["finetune", "--out", "A"], "log": "a.log"},),
                  str(tmp_path / "step3")),
             Evaluation("world", "eval", ({"task": "xnli", "lang": "t1", "systems": ["bl_base"],
                                           "finetuned": ["ft/seed1"], "split": "test", "adapted": "adapt"},)),
             Alignment((("adapt/bl_base/t1", "adapt/minipost/t1"),), {"t1": "held.txt"}, str(tmp_path), 64)]
    path = jobs.write(tmp_path / "logs" / "job.json", items)
    assert jobs.is_job(path) and jobs.read(path) == items
    assert isinstance(jobs.read(path)[0].run.out, Path) and isinstance(jobs.read(path)[0].run.overrides, tuple)
    (tmp_path / "other.json").write_text('{"items": []}')
    assert not jobs.is_job(tmp_path / "other.json")
    with pytest.raises(ConfigError, match="is not a job file mm-ds wrote"):
        jobs.read(tmp_path / "other.json")


def test_the_queue_loop_counts_its_pieces_and_stops_on_a_broken_rank():
    taken = []

    def do(i, halted):
        taken.append(i)
        return FAILED if i == 1 else DONE

    assert serve("t", 3, do) == {DONE: 2, FAILED: 1} and taken == [0, 1, 2]
    taken.clear()

    def broken(i, halted):
        taken.append(i)
        raise RuntimeError("no such file")

    with pytest.raises(ConfigError, match="rank 0: RuntimeError: no such file"):
        serve("t", 3, broken)
    assert taken == [0]  # the queue stopped: no other piece was taken


def test_a_stop_ends_the_queue_loop_with_stopped():
    with pytest.raises(stop.Stopped, match=r"pack stopped: 1 run\(s\) stopped, 0 failed, 1 done"):
        serve("pack", 4, lambda i, halted: STOPPED if i == 1 else DONE, what="run")
    taken = []
    try:
        stop._record(signal.SIGTERM, None)  # a stop signal before the loop: no piece is taken
        with pytest.raises(stop.Stopped, match="t stopped: 0 piece"):
            serve("t", 2, lambda i, halted: taken.append(i) or DONE)
    finally:
        stop.reset()
    assert taken == []


def test_the_queue_loop_is_the_only_one():
    """Nothing but mm_ds/runtime/distributed/jobs.py claims from a queue: Step 3, Step 4 and the alignment check go
    through `serve`."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        if p == PACKAGE / "runtime" / "distributed" / "jobs.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("claim", "drain") or \
                    isinstance(node, ast.Name) and node.id == "Queue":
                found.append(f"{p.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == [], found

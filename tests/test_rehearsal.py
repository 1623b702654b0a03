"""The real-data rehearsal (`make rehearsal`): `mm-ds run tests/rehearsal.yaml` end to end on the public text and
task files in ../shared/data (the English training files made first, tests/support/rehearsal_tasks.py), with the
paper recipe's structure (the four systems, per-stage launches of 2 ranks under the
deepspeed launcher, the paper presets and their bf16 engine config, four tasks over languages with holes in
coverage, two finetuning seeds, training curves). It takes minutes of process start-ups, so `make test`
leaves it out; CI runs it after the suite. It proves the path runs, not that a tiny model transfers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mm_ds.pipeline.recipe import load_recipe
from mm_ds.pipeline.stage_runs import stage_runs
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed.dist import free_port  # not 29500: another run on the machine may hold DeepSpeed's default
from support.rehearsal_tasks import build as build_tasks

pytestmark = pytest.mark.rehearsal
RECIPE = Path(__file__).parent / "rehearsal.yaml"


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, request):
    shared = request.getfixturevalue("shared_data")
    out = tmp_path_factory.mktemp("rehearsal") / "run"
    tasks = out.with_name("tasks")
    build_tasks(shared, tasks)  # what ../shared/data lacks: the English training sets
    sets = [f"data_root={shared}", f"task_root={tasks}", f"launch.master_port={free_port()}"]
    cmd = [sys.executable, "-m", "mm_ds.cli", "run", str(RECIPE), "--out", str(out), *(f"--set={s}" for s in sets)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    print(proc.stdout)  # the results table and report, for the log
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return out, rows, proc.stdout, load_recipe(str(RECIPE), sets)


def test_every_stage_ran_on_its_own_launch_in_bf16(rehearsal):
    out, _, stdout, recipe = rehearsal
    nodes = stage_runs(recipe, out)
    assert len(nodes) == 3 + 2 + 4 * 2 + 3 * 4 * 2 == 37
    for node in nodes:
        log = (out / "logs" / f"{node.name.replace('/', '_')}.log").read_text()
        meta = checkpoint.read_meta(node.out / "final")
        if node.name != "build_mini/build_mini/minijoint":  # extraction: no engine
            assert "zero=1 bf16; optimizer BF16_Optimizer over FusedAdam" in log, node.name
            # Step 3's runs are single-device runs packed onto the launch's ranks (mm_ds/pipeline/pack.py)
            assert (meta["precision"], meta["world_size"]) == ("bf16", 1 if node.packed else 2), node.name
        assert (node.name.split("/", 1)[1] in stdout) if node.packed else (f"$ mm-ds {node.argv[0]}" in stdout), node.name


def test_tasks_are_evaluated_where_they_have_data_and_leave_gaps_elsewhere(rehearsal):
    out, rows, _, recipe = rehearsal
    seen = {(r["task"], r["lang"]) for r in rows}
    assert seen == {("xnli", "en"), ("xnli", "de"), ("xnli", "sw"), ("pawsx", "de"), ("mlqa", "de"),
                    ("xquad", "en"), ("xquad", "de")}
    for r in rows:
        assert r["seeds"] == 2 and len(r["per_seed"]) == 2 and 0.0 <= r["score"] <= 100.0
        assert r["examples"] == min(200, r["examples"]) and r["split"] == ("dev" if r["task"] == "mlqa" else "test")
    steps = sorted({r["step"] for r in rows if r["condition"] == "adapted" and r["system"] == "bl_base"})
    assert steps == [5, 10]  # the curve
    tables = {}  # task -> its Table 2 (head, rows) in results.md
    for block in (out / "results.md").read_text().split("## ")[1:]:
        table = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith("|")]
        tables[block.split(":")[0]] = (table[0], {row[0]: row for row in table[2:]})
    languages = {t: head[3:-1] for t, (head, _) in tables.items()}  # after system and cost, before avg
    assert languages == {"xnli": ["en", "de", "sw"], "pawsx": ["de"], "mlqa": ["de"], "xquad": ["en", "de"]}  # gaps
    head, rows = tables["xnli"]
    assert "(ctrl " in rows["BL_BASE"][head.index("sw")]
    assert "mean over 2 finetuning seeds" in (out / "results.md").read_text()
    assert (out / "report" / "report.json").is_file()


def test_the_english_training_files_are_made_from_what_is_there(rehearsal):
    out, *_ = rehearsal
    made = json.loads((out.with_name("tasks") / "tasks.json").read_text())
    assert set(made["english_training"]) == {"mnli/multinli_1.0_train.jsonl", "squad/train-v1.1.json",
                                             "paws-x/train.en.tsv"}
    squad = json.loads((out.with_name("tasks") / "squad" / "train-v1.1.json").read_text())
    xquad = json.loads((out.with_name("tasks") / "xquad" / "xquad.en.json").read_text())
    contexts = {p["context"] for a in xquad["data"] for p in a["paragraphs"]}
    assert not any(p["context"] in contexts for a in squad["data"] for p in a["paragraphs"])
    assert sum(len(p["qas"]) for a in squad["data"] for p in a["paragraphs"]) == 9380

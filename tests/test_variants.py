"""System variants (§5.2's depth sweeps): names, the stage command lines a recipe makes of them, the refusal of
a stage config whose depth is not its variant's, the sweep tables (Tables 4 and A3, Figure 4), and Table 5
(mini-models finetuned and scored in English), the last three end to end on a miniature `mm-ds run`."""

import json
import subprocess
import sys

import pytest
import yaml

from mm_ds.config import ConfigError
from mm_ds.pipeline.recipe import load_recipe
from mm_ds.pipeline.stage_runs import stage_runs
from mm_ds.report import analyses
from mm_ds.report.records import Result
from mm_ds.report.report import build_report, table2, table3, write_report
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.stages.command import stage_config
from mm_ds.systems import SYSTEMS, SystemNameError, sort_key, system_of


def test_variant_rows_derive_from_their_system():
    j2, p3, multi = system_of("minijoint@2"), system_of("minipost@3"), system_of("minijoint@1+2+4")
    assert (j2.label, j2.primary, j2.base, j2.depths, j2.mini) == ("MINIJOINT@2", "minijoint@2", "minijoint", (2,),
                                                                  "extract")
    assert (p3.label, p3.primary, p3.base, p3.depths, p3.mini) == ("MINIPOST@3", "bl_base", "minipost", (3,), "build")
    assert multi.depths == (1, 2, 4) and multi.label == "MINIJOINT@1+2+4"
    assert j2.overrides("pretrain") == ["model.secondary_head_layer=2"] and j2.overrides("adapt") == []
    assert p3.overrides("build_mini") == ["mini.layers=3"] and p3.overrides("pretrain") == []
    assert system_of("minijoint@02").name == "minijoint@2"
    assert all(system_of(n) is row for n, row in SYSTEMS.items())  # the four rows are themselves
    order = sorted(["minipost@1", "minijoint@4", "bl_base", "minijoint", "minijoint@1+2", "minijoint@2", "bl_small"],
                   key=sort_key)
    assert order == ["bl_base", "bl_small", "minipost@1", "minijoint", "minijoint@2", "minijoint@4", "minijoint@1+2"]


def test_step1b_records_the_mini_model_it_built(tmp_path):
    """A variant's mini-model is cut at its own depth (minijoint@1: 1 layer), not at the preset's mini.layers (2):
    Step 1b's meta says what it built."""
    from dataclasses import asdict

    import torch

    from mm_ds import config
    from mm_ds.config import ModelConfig
    from mm_ds.model.model import RobertaMLM
    from mm_ds.stages import build_mini

    cfg = ModelConfig(vocab_size=40, hidden_size=16, num_layers=3, num_heads=2, ffn_size=32, max_positions=32,
                      secondary_head_layer=1)
    torch.manual_seed(0)
    checkpoint.write_final(tmp_path / "pretrain" / checkpoint.FINAL, RobertaMLM(cfg).state_dict(),
                           {"stage": "pretrain", "system": "minijoint@1", "model": asdict(cfg), "lang": "en",
                            "tokenizer": "spm.model", "format": checkpoint.FORMAT})
    run = config.load("tiny/build_mini", overrides=["system=minijoint@1", f"parent={tmp_path / 'pretrain'}"])
    assert run.mini.layers == 2  # the preset's, for MINIPOST
    stage = build_mini.build(run)
    assert stage.meta["mini_layers"] == stage.model.cfg.num_layers == run.mini.layers == 1


@pytest.mark.parametrize("name,needle", [
    ("bl_small@2", "bl_small has no mini-model depth"), ("minijoint@x", "must be a layer number"),
    ("minijoint@4+2", "ascending"), ("minijoint@0", "positive"), ("minipost@1+2", "only MINIJOINT"),
    ("minijiont@2", "did you mean 'minijoint'"),
])
def test_bad_variant_names_say_why(name, needle):
    with pytest.raises(SystemNameError, match=needle):
        system_of(name)


def test_recipe_stage_runs_carry_each_variants_depth(tmp_path):
    recipe = load_recipe("tiny", ["systems=[bl_base,minijoint@1,minijoint@3,minipost@3]", "english_minis=true",
                                  "seeds=[1]", "tasks=[xnli]", "langs=[t1]",
                                  "overrides.adapt/minijoint=[train.lr=0.002]",
                                  "overrides.adapt/minijoint@3=[train.lr=0.001]"])
    runs = {r.name: r.argv for r in stage_runs(recipe, tmp_path)}
    assert "model.secondary_head_layer=3" in runs["pretrain/pretrain/minijoint@3"]
    assert "--preset" in runs["pretrain/pretrain/minijoint@3"] and "tiny/minijoint" in runs["pretrain/pretrain/minijoint@3"]
    assert "mini.layers=3" in runs["build_mini/build_mini/minipost@3"]
    assert f"parent={tmp_path / 'pretrain' / 'bl_base'}" in runs["build_mini/build_mini/minipost@3"]
    assert "pretrain/pretrain/minipost@3" not in runs  # MINIPOST shares BL_BASE's Step 1
    # a variant takes its system's overrides, then its own (the later key=value wins)
    adapt = runs["adapt/adapt/minijoint@3/t1"]
    assert adapt.index("train.lr=0.002") < adapt.index("train.lr=0.001")
    assert "train.lr=0.001" not in runs["adapt/adapt/minijoint@1/t1"]
    # Table 5: each mini-model is finetuned from its Step 1b run
    mini_ft = runs["finetune/finetune/mini/minipost@3/xnli/seed1"]
    assert f"parent={tmp_path / 'build_mini' / 'minipost@3'}" in mini_ft
    cfg = stage_config(mini_ft[0], mini_ft[1:])[1]
    assert cfg.system == "minipost@3" and cfg.finetune.task == "xnli"


def test_a_stage_config_without_its_variants_depth_is_refused():
    with pytest.raises(ConfigError, match="add model.secondary_head_layer=3"):
        stage_config("pretrain", ["--preset", "tiny/minijoint", "--out", "/tmp/x", "system=minijoint@3"])
    with pytest.raises(ConfigError, match="add mini.layers=1"):
        stage_config("build-mini", ["--preset", "tiny/build_mini", "--out", "/tmp/x", "system=minipost@1",
                                    "parent=/tmp/p"])
    stage_config("pretrain", ["--preset", "tiny/minijoint", "--out", "/tmp/x", "system=minijoint@3",
                              "model.secondary_head_layer=3"])


def _curve(system, lang, scores, task="xnli"):
    return [Result(system, task, lang, step, step * 1e15, step * 0.01, s) for step, s in zip((100, 200, 300), scores)]


def test_sweep_tables_and_figure_from_a_report(tmp_path):
    results = (_curve("BL_BASE", "t1", [50, 80, 90]) + _curve("BL_BASE", "t2", [40, 70, 80])
               + _curve("MINIJOINT@1", "t1", [86, 87, 88]) + _curve("MINIJOINT@1", "t2", [40, 50, 60])
               + _curve("MINIJOINT@2", "t1", [70, 90, 91]) + _curve("MINIJOINT@2", "t2", [60, 77, 79])
               + _curve("BL_SMALL", "t1", [10, 20, 30]) + _curve("BL_SMALL", "t2", [10, 20, 30]))
    report = build_report(results)
    assert report.systems == ["BL_BASE", "BL_SMALL", "MINIJOINT@1", "MINIJOINT@2"]
    assert analyses.sweeps(report) == {"MINIJOINT": ["MINIJOINT@1", "MINIJOINT@2"]}
    text = analyses.sweep_tables(report, table2(report), table3(report))
    table4 = text.split("(Table 4")[1].split("## ")[0]
    # targets: 0.95 * 90 = 85.5 (t1), 0.95 * 80 = 76 (t2); @1 reaches t1 at its first checkpoint, never t2
    assert "| MINIJOINT@1 | 1.0 (0.0-1.0) | ∞ | 1.0* |" in table4
    assert "| MINIJOINT@2 | 1.8 (1.0-2.0) | 1.9 (1.0-2.0) | 1.9 |" in table4  # 1 + 15.5/20 and 1 + 16/17 days
    assert "BL_SMALL" not in text  # not part of the sweep
    assert "| MINIJOINT@1 | 3.0 | 88.0 | 60.0 | 74.0 |" in text.split("(Table A3)")[1]
    written = write_report(report, tmp_path)
    assert tmp_path / "sweep.md" in written and (tmp_path / "sweep_minijoint.png").stat().st_size > 0
    no_sweep = build_report([r for r in results if "@" not in r.system] + _curve("MINIJOINT", "t1", [1, 2, 3]))
    assert analyses.sweeps(no_sweep) == {} and not analyses.write_sweeps(no_sweep, tmp_path / "none", {}, {})


# ---------------------------------------------------------------- end to end, at tiny size

SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64"]
RECIPE = {
    "systems": ["bl_base", "minijoint@1", "minipost@1"],
    "langs": ["t1"], "tasks": ["xnli"], "seeds": [1],
    "world": {"seed": 0, "sentences": 2000, "target_sentences": 1000,
              "task_sizes": {"nli_train": 100, "paws_train": 20, "qa_train": 20, "dev": 20, "test": 40}},
    "prepare": {"vocab_size": 600, "model_type": "bpe"},
    "presets": {"pretrain": "tiny/{system}", "build_mini": "tiny/build_mini", "adapt": "tiny/adapt",
                "finetune": "tiny/finetune"},
    "overrides": {"pretrain": [*SMALL, "model.num_layers=3", "train.steps=6", "train.warmup_steps=2",
                               "train.checkpoint_steps=[]"],
                  "build_mini": ["train.steps=4", "train.warmup_steps=1", "train.checkpoint_steps=[]"],
                  "adapt": ["train.steps=6", "train.warmup_steps=1", "train.checkpoint_steps=[3]"],
                  "finetune": ["finetune.max_train_examples=64"]},
    "launch": {"ranks": 1, "launcher": "none"},
    "mode": "one_job", "curve": True, "english_minis": True,
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    (root / "recipe.yaml").write_text(yaml.safe_dump(RECIPE))
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(root / "recipe.yaml"), "--out",
                           str(root / "run")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return root / "run", proc.stdout


@pytest.mark.ranks
def test_variants_train_with_their_depth(swept):
    out, _ = swept
    meta, _ = checkpoint.load_final(out / "pretrain" / "minijoint@1")
    assert meta["model"]["secondary_head_layer"] == 1
    assert checkpoint.load_final(out / "build_mini" / "minijoint@1")[0]["model"]["num_layers"] == 1
    assert checkpoint.load_final(out / "build_mini" / "minipost@1")[0]["model"]["num_layers"] == 1 + 2
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["system"] for r in rows if r["condition"] == "adapted"} == set(RECIPE["systems"])


@pytest.mark.ranks
def test_sweep_and_english_tables_are_written(swept):
    out, stdout = swept
    sweep = (out / "report" / "sweep.md").read_text()
    assert "MINIJOINT depth sweep" in sweep and "| MINIJOINT@1 |" in sweep and "MINIPOST depth sweep" in sweep
    assert sweep.count("## ") == sweep.count("mean over 1 finetuning seed") == sweep.count("chance 50.0") >= 2  # captioned
    assert (out / "report" / "sweep_minijoint.png").is_file()
    english = (out / "english.md").read_text()
    assert "Table 5" in stdout and english.strip() in stdout
    assert english.startswith("Scores in en. xnli: accuracy (%), mean over 1 finetuning seed; chance 50.0")
    rows = [line for line in english.splitlines() if line.startswith("|")][2:]  # below the caption and the head
    lines = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in rows}
    assert set(lines) == {"BL_BASE", "MINIJOINT@1", "MINIJOINT@1 mini-model", "MINIPOST@1 mini-model"}
    assert [c.strip() for c in lines["MINIJOINT@1 mini-model"][:1]] == ["1"]  # its layers
    assert [c.strip() for c in lines["MINIPOST@1 mini-model"][:1]] == ["3"]
    assert all(c.strip() != "-" for cells in lines.values() for c in cells)


@pytest.mark.ranks
def test_the_alignment_check_is_in_the_report(swept):
    out, stdout = swept
    assert "alignment check and MLM level: " in stdout and "At the MLM level" in stdout
    rows = [json.loads(line) for line in (out / "align.jsonl").read_text().splitlines()]
    systems = ("bl_base", "minijoint@1", "minipost@1")
    assert {(r["system"], r["step"]) for r in rows if r["kind"] == "target"} == {(s, st) for s in systems
                                                                                for st in (0, 3, 6)}
    assert {(r["system"], r["model"]) for r in rows if r["kind"] == "source"} == {
        ("bl_base", "primary"), ("minijoint@1", "primary"), ("minijoint@1", "mini-model"), ("minipost@1", "mini-model")}
    table = (out / "report" / "align.md").read_text()
    assert all(f"| {s.upper()} | t1 |" in table for s in systems) and "unigram" in table
    assert (out / "report" / "align_t1.png").stat().st_size > 0
    mlm = (out / "report" / "mlm" / "tables.md").read_text()  # the report's tables at the MLM level
    assert "## mlm: performance at training completion (Table 2)" in mlm and "## mlm: does BL_BASE beat its" in mlm
    assert (out / "report" / "mlm" / "curves_mlm.png").stat().st_size > 0

"""The whole pipeline: `mm-ds run` on a miniature recipe (all four systems, 2 ranks under the deepspeed
launcher), then bitwise checks on what each stage may and may not change, re-run skipping, and the
pipeline's bad-input errors."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from mm_ds import checkpoint, surgery
from mm_ds.config import ConfigError, model_config_from_dict
from mm_ds.model import LANGUAGE_PARAMS
from mm_ds.pipeline import load_recipe

SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64"]
RECIPE = {
    "systems": ["bl_base", "bl_small", "minijoint", "minipost"],
    "langs": ["t1"],
    "tasks": ["xnli", "xquad"],  # QA windows must fit the tiny model's 128 positions
    "seeds": [1],
    "world": {"seed": 0, "sentences": 3000, "target_sentences": 2000,
              "task_sizes": {"nli_train": 200, "paws_train": 50, "qa_train": 50, "dev": 50, "test": 100}},
    "prepare": {"vocab_size": 800, "model_type": "bpe"},
    "presets": {"pretrain": "tiny/{system}", "build_mini": "tiny/build_mini", "adapt": "tiny/adapt",
                "finetune": "tiny/finetune"},
    "overrides": {
        "pretrain": [*SMALL, "train.steps=12", "train.warmup_steps=2", "train.checkpoint_steps=[6]"],
        "build_mini": ["train.steps=6", "train.warmup_steps=2", "train.checkpoint_steps=[]"],
        "adapt": ["train.steps=8", "train.warmup_steps=2", "train.checkpoint_steps=[4]"],
        "finetune": ["finetune.epochs=1", "finetune.max_train_examples=160"],
    },
    "launch": {"ranks": 2, "launcher": "deepspeed", "master_port": 29710},
    "mode": "one_job",  # one deepspeed launch for all stages; tests/test_pipeline_resume.py runs per_stage
    "curve": True,
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = root / "run"
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return recipe, out, proc.stdout


def weights(run):
    return checkpoint.load_final(run)


def test_all_four_systems_have_results(finished):
    _, out, stdout = finished
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for system in RECIPE["systems"]:
        kinds = {r["kind"] for r in rows if r["system"] == system}
        assert kinds == {"source", "adapted", "control"}, (system, kinds)
        steps = sorted(r["step"] for r in rows
                       if r["system"] == system and r["kind"] == "adapted" and r["task"] == "xnli")
        assert steps == [4, 8]  # the curve: every Step-2 checkpoint
    assert "MINIPOST" in stdout and "ctrl" in stdout
    assert (out / "report" / "report.json").is_file()  # near-maximal performance, speedups, curves


def test_qa_runs_through_every_step(finished):
    _, out, _ = finished
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    qa = [r for r in rows if r["task"] == "xquad"]
    assert {(r["system"], r["kind"]) for r in qa} >= {(s, k) for s in RECIPE["systems"]
                                                       for k in ("source", "adapted", "control")}
    assert all(0.0 <= r["score"] <= 100.0 for r in qa)
    meta, _ = weights(out / "finetune" / "bl_base" / "xquad" / "seed1")
    assert meta["kind"] == "extractive_qa" and meta["train_features"] >= 50


def test_qa_training_windows_fit_the_model(finished):
    from mm_ds.stages.finetune import _train_features

    _, out, _ = finished
    features, _ = _train_features("xquad", str(out / "world"), str(out / "data" / "en" / "spm.model"), 40, None)
    assert all(len(f.input_ids) <= 40 for f in features)
    assert len(features) > RECIPE["world"]["task_sizes"]["qa_train"]  # long contexts take several windows


def test_minipost_step1b_changes_only_the_new_layers(finished):
    _, out, _ = finished
    (pmeta, psd), (mmeta, msd) = weights(out / "pretrain" / "bl_base"), weights(out / "build_mini" / "minipost")
    n = mmeta["mini_layers"]
    mcfg = model_config_from_dict(mmeta["model"])
    assert mcfg.num_layers == n + 2
    _, init = surgery.build_minipost(model_config_from_dict(pmeta["model"]), psd, n, 2, seed=0)
    for k, v in msd.items():
        if k.startswith(tuple(f"layers.{i}." for i in range(n, n + 2))):
            continue
        assert torch.equal(v, init[k]), f"{k} changed in Step 1b"
    assert not torch.equal(msd[f"layers.{n}.ffn.fc1.weight"], init[f"layers.{n}.ffn.fc1.weight"])


def test_minijoint_mini_model_is_the_bottom_of_its_primary(finished):
    _, out, _ = finished
    (pmeta, psd), (mmeta, msd) = weights(out / "pretrain" / "minijoint"), weights(out / "build_mini" / "minijoint")
    surgery.check_compatible(model_config_from_dict(pmeta["model"]), psd, model_config_from_dict(mmeta["model"]), msd)
    assert torch.equal(msd["head.dense.weight"], psd["aux_head.dense.weight"])


@pytest.mark.parametrize("system,parent", [("bl_small", "pretrain/bl_small"), ("minijoint", "build_mini/minijoint"),
                                           ("minipost", "build_mini/minipost")])
def test_step2_changes_only_the_language_group(finished, system, parent):
    _, out, _ = finished
    (_, psd), (ameta, asd) = weights(out / parent), weights(out / "adapt" / system / "t1")
    for k, v in asd.items():
        if k in LANGUAGE_PARAMS:
            assert v.shape[0] == ameta["model"]["vocab_size"]
            continue
        assert torch.equal(v, psd[k]), f"{k} changed in Step 2"
    assert ameta["overlap"]["overlap"] > 0  # numbers and names are shared with English


def test_finetuning_keeps_source_embeddings_frozen(finished):
    _, out, _ = finished
    (_, psd), (fmeta, fsd) = weights(out / "pretrain" / "bl_base"), weights(out / "finetune" / "bl_base" / "xnli" / "seed1")
    assert torch.equal(fsd["embed.tokens.weight"], psd["embed.tokens.weight"])
    assert not torch.equal(fsd["layers.0.ffn.fc1.weight"], psd["layers.0.ffn.fc1.weight"])
    assert fmeta["task"] == "xnli" and fmeta["num_labels"] == 3


def test_rerun_skips_every_finished_stage(finished):
    recipe, out, _ = finished
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out), "--plan"],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    lines = proc.stdout.strip().splitlines()
    assert lines and all(line.startswith("done") for line in lines), proc.stdout


def test_a_run_tree_moved_elsewhere_skips_and_scores_the_same(finished, tmp_path):
    """Checkpoints find their parents and tokenizers relative to themselves: a run tree copied to another
    path, with the original gone and a different working directory, is complete and scores the same."""
    recipe, out, _ = finished
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    hidden = out.with_name(out.name + ".hidden")
    out.rename(hidden)
    try:
        proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(moved)],
                              capture_output=True, text=True, cwd=tmp_path)
    finally:
        hidden.rename(out)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "in one job" not in proc.stdout and "skip adapt/adapt/minipost/t1: complete" in proc.stdout
    assert (moved / "results.jsonl").read_text() == (out / "results.jsonl").read_text()


def test_transfer_refuses_mismatched_inputs(finished):
    from mm_ds.stages.transfer import transfer

    _, out, _ = finished
    root = str(out / "world")
    with pytest.raises(ConfigError, match="finetuned for task 'xnli', not 'pawsx'"):
        transfer("pawsx", "t1", [str(out / "finetune" / "bl_base" / "xnli" / "seed1")], root,
                 str(out / "adapt" / "bl_base" / "t1"))
    with pytest.raises(ConfigError, match="own primary model"):  # MINIJOINT embeddings into BL_BASE's model
        transfer("xnli", "t1", [str(out / "finetune" / "bl_base" / "xnli" / "seed1")], root,
                 str(out / "adapt" / "minijoint" / "t1"))
    with pytest.raises(ConfigError, match="not a Step-2"):
        transfer("xnli", "t1", [str(out / "finetune" / "bl_base" / "xnli" / "seed1")], root,
                 str(out / "pretrain" / "bl_base"))


def test_adapt_refuses_a_parent_of_the_wrong_kind(finished, tmp_path):
    _, out, _ = finished
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "adapt", "--preset", "tiny/adapt", "--out",
                           str(tmp_path / "a"), "system=minijoint", f"parent={out / 'pretrain' / 'minijoint'}",
                           f"data.corpus={out / 'data' / 't1'}"], capture_output=True, text=True)
    assert proc.returncode == 2 and "run build-mini first" in proc.stderr
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("bad,needle", [({"systems": ["bl_huge"]}, "bl_huge"), ({"tasks": ["nerd"]}, "nerd"),
                                        ({"langs": ["zz"]}, "zz"), ({"presets": {}}, "presets.pretrain"),
                                        ({"overrides": {"xquad": []}}, "overrides.xquad names no stage"),
                                        ({"overrides": {"finetune/nerd": []}}, "finetune/nerd")])
def test_recipe_errors(tmp_path, bad, needle):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE | bad))
    with pytest.raises(ConfigError, match=needle):
        load_recipe(str(path))


def test_task_overrides_reach_only_that_tasks_finetuning(tmp_path):
    from mm_ds.pipeline import plan

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE | {"overrides": {"finetune": ["finetune.lr=1e-4"],
                                                           "finetune/xquad": ["finetune.epochs=20"]}}))
    nodes = [n for n in plan(load_recipe(str(path)), tmp_path / "run") if n.name.startswith("finetune/")]
    assert nodes
    for n in nodes:
        qa = "finetune.task=xquad" in n.argv
        assert ("finetune.epochs=20" in n.argv) == qa
        assert "finetune.lr=1e-4" in n.argv
        if qa:  # the task's override comes after the stage's, so it wins
            assert n.argv.index("finetune.epochs=20") > n.argv.index("finetune.lr=1e-4")

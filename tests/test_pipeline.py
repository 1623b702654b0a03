"""The whole pipeline: `mm-ds run` on a miniature recipe (all four systems, 2 ranks under the deepspeed
launcher), then bitwise checks on what each stage may and may not change, re-run skipping, and the
pipeline's bad-input errors.

The engine configs are the shipped bf16 ones (the GPU path: BF16_Optimizer or the ZeRO optimizers over
DeepSpeed's FusedAdam, gradients accumulated in fp32 over 2 micro-steps), ZeRO 1, 2 and 3 spread over the
systems so that every stage kind trains under more than one. So the hand-off checks below hold in mixed
precision: a stage's frozen parameters in final/ are bit for bit its parent's fp32 weights."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from mm_ds.runtime import checkpoint
from mm_ds.model import surgery
from mm_ds.config import ConfigError, model_config_from_dict
from mm_ds.model.model import LANGUAGE_PARAMS
from mm_ds.recipe import load_recipe

SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64"]
MICRO = ["train.micro_batch=8"]  # 32 sequences on 2 ranks: 2 micro-steps, accumulated in fp32
ZERO = [("pretrain", "bl_base", 1), ("pretrain", "bl_small", 2), ("pretrain", "minijoint", 3),
        ("build_mini", "minipost", 2),
        ("adapt", "bl_base", 3), ("adapt", "bl_small", 1), ("adapt", "minijoint", 2), ("adapt", "minipost", 1),
        ("finetune", "bl_base", 2), ("finetune", "bl_small", 3), ("finetune", "minijoint", 1)]
# One run of each stage kind is also resumed from checkpoint k (test_bf16_stages_resume_...); the next checkpoint,
# k + 1, is where the uninterrupted and the resumed runs are compared.
RESUMED = {("pretrain", "minijoint"): 6, ("build_mini", "minipost"): 3, ("adapt", "bl_base"): 4,
           ("finetune", "bl_small"): 2}
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
        "pretrain": [*SMALL, "train.steps=12", "train.warmup_steps=2", "train.checkpoint_steps=[6]", *MICRO],
        "build_mini": ["train.steps=6", "train.warmup_steps=2", "train.checkpoint_steps=[]", *MICRO],
        "adapt": ["train.steps=8", "train.warmup_steps=2", "train.checkpoint_steps=[4]", *MICRO],
        "finetune": ["finetune.epochs=1", "finetune.max_train_examples=160", *MICRO],
        **{f"{stage}/{system}": [f"ds_config=bf16_zero{zero}.json",
                                 *([f"train.checkpoint_steps=[{RESUMED[stage, system]},{RESUMED[stage, system] + 1}]"]
                                   if (stage, system) in RESUMED else [])]
           for stage, system, zero in ZERO},
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
        kinds = {r["condition"] for r in rows if r["system"] == system}
        assert kinds == {"source", "adapted", "control"}, (system, kinds)
        steps = sorted(r["step"] for r in rows
                       if r["system"] == system and r["condition"] == "adapted" and r["task"] == "xnli")
        assert steps == [4, 5, 8] if system == "bl_base" else [4, 8]  # the curve: every Step-2 checkpoint
    assert "MINIPOST" in stdout and "ctrl" in stdout
    # What a person watching sees: each stage start and end, with its log; the results' paths at the end.
    assert "[mm-ds run] pretrain/bl_base: started (1/" in stdout and "[mm-ds run] adapt/minipost/t1: done in" in stdout
    assert f"results: {out / 'results.md'}" in stdout and str(out / "report" / "curves_avg.png") in stdout
    assert "DeepSpeed" not in stdout and "[rank" not in stdout  # the ranks' output is in logs/job.log
    assert (out / "report" / "report.json").is_file()  # near-maximal performance, speedups, curves


def test_every_stage_kind_trained_in_bf16_under_each_zero_stage(finished):
    _, out, _ = finished
    job = (out / "logs" / "job.log").read_text()
    optimizer = {1: "BF16_Optimizer over FusedAdam", 2: "DeepSpeedZeroOptimizer over FusedAdam",
                 3: "DeepSpeedZeroOptimizer_Stage3 over FusedAdam"}
    for stage, system, zero in ZERO:
        run = {"pretrain": f"pretrain/{system}", "build_mini": f"build_mini/{system}",
               "adapt": f"adapt/{system}/t1", "finetune": f"finetune/{system}/xnli/seed1"}[stage]
        world = 1 if stage == "finetune" else 2  # Step 3: single-device runs, two at once on the job's ranks
        meta = json.loads((out / run / "final" / "mm_ds.json").read_text())
        assert (meta["precision"], meta["zero_stage"], meta["world_size"]) == ("bf16", zero, world), run
        log = job if world == 2 else (out / "logs" / f"finetune_{run.replace('/', '_')}.log").read_text()
        assert f"{system}/{stage} lang=" in log and f"zero={zero} bf16; optimizer {optimizer[zero]}" in log
        ds = json.loads((out / run / "ds_config.json").read_text())
        assert ds["data_types"]["grad_accum_dtype"] == "fp32" and ds["gradient_accumulation_steps"] == 4 // world
        weights = checkpoint.load_final(out / run)[1]
        assert all(v.dtype == torch.float32 for v in weights.values()), run
    assert "evaluation: " in job and "units on 2 rank(s)" in job  # Step 4 shared by the job's ranks
    from mm_ds.tools.plan import Cluster, plan_evaluation
    units = json.loads((out / "logs" / "eval.json").read_text())["units"]
    assert plan_evaluation(load_recipe(str(finished[0])), Cluster()).units == len(units)  # `mm-ds plan` counts them


def test_qa_runs_through_every_step(finished):
    _, out, _ = finished
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    qa = [r for r in rows if r["task"] == "xquad"]
    assert {(r["system"], r["condition"]) for r in qa} >= {(s, k) for s in RECIPE["systems"]
                                                       for k in ("source", "adapted", "control")}
    assert all(0.0 <= r["score"] <= 100.0 for r in qa)
    meta, _ = weights(out / "finetune" / "bl_base" / "xquad" / "seed1")
    assert meta["task_type"] == "extractive_qa" and meta["train_features"] >= 50


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
    assert torch.equal(msd["head.dense.weight"], psd["secondary_head.dense.weight"])


@pytest.mark.parametrize("system,parent", [("bl_base", "pretrain/bl_base"), ("bl_small", "pretrain/bl_small"),
                                           ("minijoint", "build_mini/minijoint"), ("minipost", "build_mini/minipost")])
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
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out), "--list-stage-runs"],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    lines = [line for line in proc.stdout.strip().splitlines() if not line.startswith("#")]
    assert lines and all(line.startswith("done") for line in lines), proc.stdout
    n = sum(" finetune " in line for line in lines)  # one per primary model and task (MINIPOST shares BL_BASE's)
    assert n and re.search(rf"Step 3 \(finetune\) +{n} runs, +{n} done; single-device runs, 2 at once", proc.stdout)


def _run_dir(stage: str, system: str) -> str:
    return {"pretrain": f"pretrain/{system}", "build_mini": f"build_mini/{system}", "adapt": f"adapt/{system}/t1",
            "finetune": f"finetune/{system}/xnli/seed1"}[stage]


def test_bf16_stages_resume_from_their_checkpoints_after_a_kill(finished, tmp_path):
    """One run of each stage kind, bf16 under ZeRO 3, 2, 3 and 3 (pretraining, Step 1b, Step 2, finetuning), cut
    back to its checkpoint k as after a crash; `mm-ds run` again, with rank 1 SIGKILLed in Step 2 after its
    checkpoint k + 1; `mm-ds run` once more. At checkpoint k + 1 every resumed run holds the uninterrupted run's
    weights: the engine, the fp32 masters, Adam's moments and step and the LR schedule came back from k.
    Not bitwise: DeepSpeed's CPU Adam keeps beta^t as a running product while it steps and recomputes it
    with pow() after a load, which moves the fp32 masters by an ulp (its GPU FusedAdam recomputes every step)."""
    recipe, out, _ = finished
    copy = tmp_path / "run"
    shutil.copytree(out, copy, symlinks=True)
    for (stage, system), k in RESUMED.items():
        run = copy / _run_dir(stage, system)
        shutil.rmtree(run / "final")
        for ck in checkpoint.list_checkpoints(run):
            if int(ck.name.split("_")[1]) > k:
                shutil.rmtree(ck)
        (run / "checkpoints" / "latest").write_text(checkpoint.tag_for(k))
    cmd = [sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(copy)]
    trace = tmp_path / "hashed.txt"
    killed = subprocess.run(cmd, capture_output=True, text=True, env={
        **os.environ, "MM_DS_KILL_AT": "6:1", "MM_DS_KILL_STAGE": "adapt", "MM_DS_TRACE_HASHES": str(trace)})
    assert killed.returncode != 0
    adapt = copy / _run_dir("adapt", "bl_base")
    assert not (adapt / "final").exists() and checkpoint.latest_tag(adapt) == checkpoint.tag_for(5)
    # One rank hashes on resume: each resume point, and the parent both later stages start from, is read for
    # its sums once, by rank 0 (the other rank takes its verdict), though every rank of the job checks the stage.
    hashed = [line.split(" ", 1) for line in trace.read_text().splitlines()]
    for (stage, system), k in [(s, k) for s, k in RESUMED.items() if s[0] != "finetune"]:
        ckpt = copy / _run_dir(stage, system) / "checkpoints" / checkpoint.tag_for(k)
        files = [str(ckpt / f) for f in json.loads((ckpt / "manifest.json").read_text())["files"]]
        assert len(files) > 2 and all([r for r, p in hashed if p == f] == ["0"] for f in files), (stage, hashed)
    parent = str(copy / "pretrain" / "bl_base" / "final" / "model.safetensors")
    assert [r for r, p in hashed if p == parent] == ["0"], hashed
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    job = (copy / "logs" / "job.log").read_text()
    for (stage, system), k in RESUMED.items():
        run = _run_dir(stage, system)
        resumed_at = 5 if stage == "adapt" else k  # Step 2 was resumed twice: from 4, then after the kill from 5
        log = job if stage != "finetune" else (copy / "logs" / f"finetune_{run.replace('/', '_')}.log").read_text()
        assert f"resumed from {copy / run / 'checkpoints' / checkpoint.tag_for(resumed_at)} at step {resumed_at}" in log
        a = checkpoint.consolidate(out / run / "checkpoints" / checkpoint.tag_for(k + 1))
        b = checkpoint.consolidate(copy / run / "checkpoints" / checkpoint.tag_for(k + 1))
        assert a.keys() == b.keys()
        for key in a:  # an ulp of the masters, where a lost moment, step or master would move them by ~1e-3
            assert torch.allclose(a[key], b[key], rtol=0, atol=1e-6 * float(a[key].abs().max()) + 1e-12), (run, key)
        assert checkpoint.load_final(copy / run)[0]["step"] == checkpoint.load_final(out / run)[0]["step"]


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
    assert "in one job" not in proc.stdout and "skip adapt/minipost/t1: complete" in proc.stdout
    assert (moved / "results.jsonl").read_text() == (out / "results.jsonl").read_text()


def test_transfer_refuses_mismatched_inputs(finished):
    from mm_ds.eval.transfer import transfer

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
    from mm_ds.pipeline.stage_runs import stage_runs

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE | {"overrides": {"finetune": ["finetune.lr=1e-4"],
                                                           "finetune/xquad": ["finetune.epochs=20"]}}))
    nodes = [n for n in stage_runs(load_recipe(str(path)), tmp_path / "run") if n.name.startswith("finetune/")]
    assert nodes
    for n in nodes:
        qa = "finetune.task=xquad" in n.argv
        assert ("finetune.epochs=20" in n.argv) == qa
        assert "finetune.lr=1e-4" in n.argv
        if qa:  # the task's override comes after the stage's, so it wins
            assert n.argv.index("finetune.epochs=20") > n.argv.index("finetune.lr=1e-4")

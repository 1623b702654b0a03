"""`mm-ds run` killed in the middle of a stage: the same command skips what finished, resumes the stage
from its newest complete checkpoint, and never trusts an incomplete output."""

import json
import os
import subprocess
import sys

import yaml

from mm_ds import checkpoint, pipeline

TINY = ["data.seq_len=32", "train.global_batch=16", "train.micro_batch=8", "train.warmup_steps=2",
        "peak_tflops=1", "train.log_every=2"]
RECIPE = {
    "systems": ["bl_small"], "langs": ["t1"], "tasks": ["xnli"], "seeds": [1],
    "world": {"seed": 0, "sentences": 3000, "target_sentences": 1500,
              "task_sizes": {"nli_train": 64, "paws_train": 8, "qa_train": 8, "dev": 8, "test": 16}},
    "prepare": {"vocab_size": 200, "model_type": "bpe"},
    "presets": {"pretrain": "tiny/{system}", "adapt": "tiny/adapt", "finetune": "tiny/finetune"},
    "launch": {"ranks": 1, "launcher": "none"},
    "overrides": {
        # max_positions stays 128: Step-4 evaluation encodes at the task's max_length (128 for xnli)
        "pretrain": ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64",
                     "train.steps=8", "train.checkpoint_steps=[4]", *TINY],
        "adapt": ["train.steps=8", "train.checkpoint_steps=[4]", *TINY],
        "finetune": ["finetune.epochs=1", "finetune.max_length=32", *TINY],
    },
}


def run(recipe, out, env=None):
    return subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_killed_pipeline_resumes_where_it_stopped(tmp_path):
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(RECIPE))
    killed = run(recipe, out, {"MM_DS_KILL_AT": "6", "MM_DS_KILL_STAGE": "adapt"})
    assert killed.returncode != 0 and "adapt" in killed.stderr
    adapt = out / "adapt" / "bl_small" / "t1"
    assert pipeline.complete(out / "pretrain" / "bl_small") and not pipeline.complete(adapt)
    assert checkpoint.latest_tag(adapt) == "step_00000004"
    pretrained = (out / "pretrain" / "bl_small" / "final" / "mm_ds.json").stat().st_mtime_ns

    again = run(recipe, out)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = again.stdout
    assert "skip prepare en: complete" in log and "skip prepare t1: complete" in log
    assert "skip pretrain/pretrain/bl_small: complete" in log
    assert "resume adapt/adapt/bl_small/t1 from step_00000004" in log
    assert "mm-ds finetune" in log and "--resume" not in log.split("mm-ds finetune")[1].split("\n")[0]
    assert (out / "pretrain" / "bl_small" / "final" / "mm_ds.json").stat().st_mtime_ns == pretrained
    stage_log = (out / "logs" / "adapt_adapt_bl_small_t1.log").read_text()
    assert f"resumed from {adapt / 'checkpoints' / 'step_00000004'} at step 4" in stage_log
    assert json.loads((adapt / "final" / "mm_ds.json").read_text())["step"] == 8
    assert (out / "results.md").is_file()

"""`mm-ds run` killed in the middle of a stage, then stopped by SIGTERM: the same command skips what finished, resumes
the stage from its newest complete checkpoint, and never trusts an incomplete output."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from mm_ds.pipeline import run as pipeline
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed.dist import free_port

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


@pytest.mark.ranks
def test_killed_pipeline_resumes_where_it_stopped(tmp_path):
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(RECIPE))
    killed = run(recipe, out, {"MM_DS_KILL_AT": "6", "MM_DS_KILL_STAGE": "adapt"})
    assert killed.returncode != 0 and "adapt" in killed.stderr
    adapt = out / "adapt" / "bl_small" / "t1"
    assert pipeline.complete(out / "pretrain" / "bl_small") and not pipeline.complete(adapt)
    assert checkpoint.latest_tag(adapt) == "step_00000004"
    pretrained = (out / "pretrain" / "bl_small" / "final" / "mm_ds.json").stat().st_mtime_ns

    # SIGTERM to the `mm-ds run` parent at a random time of the resumed stage (updates held 0.4 s): it passes the
    # signal to the stage, which saves where it is; the pipeline stops with exit code 75 and says how to resume.
    stage_log = out / "logs" / "adapt_adapt_bl_small_t1.log"
    proc = subprocess.Popen([sys.executable, "-m", "mm_ds.cli", "run", str(recipe), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "MM_DS_SLOW": "0.4", "MM_DS_KILL_STAGE": "adapt"})
    deadline = time.monotonic() + 300
    while "steps 4->8" not in (stage_log.read_text() if stage_log.is_file() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    time.sleep(random.Random(int(os.environ.get("MM_DS_STOP_SEED", 0))).uniform(0.2, 1.0))
    proc.send_signal(signal.SIGTERM)
    stopped_out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, stopped_out[-3000:]
    at = int(re.search(r"\[mm-ds\] stopped by SIGTERM at update (\d+)", stage_log.read_text())[1])
    assert 5 <= at <= 8 and checkpoint.latest_tag(adapt) == checkpoint.tag_for(at)
    assert (f"[mm-ds run] stopped by SIGTERM: adapt/adapt/bl_small/t1 saved at {checkpoint.tag_for(at)}; its log: "
            f"{stage_log}; resume with: mm-ds run {recipe} --out {out}") in stopped_out, stopped_out[-3000:]

    again = run(recipe, out)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    log = again.stdout
    assert "skip prepare en: complete" in log and "skip prepare t1: complete" in log
    assert "skip pretrain/bl_small: complete" in log
    assert f"resume adapt/adapt/bl_small/t1 from {checkpoint.tag_for(at)}" in log
    finetune_log = (out / "logs" / "finetune_finetune_bl_small_xnli_seed1.log").read_text()
    assert "mm-ds finetune" in finetune_log and "--resume" not in finetune_log  # Step 3 starts afresh, packed
    assert (out / "pretrain" / "bl_small" / "final" / "mm_ds.json").stat().st_mtime_ns == pretrained
    assert f"resumed from {adapt / 'checkpoints' / checkpoint.tag_for(at)} at step {at}" in stage_log.read_text()
    assert json.loads((adapt / "final" / "mm_ds.json").read_text())["step"] == 8
    assert (out / "results.md").is_file()


ONE = ["launch.launcher=none", "launch.ranks=1"]
PACKED = {
    "systems": ["bl_small"], "langs": ["t1"], "tasks": ["xnli", "pawsx"], "seeds": [1, 2],
    "world": {"seed": 0, "sentences": 3000, "target_sentences": 1500,
              "task_sizes": {"nli_train": 96, "paws_train": 32, "qa_train": 8, "dev": 8, "test": 16}},
    "prepare": {"vocab_size": 200, "model_type": "bpe"},
    "presets": {"pretrain": "tiny/{system}", "adapt": "tiny/adapt", "finetune": "tiny/finetune"},
    "launch": {"ranks": 2, "launcher": "deepspeed", "master_port": free_port()},
    "mode": "per_stage",
    "overrides": {  # Steps 1 and 2 in the driver's process (what is tested here is the launch of Steps 3 and 4)
        "pretrain": ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64", "train.steps=4",
                     "train.checkpoint_steps=[]", *TINY, *ONE],
        "adapt": ["train.steps=4", "train.checkpoint_steps=[]", *TINY, *ONE],
        # 96 English NLI pairs are 6 updates of 16, 32 PAWS-X pairs 2: only the NLI runs reach update 3
        "finetune": ["finetune.epochs=1", "finetune.max_length=32", "train.checkpoint_steps=[2]", *TINY],
    },
}


@pytest.mark.ranks
def test_step3_runs_packed_one_per_device_and_a_killed_one_resumes_alone(tmp_path):
    """Step 3 on 2 CPU ranks under the deepspeed launcher: four single-device finetunings (each a world of one),
    two at a time, each on its rank's share of the cores. Both NLI runs are SIGKILLed after update 3 (their
    checkpoint is at 2); the PAWS-X runs finish meanwhile and the failure names the killed runs and their logs.
    The same command then resumes each killed run alone from its checkpoint, leaves the finished ones alone, and
    evaluates on the 2 ranks, sharing the units."""
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(PACKED))
    killed = run(recipe, out, {"MM_DS_KILL_AT": "3", "MM_DS_KILL_STAGE": "finetune"})
    assert killed.returncode != 0
    names = [f"finetune/bl_small/{task}/seed{seed}" for task in ("xnli", "pawsx") for seed in (1, 2)]
    status = {s["name"]: s for s in (json.loads(f.read_text()) for f in (out / "logs" / "step3").glob("*.json"))}
    assert set(status) == set(names) and {s["rank"] for s in status.values()} == {0, 1}  # both ranks took runs
    for name in names[:2]:
        assert status[name]["state"] == "failed" and status[name]["exit_code"] == -9
        assert f"{name}: killed by SIGKILL on rank" in killed.stderr and status[name]["log"] in killed.stderr
        assert checkpoint.latest_tag(out / name) == "step_00000002" and not pipeline.complete(out / name)
    for name in names[2:]:
        assert status[name]["state"] == "done" and pipeline.complete(out / name)
    assert len({s["device"] for s in status.values()}) == 2  # each rank's runs on its own share of the cores
    finished = {n: (out / n / "final" / "mm_ds.json").stat().st_mtime_ns for n in names[2:]}

    again = run(recipe, out)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for name in names[:2]:
        log = (out / "logs" / f"finetune_{name.replace('/', '_')}.log").read_text()
        assert f"resumed from {out / name / 'checkpoints' / 'step_00000002'} at step 2" in log
        assert json.loads((out / name / "final" / "mm_ds.json").read_text())["world_size"] == 1
    assert {n: (out / n / "final" / "mm_ds.json").stat().st_mtime_ns for n in names[2:]} == finished
    assert sorted(json.loads(f.read_text())["name"] for f in (out / "logs" / "step3").glob("*.json")) == names[:2]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(r["task"], r["condition"]) for r in rows} == {(t, k) for t in ("xnli", "pawsx")
                                                     for k in ("source", "adapted", "control")}
    assert all(r["seeds"] == 2 for r in rows)

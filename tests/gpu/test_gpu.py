"""On CUDA GPUs: what no CPU machine can run. `make test-gpu` (or `pytest -m gpu tests/gpu`) on a machine with one or
more GPUs; without CUDA every test here is skipped. The checks that need no GPU live in tests/gpu_checks.py, where
CPU tests (tests/test_gpu_checks.py, tests/test_reduction_dtype.py) show that they can fail.

- 20 updates of BL_BASE pretraining (the paper's shape, shorter sequences) on every local GPU, in bf16
  (BF16_Optimizer) and fp16 (the ZeRO optimizer, loss scaling): NCCL, DeepSpeed's CUDA FusedAdam, loss going
  down, MFU logged against the GPU's peak;
- SDPA: the kernel torch's default dispatcher picks for real MLM batches (their padding masks as the data pipeline
  makes them) in bf16 training is a fused one, and runs forward and backward;
- the whole pipeline in bf16 under ZeRO 1-3 (every stage kind, Step 2 over both mini-models, Step 4 on the GPUs),
  per stage as the paper recipe runs it and as one job: the frozen weights the Step-2 engines held on the GPUs
  (MM_DS_DUMP_FROZEN) are the parent's rounded to bf16, and final/ holds the parent's fp32 ones;
- Step 2 killed and resumed on the GPUs, both ways.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from gpu_checks import attention_calls, frozen_mismatches, fused_attention_problems, sdpa_backend
from mm_ds.runtime import checkpoint
from mm_ds.model.model import LANGUAGE_PARAMS, is_language_param

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA GPUs: run `make test-gpu` on a GPU machine")]
NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mm_ds(*argv, env=None, check=True):
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"mm-ds {' '.join(argv)}\nexit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.mark.parametrize("precision, optimizer", [("bf16", "BF16_Optimizer"), ("fp16", "DeepSpeedZeroOptimizer")])
def test_base_pretraining_with_fused_adam_over_nccl(corpus, tmp_path, precision, optimizer):
    """bf16 (the paper presets) and fp16 (GPUs only: DeepSpeed's CPU accelerator has none; dynamic loss scaling)."""
    out = tmp_path / "bl_base"
    proc = mm_ds("pretrain", "--preset", "paper/bl_base", "--out", str(out), "--no-progress", f"data.corpus={corpus}",
                 "model.vocab_size=null", "data.seq_len=128", "train.steps=20", "train.warmup_steps=2",
                 f"train.global_batch={16 * NGPU}", "train.micro_batch=8", "train.log_every=5",
                 "train.checkpoint_steps=[]", f"ds_config={precision}_zero1.json", f"launch.ranks={NGPU}",
                 f"launch.master_port={port()}")
    log = proc.stdout + proc.stderr
    assert f"world={NGPU} micro=8 accum=2" in log and f"zero=1 {precision}; optimizer {optimizer} over FusedAdam" in log
    assert "backend nccl" in log
    rows = [json.loads(line) for line in (out / "logs" / "train.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    meta = json.loads((out / "final" / "mm_ds.json").read_text())
    assert (meta["precision"], meta["world_size"]) == (precision, NGPU)
    name = torch.cuda.get_device_name()
    if rows[-1]["mfu"] != rows[-1]["mfu"]:  # last: everything above holds whatever the GPU
        pytest.skip(f"MFU is NaN: {name!r} is not in mm_ds/runtime/peaks.py's GPU_PEAK_TFLOPS (set peak_tflops=...)")
    assert 0.0 < rows[-1]["mfu"] < 1.0, rows[-1]


def test_sdpa_default_dispatch_on_real_mlm_batches(corpus):
    """mm_ds/model/model.py's CUDA path is F.scaled_dot_product_attention with the batch's padding mask (key_mask, bool
    (B, 1, 1, T)) and dropout 0.1 in training. Flash attention takes no mask and cuDNN's dropout must be a multiple
    of 1/16, so real batches should get memory-efficient attention, a batch without padding flash attention:
    whatever torch picks, it must not be the math fallback, and the fused kernels must run forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mm_ds import config
    from mm_ds.runtime.ds_config import Geometry
    from mm_ds.stages import pretrain

    cfg = config.load("paper/bl_base", overrides=[f"data.corpus={corpus}", "model.vocab_size=null", "data.seq_len=128",
                                                  "model.num_layers=2"])
    stage = pretrain.build(cfg)
    batch = stage.batches(0, 0, 0, Geometry(16, 16, 1, 1))
    assert batch["attention_mask"] is not None, "real blocks end in padding: a mask must reach the model"
    model = stage.model.cuda().bfloat16().train()  # as the engine holds it under bf16
    padded = {k: v.cuda() for k, v in batch.items()}
    full = padded | {"attention_mask": None}  # as MLMBatches gives a batch whose blocks are all full
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    for inputs in (padded, full):
        with attention_calls() as calls:
            model(**inputs)["loss"].backward()
        assert len(calls) == cfg.model.num_layers and all((c.mask is None) == (inputs is full) for c in calls)
        assert not fused_attention_problems(calls), fused_attention_problems(calls)
        print(f"{'padded' if inputs is padded else 'full'} batch: {sdpa_backend(calls[0]).name}")
        with sdpa_kernel(fused):  # raises if no fused kernel takes these inputs
            model(**inputs)["loss"].backward()


SMALL = ["model.hidden_size=64", "model.num_heads=2", "model.ffn_size=128"]


def _recipe(mode: str) -> dict:
    zero = {("pretrain", "bl_base"): 1, ("pretrain", "bl_small"): 2, ("pretrain", "minijoint"): 3,
            ("build_mini", "minipost"): 2, ("adapt", "bl_base"): 3, ("adapt", "bl_small"): 1,
            ("adapt", "minijoint"): 2, ("adapt", "minipost"): 1, ("finetune", "bl_base"): 2,
            ("finetune", "bl_small"): 3, ("finetune", "minijoint"): 1}
    geometry = [f"train.global_batch={8 * NGPU}", "train.micro_batch=4"]
    return {
        "systems": ["bl_base", "bl_small", "minijoint", "minipost"], "langs": ["t1"], "tasks": ["xnli", "xquad"],
        "seeds": [1], "world": {"seed": 0, "sentences": 3000, "target_sentences": 2000,
                                "task_sizes": {"nli_train": 200, "paws_train": 50, "qa_train": 50, "dev": 50, "test": 100}},
        "prepare": {"vocab_size": 800, "model_type": "bpe"},
        "presets": {"pretrain": "tiny/{system}", "build_mini": "tiny/build_mini", "adapt": "tiny/adapt",
                    "finetune": "tiny/finetune"},
        "overrides": {"pretrain": [*SMALL, "train.steps=12", "train.checkpoint_steps=[6]", *geometry],
                      "build_mini": ["train.steps=6", "train.checkpoint_steps=[]", *geometry],
                      "adapt": ["train.steps=8", "train.checkpoint_steps=[4]", *geometry],
                      "finetune": ["finetune.epochs=1", "finetune.max_train_examples=160", *geometry],
                      **{f"{s}/{y}": [f"ds_config=bf16_zero{z}.json"] for (s, y), z in zero.items()}},
        "launch": {"ranks": NGPU, "launcher": "deepspeed", "master_port": port()}, "mode": mode, "curve": True}


def logs(out: Path) -> str:
    """Every launch's output: logs/job.log for one job, a log per stage (and eval.log) per stage."""
    return "".join(p.read_text() for p in sorted((out / "logs").glob("*.log")))


@pytest.mark.parametrize("mode", ["per_stage", "one_job"])
def test_the_pipeline_in_bf16_on_gpus(tmp_path, mode):
    recipe, out, dumps = tmp_path / "recipe.yaml", tmp_path / "run", tmp_path / "frozen"
    recipe.write_text(yaml.safe_dump(_recipe(mode)))
    mm_ds("run", str(recipe), "--out", str(out), env={"MM_DS_DUMP_FROZEN": str(dumps)})
    text = logs(out)
    assert "backend nccl" in text and "over FusedAdam" in text and f"units on {NGPU} rank(s), cuda" in text
    assert "backend gloo" not in text
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["system"] for r in rows} == {"bl_base", "bl_small", "minijoint", "minipost"}
    for system, parent in (("bl_base", "pretrain/bl_base"), ("minijoint", "build_mini/minijoint"),
                           ("minipost", "build_mini/minipost")):  # ZeRO 3, 2 and 1 (see _recipe)
        _, psd = checkpoint.load_final(out / parent)
        live = torch.load(dumps / f"adapt.{system}.t1.pt")  # the Step-2 engine's own frozen weights, at its end
        assert live and {v.dtype for v in live.values()} == {torch.bfloat16}, system
        problems = frozen_mismatches(live, psd, is_language_param)
        assert not problems, f"{system}: the engine's frozen weights moved: {problems[:4]}"
        meta, asd = checkpoint.load_final(out / "adapt" / system / "t1")  # published from the frozen fp32 copy
        assert meta["precision"] == "bf16"
        changed = [k for k in asd if k not in LANGUAGE_PARAMS and not torch.equal(asd[k], psd[k])]
        assert not changed, f"{system}: final/ does not hold the parent's fp32 frozen weights: {changed[:4]}"


@pytest.mark.parametrize("mode", ["per_stage", "one_job"])
def test_step2_killed_and_resumed_on_gpus(tmp_path, mode):
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(_recipe(mode) | {"systems": ["minijoint"], "tasks": ["xnli"]}))
    killed = mm_ds("run", str(recipe), "--out", str(out), env={"MM_DS_KILL_AT": "6", "MM_DS_KILL_STAGE": "adapt"},
                   check=False)
    assert killed.returncode != 0
    assert checkpoint.latest_tag(out / "adapt" / "minijoint" / "t1") == checkpoint.tag_for(4)
    mm_ds("run", str(recipe), "--out", str(out))
    assert "resumed from" in logs(out)
    assert checkpoint.load_final(out / "adapt" / "minijoint" / "t1")[0]["step"] == 8

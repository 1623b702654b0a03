"""On CUDA GPUs: what no CPU machine can run. `make test-gpu` (or `pytest -m gpu tests/gpu`) on a machine with one or
more GPUs; without CUDA every test here is skipped.

- 20 bf16 updates of BL_BASE pretraining (the paper's shape, shorter sequences) on every local GPU: NCCL,
  BF16_Optimizer over DeepSpeed's CUDA FusedAdam, loss going down, MFU logged against the GPU's peak;
- SDPA's fused kernels (flash attention for packed batches, memory-efficient attention with a padding mask);
- the whole pipeline in bf16 under ZeRO 1-3 (every stage kind, Step 2 over both mini-models, Step 4 on the
  GPUs), with the hand-off checks: frozen parameters in final/ are bit for bit the parent's fp32 weights;
- Step 2 killed and resumed on the GPUs.
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml

from mm_ds import checkpoint
from mm_ds.model import LANGUAGE_PARAMS

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


def test_base_pretraining_in_bf16_with_fused_adam_over_nccl(corpus, tmp_path):
    out = tmp_path / "bl_base"
    proc = mm_ds("pretrain", "--preset", "paper/bl_base", "--out", str(out), "--no-progress", f"data.corpus={corpus}",
                 "model.vocab_size=null", "data.seq_len=128", "train.steps=20", "train.warmup_steps=2",
                 f"train.global_batch={16 * NGPU}", "train.micro_batch=8", "train.log_every=5",
                 "train.checkpoint_steps=[]", f"launch.ranks={NGPU}", f"launch.master_port={port()}")
    log = proc.stdout + proc.stderr
    assert f"world={NGPU} micro=8 accum=2" in log and "zero=1 bf16; optimizer BF16_Optimizer over FusedAdam" in log
    assert "backend nccl" in log
    rows = [json.loads(line) for line in (out / "logs" / "train.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    name = torch.cuda.get_device_name()
    if rows[-1]["mfu"] != rows[-1]["mfu"]:
        pytest.skip(f"MFU is NaN: {name!r} is not in mm_ds/engine.py's peak table (set peak_tflops=...)")
    assert 0.0 < rows[-1]["mfu"] < 1.0, rows[-1]
    meta = json.loads((out / "final" / "mm_ds.json").read_text())
    assert (meta["precision"], meta["world_size"]) == ("bf16", NGPU)


def test_sdpa_selects_the_fused_kernels():
    """The CUDA path of mm_ds/model.py is F.scaled_dot_product_attention: flash attention must serve packed MLM
    batches (no mask) and memory-efficient attention padded downstream batches, in training (dropout) too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mm_ds.config import ModelConfig
    from mm_ds.model import RobertaMLM

    cfg = ModelConfig(vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4, ffn_size=1024, max_positions=128)
    model = RobertaMLM(cfg).cuda().bfloat16().train()
    ids = torch.randint(5, 1000, (4, 128), device="cuda")
    labels = torch.where(torch.rand(ids.shape, device="cuda") < 0.15, ids, -100)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises if the flash kernel cannot take these inputs
        model(ids, labels=labels)["loss"].backward()
    mask = torch.ones_like(ids)
    mask[:, 100:] = 0
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        model(ids, labels=labels, attention_mask=mask)["loss"].backward()


SMALL = ["model.hidden_size=64", "model.num_heads=2", "model.ffn_size=128"]


def _recipe(tmp_path) -> dict:
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
        "launch": {"ranks": NGPU, "launcher": "deepspeed", "master_port": port()}, "mode": "one_job", "curve": True}


def test_the_pipeline_in_bf16_on_gpus(tmp_path):
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path)))
    mm_ds("run", str(recipe), "--out", str(out))
    job = (out / "logs" / "job.log").read_text()
    assert "backend nccl" in job and "over FusedAdam" in job and f"units on {NGPU} rank(s), cuda" in job
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["system"] for r in rows} == {"bl_base", "bl_small", "minijoint", "minipost"}
    for system, parent in (("bl_base", "pretrain/bl_base"), ("minijoint", "build_mini/minijoint"),
                           ("minipost", "build_mini/minipost")):
        _, psd = checkpoint.load_final(out / parent)
        meta, asd = checkpoint.load_final(out / "adapt" / system / "t1")
        assert meta["precision"] == "bf16"
        changed = [k for k in asd if k not in LANGUAGE_PARAMS and not torch.equal(asd[k], psd[k])]
        assert not changed, f"{system}: frozen weights are not the parent's fp32 ones: {changed[:4]}"


def test_step2_killed_and_resumed_on_gpus(tmp_path):
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "run"
    r = _recipe(tmp_path) | {"systems": ["minijoint"], "tasks": ["xnli"]}
    recipe.write_text(yaml.safe_dump(r))
    killed = mm_ds("run", str(recipe), "--out", str(out), env={"MM_DS_KILL_AT": "6", "MM_DS_KILL_STAGE": "adapt"},
                   check=False)
    assert killed.returncode != 0
    assert checkpoint.latest_tag(out / "adapt" / "minijoint" / "t1") == checkpoint.tag_for(4)
    mm_ds("run", str(recipe), "--out", str(out))
    assert "resumed from" in (out / "logs" / "job.log").read_text()
    assert checkpoint.load_final(out / "adapt" / "minijoint" / "t1")[0]["step"] == 8

"""Multi-rank training under the real `deepspeed` launcher on CPU (gloo): loss goes down under ZeRO 0 and 3 in fp32
(ZeRO 1 and 2 train in tests/test_launchers.py's resharding runs, and in bf16 in tests/test_pipeline.py; killed
runs resume bitwise in tests/test_faults.py), and a resume refuses another architecture."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64",
        "model.secondary_head_layer=1", "data.seq_len=32", "model.max_positions=32", "train.global_batch=16",
        "train.micro_batch=4", "train.lr=3e-3", "train.warmup_steps=5", "train.log_every=5",
        "train.checkpoint_steps=[10]", "train.checkpoint_every=1000000"]


def pretrain(corpus: Path, out: Path, *extra: str, port: int, env=None, check=True):
    cmd = [sys.executable, "-m", "mm_ds.cli", "pretrain", "--preset", "tiny/minijoint", "--out", str(out),
           "--no-progress", f"data.corpus={corpus}", f"launch.master_port={port}", *TINY, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def losses(run: Path) -> list[float]:
    return [json.loads(l)["loss"] for l in (run / "logs" / "train.jsonl").read_text().splitlines()]


@pytest.mark.ranks
@pytest.mark.parametrize("zero", [0, 3])
def test_loss_decreases_on_two_ranks(corpus, tmp_path, zero):
    out = tmp_path / f"z{zero}"
    pretrain(corpus, out, "train.steps=40", f"ds_config=fp32_zero{zero}.json", "peak_tflops=0.001",
             port=29610 + zero)
    ls = losses(out)
    assert ls[-1] < ls[0] - 0.5, ls
    for row in map(json.loads, (out / "logs" / "train.jsonl").read_text().splitlines()):
        # tflops counts the global batch; MFU divides by the peak of every rank (0.001 TFLOP/s each).
        assert row["mfu"] == pytest.approx(row["tflops"] / (0.001 * 2)), row
    meta = json.loads((out / "final" / "mm_ds.json").read_text())
    assert meta["world_size"] == 2 and meta["zero_stage"] == zero and meta["step"] == 40
    sd = load_file(str(out / "final" / "model.safetensors"))
    assert "secondary_head.bias" in sd and all(v.dtype == torch.float32 for v in sd.values())


@pytest.mark.ranks
def test_resume_refuses_another_architecture(corpus, tmp_path):
    out = tmp_path / "run"
    pretrain(corpus, out, "train.steps=10", port=29630)
    proc = pretrain(corpus, out, "train.steps=20", "model.num_layers=3", "--resume", port=29631, check=False)
    assert proc.returncode != 0
    assert "different architecture" in proc.stderr + proc.stdout

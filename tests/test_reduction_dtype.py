"""What the bf16 engine configs send between ranks, recorded: Step 2 (the body frozen, the language group training)
on 2 CPU ranks under bf16_zero{1,2,3}.json, each rank recording every collective DeepSpeed makes
(tests/support/comm_record.py). Gradients are reduced in fp32 (the configs accumulate in fp32; a bf16 reduction would
round them first), weights gathered in bf16, `mm-ds plan`'s model (mm_ds/tools/plan/plan.py) predicts the recorded
traffic,
and the frozen weights the engine trained beside are the parent's rounded to bf16 (MM_DS_DUMP_FROZEN, the
tests/gpu check, here on CPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mm_ds.model.model import is_language_param
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed.dist import free_port
from mm_ds.runtime.training import ds_config
from mm_ds.tools.plan import plan
from support.gpu_checks import frozen_mismatches

HERE = Path(__file__).resolve().parent
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.ffn_size=64", "data.seq_len=32",
        "model.max_positions=32"]
STEPS, ACCUM = 4, 2
PLAN_OP = {"all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "reduce": "reduce",
           "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter", "all_gather": "all_gather",
           "all_gather_into_tensor": "all_gather", "all_gather_base": "all_gather", "all_gather_coalesced": "all_gather"}
"""DeepSpeed's backend calls (tests/support/comm_record.py) as mm_ds/tools/plan/plan.py names the collectives."""
GRADS = [op for op, name in PLAN_OP.items() if "reduce" in name]
GATHERS = [op for op, name in PLAN_OP.items() if name == "all_gather"]
SCALARS = 4
"""Collectives of at most this many elements are gradient norms and overflow flags (1 or 2 elements); the smallest
parameter shard here has 28."""
THRESHOLD = 1000
"""ZeRO 3 here keeps parameters of at most this many elements whole (the shipped 1e5 would keep every parameter of
this tiny model whole), so that some are gathered in every forward pass and some once per update, as at the
paper's shape."""


@pytest.fixture(scope="module")
def parent(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parent") / "run"
    subprocess.run([sys.executable, "-m", "mm_ds.cli", "pretrain", "--preset", "tiny/bl_base", "--out", str(out),
                    "--no-progress", f"data.corpus={corpus}", *TINY, "train.steps=1", "train.global_batch=4",
                    "train.micro_batch=4", "train.warmup_steps=1", "train.checkpoint_steps=[]",
                    "ds_config=fp32_zero0.json", "launch.launcher=none", "launch.ranks=1"], check=True,
                   capture_output=True)
    return out


def run_two_ranks(argv: list[str], tmp: Path) -> list[list[dict]]:
    """`mm-ds ARGV` on 2 ranks started as a launcher starts them; each rank's record of collectives."""
    port, procs = free_port(), []
    for r in range(2):
        env = os.environ | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                            "MM_DS_DUMP_FROZEN": str(tmp / "frozen")}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "support" / "comm_record.py"),
                                       str(tmp / f"rank{r}.jsonl"), *argv], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]
    return [[json.loads(line) for line in (tmp / f"rank{r}.jsonl").read_text().splitlines()] for r in range(2)]


def updates(record: list[dict]) -> list[list[dict]]:
    """The collectives between consecutive optimizer steps: each holds one update's reductions and the previous
    update's gathers of new weights (the first update, before any step, also holds the start-up broadcasts)."""
    cuts = [i for i, r in enumerate(record) if r.get("mark") == "step"]
    return [[r for r in record[a + 1:b] if "op" in r] for a, b in zip(cuts, cuts[1:])]


@pytest.mark.ranks
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_bf16_reduces_gradients_in_fp32_as_the_plan_counts(corpus, parent, tmp_path, zero):
    ds = json.loads(ds_config.find(f"bf16_zero{zero}.json").read_text())
    if zero == 3:
        ds["zero_optimization"]["stage3_param_persistence_threshold"] = THRESHOLD
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    out = tmp_path / "run"
    records = run_two_ranks(["adapt", "--preset", "tiny/adapt", "--out", str(out), "--no-progress", "system=bl_base",
                             "lang=de", f"parent={parent}", f"data.corpus={corpus}", "data.seq_len=32",
                             f"ds_config={tmp_path / 'ds.json'}", f"train.steps={STEPS}", "train.warmup_steps=1",
                             f"train.global_batch={4 * 2 * ACCUM}", "train.micro_batch=4", "train.log_every=1",
                             "train.checkpoint_steps=[]"], tmp_path)
    rows = [json.loads(line) for line in (out / "logs" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == STEPS and all(r["loss"] == r["loss"] for r in rows)  # it trains

    _, psd = checkpoint.load_final(parent)
    _, asd = checkpoint.load_final(out)
    total = sum(v.numel() for v in asd.values())
    trainable = sum(v.numel() for k, v in asd.items() if is_language_param(k))
    persistent = sum(v.numel() for v in asd.values() if v.numel() <= THRESHOLD) if zero == 3 else 0
    want = plan.collectives_per_step(zero, trainable, total, ACCUM, persistent)
    want_bytes = plan.comm_bytes_per_step(zero, 2, trainable, total, ACCUM, "bf16", persistent=persistent)
    for rank, record in enumerate(records):
        for update in updates(record)[1:]:  # whole updates: the first segment starts the run
            sent = [r for r in update if r["numel"] > SCALARS]
            grads = [r for r in sent if r["op"] in GRADS]
            gathers = [r for r in sent if r["op"] in GATHERS]
            assert grads and {r["dtype"] for r in grads} == {"float32"}, (rank, grads)
            assert {r["dtype"] for r in gathers} <= {"bfloat16"}, (rank, gathers)
            assert len(grads) + len(gathers) == len(sent), (rank, sent)  # nothing else of size moves
            got = {"grad": sum(r["numel"] for r in grads), "param": 2 * sum(r["numel"] for r in gathers)}
            for op, kind, elements in want:  # one kind of collective per kind of tensor and stage
                assert {PLAN_OP[r["op"]] for r in (grads if kind == "grad" else gathers)} == {op}
                assert got[kind] == pytest.approx(elements, rel=0.01), (zero, kind, got, want)  # + alignment padding
            ring = {"all_reduce": 1.0, "reduce_scatter_tensor": 0.5, "all_gather_into_tensor": 1.0}  # n = 2
            sent_bytes = sum(ring[r["op"]] * r["numel"] * (4 if r["dtype"] == "float32" else 2) for r in sent)
            assert sent_bytes == pytest.approx(want_bytes, rel=0.01)

    assert json.loads((out / "ds_config.json").read_text()).get("communication_data_type") == "fp32"
    live = torch.load(tmp_path / "frozen" / "adapt.bl_base.de.pt")
    assert live and {v.dtype for v in live.values()} == {torch.bfloat16}
    assert not frozen_mismatches(live, psd, is_language_param)

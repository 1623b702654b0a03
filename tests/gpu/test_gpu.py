"""On CUDA GPUs: what no CPU machine can run. `make test-gpu` on a machine with one or more GPUs (under 8 minutes on
one GPU; `make test-gpu LONG=1` adds the `gpu_long` cases); without CUDA every test here is skipped. It ends with a
summary to paste (tests/gpu/conftest.py). The checks that need no GPU live in tests/support/gpu_checks.py and beside
this file (gpu_thresholds.py, device_waits.py), where CPU tests (tests/test_gpu_checks.py) show that they can fail.

On one GPU:
- the paper-shape update: Step 1 of BL_BASE and MINIJOINT as the paper presets run it (bf16 under ZeRO 1, 32 x 512
  per micro-step, 2 micro-steps per update), in a process of its own (paper_update.py): the GPU's peak allocated
  memory under a ceiling and its tokens/s over a floor from `mm-ds plan`'s model (gpu_thresholds.py says why
  half the plan's rate); a GPU missing from mm_ds/runtime/training/peaks.py skips the floor, saying so;
- the same update of BL_BASE with train.compile (inductor), in a process of its own: its tokens/s and peak memory
  against the eager run's, its compile time, graphs, graph breaks (none allowed) and recompiles;
- its micro-steps through the real engine (`engine.train_step` on an engine built as `engine.train` builds it, past
  the first updates, no log or checkpoint among them) under `torch.cuda.set_sync_debug_mode("error")` and torch's
  GPU trace: no wait of the host for the device; at the optimizer step only DeepSpeed's named norm read;
- SDPA on real MLM batches: flash attention runs for a batch without padding, a fused kernel (never the math
  fallback) for one with its padding mask, forward and backward;
- the miniature pipeline in bf16 under ZeRO 1-3 (every stage kind, Step 2 over both mini-models, Step 4 on the
  GPUs) as one job (per stage: `gpu_long`): the frozen weights the Step-2 engines held on the GPUs
  (MM_DS_DUMP_FROZEN) are the parent's rounded to bf16, and final/ holds the parent's fp32 ones;
- Step 2 killed and resumed on the GPUs (per stage: `gpu_long`).
With 2 or more GPUs (skipped below, saying what they would test), over NCCL between them:
- 20 updates of BL_BASE pretraining (the paper's shape, shorter sequences) in bf16 (BF16_Optimizer) and fp16 (the
  ZeRO optimizer, loss scaling): DeepSpeed's CUDA FusedAdam, loss going down, MFU logged against the GPU's peak;
  NCCL's transports between the GPUs, read from its NCCL_DEBUG=INFO lines (P2P or SHM, never NET, on one node).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import gpu_thresholds
from mm_ds.model.model import LANGUAGE_PARAMS, is_language_param
from mm_ds.runtime.checkpointing import checkpoint
from mm_ds.runtime.distributed.dist import free_port
from support.gpu_checks import (attention_calls, describe_transports, frozen_mismatches, fused_attention_problems,
                                nccl_transports, sdpa_backend, sdpa_kernels_run, transport_problems)

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA GPUs: run `make test-gpu` on a GPU machine")]
NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
GiB = 2 ** 30


def over_nccl(what: str):
    """A test of traffic between GPUs: on fewer than 2 a world of one would pass it without any; skip, saying what
    it would have tested."""
    return pytest.mark.skipif(NGPU < 2, reason=f"needs 2+ GPUs ({NGPU} here): would test, over NCCL, {what}")


def mm_ds(*argv, env=None, check=True):
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"mm-ds {' '.join(argv)}\nexit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


NCCL_INFO = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH"}  # connections and the graph's path type


@over_nccl("bf16 (BF16_Optimizer) and fp16 (ZeRO optimizer, loss scaling) updates of BL_BASE with gradients "
           "all-reduced between the GPUs, and the transports NCCL picks for them")
@pytest.mark.parametrize("precision, optimizer", [("bf16", "BF16_Optimizer"), ("fp16", "DeepSpeedZeroOptimizer")])
def test_base_pretraining_with_fused_adam_over_nccl(corpus, tmp_path, precision, optimizer, record_property):
    """bf16 (the paper presets) and fp16 (GPUs only: DeepSpeed's CPU accelerator has none; dynamic loss scaling)."""
    out = tmp_path / "bl_base"
    proc = mm_ds("pretrain", "--preset", "paper/bl_base", "--out", str(out), "--no-progress", f"data.corpus={corpus}",
                 "model.vocab_size=null", "data.seq_len=128", "train.steps=20", "train.warmup_steps=2",
                 f"train.global_batch={16 * NGPU}", "train.micro_batch=8", "train.log_every=5",
                 "train.checkpoint_steps=[]", f"ds_config={precision}_zero1.json", f"launch.ranks={NGPU}",
                 f"launch.master_port={free_port()}", env=NCCL_INFO)
    log = proc.stdout + proc.stderr
    assert f"world={NGPU} micro=8 accum=2" in log and f"zero=1 {precision}; optimizer {optimizer} over FusedAdam" in log
    assert "backend nccl" in log
    found = nccl_transports(log)
    record_property("NCCL", describe_transports(found))
    assert not transport_problems(found), f"{transport_problems(found)}: {describe_transports(found)}"
    rows = [json.loads(line) for line in (out / "logs" / "train.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in rows) and rows[-1]["loss"] < rows[0]["loss"]
    meta = json.loads((out / "final" / "mm_ds.json").read_text())
    assert (meta["precision"], meta["world_size"]) == (precision, NGPU)
    name = torch.cuda.get_device_name()
    if rows[-1]["mfu"] != rows[-1]["mfu"]:  # last: everything above holds whatever the GPU
        pytest.skip(f"MFU is NaN: {name!r} is not in mm_ds/runtime/training/peaks.py's GPU_PEAK_TFLOPS (set peak_tflops=...)")
    record_property("MFU", f"{rows[-1]['mfu']:.1%} (seq 128)")
    assert 0.0 < rows[-1]["mfu"] < 1.0, rows[-1]


# ---------------------------------------------------------------- the paper-shape update on one GPU

_PAPER: dict[str, dict] = {}


@pytest.fixture(scope="module")
def paper_runs(tmp_path_factory):
    """(system, mode) -> paper_update.py's JSON for it, each run once (a process per run; the corpus made once);
    mode "compiled": train.compile."""
    work = tmp_path_factory.mktemp("paper_update")

    def result(system: str, *mode: str) -> dict:
        key = "_".join([system, *mode])
        if key not in _PAPER:
            out = work / f"{key}.json"
            proc = subprocess.run([sys.executable, str(HERE / "paper_update.py"), str(work), system, str(out), *mode],
                                  capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"paper_update.py {key}: exit {proc.returncode}\n{proc.stderr[-6000:]}"
            _PAPER[key] = json.loads(out.read_text())
        return _PAPER[key]

    return result


@pytest.mark.parametrize("system", gpu_thresholds.SYSTEMS)
def test_paper_shape_update_memory_and_throughput(paper_runs, system, record_property):
    r = paper_runs(system)
    want = gpu_thresholds.paper_update(system, r["gpu"])
    assert (r["micro_batch"], r["grad_accum"], r["precision"]) == (want.micro_batch, want.grad_accum, "bf16")
    assert all(x == x for x in r["losses"]), r["losses"]
    mem = want.memory
    record_property("step", f"{r['step_s'] * 1e3:.1f} ms")
    record_property("peak memory", f"{r['peak_bytes'] / GiB:.2f} GiB (ceiling {mem['ceiling'] / GiB:.2f})")
    assert r["peak_bytes"] <= mem["ceiling"], (
        f"{want.system}: {r['peak_bytes'] / GiB:.2f} GiB allocated at most, over the ceiling "
        f"{mem['ceiling'] / GiB:.2f} GiB = {gpu_thresholds.MEMORY_MARGIN} x (states {mem['states'] / GiB:.2f} + activations "
        f"{mem['activations'] / GiB:.2f} + heads {mem['heads'] / GiB:.2f}); see gpu_thresholds.py")
    record_property("tokens/s", f"{r['tokens_per_s']:,.0f}")
    if want.peak_tflops != want.peak_tflops:  # last: the memory above holds whatever the GPU
        pytest.skip(f"no throughput floor: {r['gpu']!r} is not in mm_ds/runtime/training/peaks.py's GPU_PEAK_TFLOPS, so "
                    f"`mm-ds plan` has no step time for it ({r['tokens_per_s']:,.0f} tokens/s measured)")
    floor, mfu = want.floor_tokens_per_s, want.mfu(r["step_s"])
    record_property("tokens/s", f"{r['tokens_per_s']:,.0f} (floor {floor:,.0f}, plan {want.planned_tokens_per_s:,.0f})")
    record_property("MFU", f"{mfu:.1%} (plan {gpu_thresholds.PLAN_MFU:g})")
    assert r["tokens_per_s"] >= floor, (
        f"{want.system}: {r['tokens_per_s']:,.0f} tokens/s (MFU {mfu:.1%}) is under the floor {floor:,.0f}, half of "
        f"what `mm-ds plan` assumes on {r['gpu']} ({want.planned_tokens_per_s:,.0f} at MFU {gpu_thresholds.PLAN_MFU})")


def test_paper_shape_update_compiled_against_eager(paper_runs, record_property):
    """train.compile (inductor) on BL_BASE's paper-shape update, in a process of its own, beside the eager one: what
    the first GPU run must answer before the paper presets turn it on (docs/engine-configs.md). Recorded: both
    sides' tokens/s and peak memory, the compile's seconds, graphs, graph breaks and recompiles; required: no graph
    break, finite losses, the eager run's memory ceiling. Not required: that compiled is faster (the answer)."""
    eager, comp = paper_runs("bl_base"), paper_runs("bl_base", "compiled")
    c, mem = comp["compiled"], gpu_thresholds.paper_update("bl_base", comp["gpu"]).memory
    record_property("tokens/s", f"compiled {comp['tokens_per_s']:,.0f} vs eager {eager['tokens_per_s']:,.0f} "
                                f"({comp['tokens_per_s'] / eager['tokens_per_s']:.2f}x)")
    record_property("peak memory", f"compiled {comp['peak_bytes'] / GiB:.2f} GiB vs eager {eager['peak_bytes'] / GiB:.2f}")
    record_property("compile", f"{c['compile_s']:.0f} s, {c['graphs']:.0f} graph(s), {c['graph_breaks']:.0f} "
                               f"break(s), {c['recompiles']:.0f} recompile(s); device waits in its watched updates: "
                               f"{len(comp['problems'])}")
    assert all(x == x for x in comp["losses"]), comp["losses"]
    assert c["graph_breaks"] == 0 and 1 <= c["graphs"] <= 2, c
    assert comp["peak_bytes"] <= mem["ceiling"], (comp["peak_bytes"] / GiB, mem["ceiling"] / GiB)


@pytest.mark.parametrize("system", gpu_thresholds.SYSTEMS)
def test_micro_steps_never_wait_for_the_device(paper_runs, system, record_property):
    """The same process's last updates under sync-debug "error" and torch's GPU trace (device_waits.py): nothing in
    a micro-step waits for the device (DeepSpeed's throughput timer, a read of a loss or a flag, a copy that must
    finish); the optimizer step may make DeepSpeed's named gradient-norm read only."""
    from paper_update import WATCHED

    r = paper_runs(system)
    allowed = ", ".join(f"{k} x{v:g}" for k, v in r["allowed_per_update"].items()) or "none"
    record_property("waits per update", f"{len(r['problems'])} not allowed; DeepSpeed's norm read: {allowed}")
    assert not r["problems"], "the host waited for the device:\n" + "\n".join(r["problems"])
    assert r["watched_updates"] == WATCHED, r


def test_sdpa_flash_for_an_unpadded_batch_fused_for_a_padded_one(corpus, record_property):
    """mm_ds/model/model.py's CUDA path is F.scaled_dot_product_attention with the batch's padding mask (key_mask, bool
    (B, 1, 1, T)) and dropout 0.1 in training. Flash attention takes no mask, so a batch without padding must run
    flash attention, the fastest kernel, and a real batch (its padding mask as the data pipeline makes it) a fused
    one (memory-efficient or cuDNN), never the math fallback; the kernels that run are read from torch's profiler
    (`sdpa_kernels_run`), and the fused kernels must run forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mm_ds import config
    from mm_ds.runtime.training.ds_config import Geometry
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
    ran = {}
    for name, inputs in (("padded", padded), ("unpadded", full)):
        with attention_calls() as calls:
            model(**inputs)["loss"].backward()
        assert len(calls) == cfg.model.num_layers and all((c.mask is None) == (inputs is full) for c in calls)
        assert not fused_attention_problems(calls), fused_attention_problems(calls)
        ran[name] = sdpa_kernels_run(lambda: model(**inputs)["loss"].backward())
        assert sum(ran[name].values()) == cfg.model.num_layers, ran[name]
        with sdpa_kernel(fused):  # raises if no fused kernel takes these inputs
            model(**inputs)["loss"].backward()
    record_property("SDPA", "; ".join(f"{k}: {', '.join(v)}" for k, v in ran.items()))
    assert "MATH" not in ran["padded"], f"the padded batch fell back to math attention: {ran}"
    assert set(ran["unpadded"]) == {"FLASH_ATTENTION"}, (
        f"an unpadded bf16 batch ran {dict(ran['unpadded'])}, not flash attention (the dispatcher's choice: "
        f"{sdpa_backend(calls[0]).name}; torch's priority order: "
        f"{[SDPBackend(i).name for i in torch._C._get_sdp_priority_order()]})")


SMALL = ["model.hidden_size=64", "model.num_heads=2", "model.ffn_size=128"]
# Per stage (the paper recipe's launches, ~20 of them) is `gpu_long`: one job keeps `make test-gpu` under 8 minutes.
MODES = [pytest.param("per_stage", marks=pytest.mark.gpu_long), "one_job"]


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
        "launch": {"ranks": NGPU, "launcher": "deepspeed", "master_port": free_port()}, "mode": mode, "curve": True}


def logs(out: Path) -> str:
    """Every launch's output: logs/job.log for one job, a log per stage (and eval.log) per stage."""
    return "".join(p.read_text() for p in sorted((out / "logs").glob("*.log")))


@pytest.mark.parametrize("mode", MODES)
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


@pytest.mark.parametrize("mode", MODES)
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

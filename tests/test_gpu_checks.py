"""The GPU suite's checks that need no GPU (tests/support/gpu_checks.py, tests/gpu/gpu_thresholds.py,
tests/gpu/device_waits.py), run on CPU: each fails when it should, and sees on CPU what tests/gpu/test_gpu.py will
show it on the GPUs; the paper-shape update's own script (tests/gpu/paper_update.py) runs its flow here at a tiny
shape. The suite itself must import and skip here, and keep what its source promises: "over NCCL" tests skip below
2 GPUs, the paper-shape floor and ceiling asserted, micro-steps watched under sync-debug "error", flash asserted, an
unknown GPU's skip after its other checks, the pipeline run per stage too."""

import ast
import json
import math
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from support.gpu_checks import (attention_calls, describe_transports, frozen_mismatches, fused_attention_problems,
                                nccl_transports, sdpa_backend, sdpa_kernels_run, summary, transport_problems)

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "tests" / "gpu"
GPU_SUITE = GPU_DIR / "test_gpu.py"
sys.path.insert(0, str(GPU_DIR))
import device_waits  # noqa: E402
import gpu_thresholds  # noqa: E402


def test_frozen_mismatches_finds_a_moved_missing_or_extra_weight():
    parent = {"layers.0.w": torch.randn(4, 4), "embed.tokens.weight": torch.randn(3, 4)}
    trainable = lambda k: k == "embed.tokens.weight"  # noqa: E731
    live = {"layers.0.w": parent["layers.0.w"].bfloat16()}  # the engine's bf16 copy of a frozen fp32 weight
    assert frozen_mismatches(live, parent, trainable) == []
    moved = {"layers.0.w": live["layers.0.w"].clone()}
    moved["layers.0.w"][1, 2] += 0.5
    assert [p.split(":")[0] for p in frozen_mismatches(moved, parent, trainable)] == ["layers.0.w"]
    parent["layers.0.w"][0, 0] = 1 + 3 * 2 ** -9  # bf16 rounds it up to 1 + 2^-7; cutting the low bits gives 1
    live = {"layers.0.w": parent["layers.0.w"].bfloat16()}
    cut = {"layers.0.w": (parent["layers.0.w"].view(torch.int32) & -65536).view(torch.float32).bfloat16()}
    assert frozen_mismatches(live, parent, trainable) == [] and len(frozen_mismatches(cut, parent, trainable)) == 1
    assert "frozen but not in the dump" in frozen_mismatches({}, parent, trainable)[0]
    extra = live | {"embed.tokens.weight": parent["embed.tokens.weight"].bfloat16()}
    assert "not a frozen parameter" in frozen_mismatches(extra, parent, trainable)[0]


@pytest.fixture(scope="module")
def mlm_stage(corpus):
    from mm_ds import config
    from mm_ds.stages import pretrain

    cfg = config.load("tiny/bl_base", overrides=[f"data.corpus={corpus}", "data.seq_len=32", "model.max_positions=32"])
    return pretrain.build(cfg)


def test_real_mlm_batches_reach_sdpa_with_their_padding_mask(mlm_stage):
    """What the GPU test dispatches on: the model's SDPA inputs for a batch the data pipeline makes (on CPU, eval:
    in training the CPU path computes attention itself)."""
    from mm_ds.runtime.training.ds_config import Geometry

    batch = mlm_stage.batches(0, 0, 0, Geometry(8, 8, 1, 1))
    assert batch["attention_mask"] is not None and not batch["attention_mask"].all()  # blocks end in padding
    with attention_calls() as calls:
        mlm_stage.model.eval()(**batch)
    assert len(calls) == mlm_stage.cfg.model.num_layers
    B, T = batch["input_ids"].shape
    for call in calls:
        assert call.q.shape[0] == B and call.q.shape[2] == T and call.q.stride(-1) == 1
        assert call.mask.dtype == torch.bool and call.mask.shape == (B, 1, 1, T)
        assert torch.equal(call.mask[:, 0, 0], batch["attention_mask"])
    # CPU's own fused kernel takes this mask; the check passes what the dispatcher serves fused ...
    assert sdpa_backend(calls[0]) == SDPBackend.FLASH_ATTENTION and not fused_attention_problems(calls)
    # ... and names what it would leave to the math fallback (on CPU: any dropout)
    calls[0].dropout_p = 0.1
    problems = fused_attention_problems(calls)
    assert len(problems) == 1 and problems[0].startswith("call 0: MATH") and "mask torch.bool" in problems[0]
    with attention_calls() as none:  # the recorder is gone after the block
        pass
    mlm_stage.model(**batch)
    assert none == []


def test_the_gpu_suite_imports_and_skips_here():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", str(ROOT / "tests" / "gpu")],
                          capture_output=True, text=True, cwd=ROOT)
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: `make test-gpu` runs the suite")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "12 skipped" in proc.stdout and "needs CUDA GPUs" in proc.stdout, proc.stdout[-2000:]
    assert "mm-ds GPU suite" not in proc.stdout  # no summary to paste without a GPU


# ---------------------------------------------------------------- the GPU suite's own structure, read from its source

def gpu_suite() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(GPU_SUITE.read_text())
    return {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]


def test_an_unknown_gpu_skips_only_after_every_check_that_needs_no_peak():
    """A GPU missing from the peak table (MFU NaN, no plan) still runs every check of its test that does not need the
    peak: a skip inside a GPU test has only asserts on MFU or the plan's floor after it, and no test is skipped whole
    for the peak."""
    skips = 0
    for name, test in gpu_suite().items():
        assert not any("peak" in ast.unparse(d).lower() for d in test.decorator_list), name
        for skip in calls(test, "pytest.skip"):
            skips += 1
            later = [ast.unparse(a.test) for a in ast.walk(test) if isinstance(a, ast.Assert)
                     and a.lineno > skip.lineno]
            assert all("mfu" in a or "floor" in a for a in later), f"{name}: asserts after the skip on line " \
                                                                  f"{skip.lineno}: {later}"
    assert skips >= 2, "the suite no longer skips for a GPU whose peak is unknown (mm_ds/runtime/training/peaks.py)"


def module_strings(name: str) -> list[str]:
    """The strings of the GPU suite's module-level list `name`, pytest.param(...) entries included."""
    tree = ast.parse(GPU_SUITE.read_text())
    value = next(n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name)
    return [ast.literal_eval(e.args[0] if isinstance(e, ast.Call) else e) for e in value.elts]


def test_the_gpu_pipeline_tests_run_per_stage_as_well_as_one_job():
    """The paper recipe runs each stage as a launch of its own (`per_stage`): the miniature pipeline on the GPUs
    runs that way too, not only as one job (per stage as a `gpu_long` case: `make test-gpu LONG=1`)."""
    suite = gpu_suite()
    pipeline = {name: test for name, test in suite.items() if name.startswith("test_") and calls(test, "_recipe")}
    assert len(pipeline) >= 2, list(pipeline)
    for name, test in pipeline.items():
        params = [d for d in test.decorator_list if isinstance(d, ast.Call)
                  and ast.unparse(d.func) == "pytest.mark.parametrize" and ast.literal_eval(d.args[0]) == "mode"]
        modes = module_strings(ast.unparse(params[0].args[1])) if params else []
        assert {"per_stage", "one_job"} <= set(modes), f"{name}: modes {modes}"
        assert all(ast.unparse(c.args[0]) == "mode" for c in calls(test, "_recipe")), name
    assert "'mode': mode" in ast.unparse(suite["_recipe"]), "_recipe must pass the test's mode to the recipe"
    long = [e for e in ast.parse(GPU_SUITE.read_text()).body if isinstance(e, ast.Assign)
            and ast.unparse(e.targets[0]) == "MODES"][0]
    assert "pytest.param('per_stage', marks=pytest.mark.gpu_long)" in ast.unparse(long)  # only per stage is long


def test_over_nccl_tests_skip_below_two_gpus_saying_what_they_would_test():
    """On one GPU a world of one passes any "over NCCL" test without traffic between GPUs: every test named so is
    skipped below 2 GPUs by `over_nccl`, whose reason says what it would test; the NCCL test reads the transports."""
    suite = gpu_suite()
    helper = ast.unparse(suite["over_nccl"])
    assert "pytest.mark.skipif(NGPU < 2" in helper and "would test" in helper and "{what}" in helper
    nccl = {name: t for name, t in suite.items() if name.startswith("test_") and "nccl" in name}
    assert nccl, "no test over NCCL left"
    for name, test in nccl.items():
        marks = [d for d in test.decorator_list if isinstance(d, ast.Call) and ast.unparse(d.func) == "over_nccl"]
        assert marks and len(ast.literal_eval(marks[0].args[0])) > 40, f"{name}: not skipped below 2 GPUs, or no " \
                                                                        f"word of what it would test"
    assert any(calls(t, "transport_problems") and calls(t, "nccl_transports") for t in nccl.values())


def test_the_paper_shape_update_asserts_its_floor_and_ceiling():
    """Not printed, asserted: tokens/s >= the plan's floor, peak memory <= the ceiling, for BL_BASE and MINIJOINT."""
    test = gpu_suite()["test_paper_shape_update_memory_and_throughput"]
    asserts = [a.test for a in ast.walk(test) if isinstance(a, ast.Assert)]
    compared = {(type(a.ops[0]).__name__, ast.unparse(a.left), ast.unparse(a.comparators[0]))
                for a in asserts if isinstance(a, ast.Compare)}
    assert ("GtE", "r['tokens_per_s']", "floor") in compared
    assert ("LtE", "r['peak_bytes']", "mem['ceiling']") in compared
    assert "floor, mfu = (want.floor_tokens_per_s, want.mfu(r['step_s']))" in ast.unparse(test)
    assert "want = gpu_thresholds.paper_update(system, r['gpu'])" in ast.unparse(test)
    params = ast.unparse(test.decorator_list[0])
    assert params == "pytest.mark.parametrize('system', gpu_thresholds.SYSTEMS)" and \
        gpu_thresholds.SYSTEMS == ("bl_base", "minijoint")


def test_micro_steps_are_watched_under_sync_debug_error_and_asserted():
    """paper_update.py runs updates inside `DeviceWaits` with DeepSpeed's boundary step wrapped; the GPU test asserts
    that nothing was left over and that every watched update ran (a sync-debug error ends the watch early)."""
    script = ast.parse((GPU_DIR / "paper_update.py").read_text())
    watched = [w for w in ast.walk(script) if isinstance(w, ast.With)
               and {ast.unparse(i.context_expr).split("(")[0] for i in w.items} == {"waits", "boundary_steps_lenient"}]
    assert watched and calls(watched[0], "update"), "the watched updates left paper_update.py"
    test = gpu_suite()["test_micro_steps_never_wait_for_the_device"]
    asserts = {ast.unparse(a.test) for a in ast.walk(test) if isinstance(a, ast.Assert)}
    assert {"not r['problems']", "r['watched_updates'] == WATCHED"} <= asserts
    enter = ast.unparse(next(f for f in ast.walk(ast.parse((GPU_DIR / "device_waits.py").read_text()))
                             if isinstance(f, ast.FunctionDef) and f.name == "__enter__"))
    assert "self.set_mode('error')" in enter


def test_flash_for_an_unpadded_batch_is_asserted_not_printed():
    suite = gpu_suite()
    test = next(t for name, t in suite.items() if name.startswith("test_sdpa"))
    asserts = [ast.unparse(a.test) for a in ast.walk(test) if isinstance(a, ast.Assert)]
    assert "set(ran['unpadded']) == {'FLASH_ATTENTION'}" in asserts and "'MATH' not in ran['padded']" in asserts
    assert not any(calls(t, "print") for t in suite.values()), "the suite prints a result instead of asserting it"


# ---------------------------------------------------------------- the paper-shape update's arithmetic

def test_the_paper_update_floor_and_ceiling_from_known_numbers():
    """BL_BASE and MINIJOINT Step 1 on an H100 SXM (989.4 TFLOP/s bf16 dense) at 2 x 32 x 512, by hand: A1 per
    sequence = 3 (12 (24 s h^2 + 4 h s^2) + p (2 s h^2 + 2 s h V)); the plan's step = FLOPs / (peak x 0.45)."""
    h, V, L, s, p, B = 768, 50_000, 12, 512, 0.15, 64
    head = p * (2 * s * h * h + 2 * s * h * V)
    a1 = 3 * B * (L * (24 * s * h * h + 4 * h * s * s) + head)
    assert a1 == pytest.approx(1.9704115e13)
    for system, flops in (("bl_base", a1), ("minijoint", a1 + 3 * B * head)):  # + the secondary head
        u = gpu_thresholds.paper_update(system, "NVIDIA H100 80GB HBM3")
        assert (u.micro_batch, u.grad_accum, u.seq_len, u.tokens, u.peak_tflops) == (32, 2, 512, 32_768, 989.4)
        assert u.flops == pytest.approx(flops)
        assert u.planned_step_s == pytest.approx(flops / (989.4e12 * 0.45))
        assert u.floor_tokens_per_s == pytest.approx(0.5 * 32_768 / u.planned_step_s)
        assert u.mfu(u.planned_step_s) == pytest.approx(0.45)  # a run at the plan's rate is at its MFU
    base = gpu_thresholds.paper_update("bl_base", "NVIDIA H100 80GB HBM3")
    assert round(base.planned_tokens_per_s) == 740_419 and round(base.floor_tokens_per_s) == 370_209
    # a 2x slowdown of a run at the plan's rate sits on the floor; anything slower, or any run under 0.225, fails
    assert base.mfu(2 * base.planned_step_s) == pytest.approx(gpu_thresholds.FLOOR * gpu_thresholds.PLAN_MFU)
    # the memory: 20 bytes per trainable parameter, 34 s b h per layer + 5 for the embeddings, 10 bytes per logit
    from mm_ds.config import load
    from mm_ds.model.model import param_count

    params = param_count(load("paper/bl_base").model)
    sbh = s * 32 * h
    mem = base.memory
    assert (mem["states"], mem["activations"], mem["heads"]) == (20 * params, 34 * sbh * L + 5 * sbh,
                                                                 32 * 77 * V * 10)
    assert mem["ceiling"] == 1.5 * (mem["states"] + mem["activations"] + mem["heads"])
    assert 12 * 2**30 < mem["ceiling"] < 13 * 2**30  # 12.5 GiB: an 80 GB H100 has room; the test checks the shape
    # the defects it must catch: attention scores kept per layer (math fallback: 5 a s^2 b bytes), fp32 activations
    assert mem["estimate"] + L * 5 * 12 * s * s * 32 > mem["ceiling"]
    assert mem["estimate"] + mem["activations"] > mem["ceiling"]
    mini = gpu_thresholds.paper_update("minijoint", "NVIDIA H100 80GB HBM3").memory
    assert mini["heads"] == 2 * mem["heads"] and mini["states"] > mem["states"]  # the secondary head's logits, weights
    unknown = gpu_thresholds.paper_update("bl_base", "NVIDIA B300")  # no plan without a peak: the floor is skipped
    assert math.isnan(unknown.peak_tflops) and math.isnan(unknown.floor_tokens_per_s) and unknown.memory == mem


# ---------------------------------------------------------------- the host's waits for the device

def frame(path: str, function: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(path, 233, function)


def test_device_waits_records_and_judges_every_wait():
    modes = []
    waits = device_waits.DeviceWaits(modes.append)
    device_waits.simulated_device_sync()  # before the block: not recorded
    with waits:
        device_waits.simulated_device_sync()  # a micro-step's wait: where it was made, this test
        with waits.phase(device_waits.STEP):
            waits.record("stream", [frame("/v/site-packages/deepspeed/runtime/utils.py", "is_invalid_grad_norm")])
            waits.record("stream", [frame("/v/site-packages/deepspeed/runtime/engine.py", "backward")])
        other = threading.Thread(target=device_waits.simulated_device_sync, name="mm-ds-batches")
        other.start()
        other.join()
    device_waits.simulated_device_sync()  # after: not recorded
    assert modes == ["error", "default", "error", "default"]  # strict, lenient at the step, strict, off
    assert [(w.kind, w.phase, w.thread) for w in waits.waits] == [
        ("device", "micro-step", "MainThread"), ("stream", "optimizer step", "MainThread"),
        ("stream", "optimizer step", "MainThread"), ("device", "micro-step", "mm-ds-batches")]
    first = waits.waits[0]
    assert (first.owner, first.function) == ("other", "test_device_waits_records_and_judges_every_wait")
    assert first.where.endswith("tests/test_gpu_checks.py:" + first.where.rsplit(":", 1)[1])
    problems = waits.problems()  # the batch thread's wait is not the training thread's
    assert len(problems) == 2 and problems[0].startswith("device synchronization in the micro-step at")
    assert "stream synchronization in the optimizer step at deepspeed/runtime/engine.py:233 (deepspeed: backward)" \
        == problems[1]
    assert waits.per_update(2) == {"is_invalid_grad_norm": 0.5}
    try:  # a sync-debug error ends a micro-step: recorded where it was raised
        raise RuntimeError("called a synchronizing CUDA operation")
    except RuntimeError as e:
        waits.raised(e)
    assert waits.waits[-1].kind == "sync-debug" and waits.waits[-1].function.startswith("test_device_waits")


@pytest.mark.ranks
def test_the_paper_update_script_runs_its_flow_on_cpu(corpus, tmp_path):
    """paper_update.py's own code at a tiny shape on CPU (stand-ins for the GPU's memory and sync-debug calls,
    DeepSpeed's CPU accelerator's `synchronize` made to fire the trace as CUDA's does), under an engine JSON whose
    throughput timer is explicitly on: the watch names DeepSpeed's timer, at forward start and step end, in the
    micro-steps and at the optimizer step: what the GPU test fails on if the resolved config leaves the timer on."""
    ds = json.loads((ROOT / "ds_configs" / "bf16_zero1.json").read_text())
    ds["timers"] = {"throughput": {"enabled": True, "synchronized": True}}
    (tmp_path / "timer_on.json").write_text(json.dumps(ds))
    snippet = f"""
import json, sys
sys.path.insert(0, {str(GPU_DIR)!r})
import device_waits, paper_update as pu
from pathlib import Path
from deepspeed.accelerator import get_accelerator
get_accelerator().synchronize = device_waits.simulated_device_sync
modes = []
cpu = pu.Gpu(name=lambda: "cpu", reset_peak=lambda: None, peak_bytes=lambda: 0, set_sync_debug_mode=modes.append,
             pin=False)
tiny = ("model.hidden_size=32", "model.num_layers=2", "model.secondary_head_layer=1", "model.num_heads=2",
        "model.ffn_size=64", "model.max_positions=64", "data.seq_len=64", "model.vocab_size=null",
        "ds_config={tmp_path / 'timer_on.json'}")
r = pu.update_on_one_gpu("minijoint", Path({str(corpus)!r}), Path({str(tmp_path / 'run')!r}), cpu, tiny, 4, 2)
print(json.dumps(r | {{"modes": modes}}, default=float))
pu.leave(0)
"""
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.splitlines()[-1])
    assert (r["micro_batch"], r["grad_accum"], r["precision"], r["watched_updates"]) == (4, 2, "bf16", 2)
    assert len(r["losses"]) == 5 and all(math.isfinite(x) for x in r["losses"]) and r["step_s"] > 0
    assert r["modes"] == ["error"] + ["default", "error"] * 2 + ["default"]  # strict but at each update's step
    timer = [w for w in r["waits"] if w["where"].startswith("deepspeed/utils/timer.py")]
    assert len(timer) == len(r["waits"]) == len(r["problems"]) == 2 * 4  # 2 updates x (2 starts + 2 stops)
    assert {(w["function"], w["phase"]) for w in timer} == {("start", "micro-step"), ("stop", "micro-step"),
                                                           ("stop", "optimizer step")}


# ---------------------------------------------------------------- SDPA's kernels, NCCL's transports, the summary

def test_the_sdpa_kernels_that_ran_are_read_from_the_profiler():
    q = torch.randn(2, 2, 8, 4)
    assert sdpa_kernels_run(lambda: F.scaled_dot_product_attention(q, q, q)) == {"FLASH_ATTENTION": 1}  # CPU's flash
    assert sdpa_kernels_run(lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)) == {"MATH": 1}
    twice = sdpa_kernels_run(lambda: [F.scaled_dot_product_attention(q, q, q, dropout_p=0.1) for _ in range(2)])
    assert twice == {"MATH": 2} and sdpa_kernels_run(lambda: q @ q.transpose(-1, -2)) == {}


NCCL_LOG = """\
gpu01:2817:2817 [0] NCCL INFO Pattern 4, crossNic 0, nChannels 24, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1
gpu01:2817:2817 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu01:2818:2818 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu01:2818:2818 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/IPC
gpu01:2818:2818 [1] NCCL INFO Channel 01 : 1[1] -> 0[0] via SHM/direct/direct
"""


def test_nccl_transports_are_read_from_its_debug_lines():
    found = nccl_transports(NCCL_LOG)
    assert found["connections"] == {"P2P/CUMEM": 2, "P2P/IPC": 1, "SHM/direct": 1} and found["paths"] == {"NVL": 1}
    assert transport_problems(found) == [] and "(NVLink)" in describe_transports(found)
    net = nccl_transports(NCCL_LOG + "gpu01:2817:2817 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[1] [send] via "
                                     "NET/Socket/0\ngpu01:2817:2817 [0] NCCL INFO Channel 02/0 : 1[1] -> 0[0] "
                                     "[receive] via NET/IB/0/GDRDMA\n")
    assert net["connections"]["NET/Socket"] == 1 and net["connections"]["NET/IB"] == 1
    assert transport_problems(net) == ["1 connection(s) via NET/Socket between GPUs of one node",
                                       "1 connection(s) via NET/IB between GPUs of one node"]
    assert transport_problems(net, nodes=2) == []  # across nodes the network is the way
    assert "no NCCL connection lines" in transport_problems(nccl_transports("NCCL INFO Bootstrap : Using eth0"))[0]
    pcie = nccl_transports(NCCL_LOG.replace("type NVL/PIX", "type PIX/PIX"))
    assert "no NVLink path" in describe_transports(pcie)


def test_the_summary_names_the_machine_each_check_and_the_budget():
    env = {"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1, "driver": "580.1", "torch": "2.11.0+cu130", "cuda": "13.0",
           "nccl": "2.27.7", "deepspeed": "0.19.8", "python": "3.12.3", "commit": "abc1234"}
    rows = [{"name": "test_paper_shape_update_memory_and_throughput[bl_base]", "outcome": "passed", "seconds": 61.2,
             "numbers": {"tokens/s": "512,000 (floor 370,209, plan 740,419)", "MFU": "31.1% (plan 0.45)"}},
            {"name": "test_base_pretraining_with_fused_adam_over_nccl[bf16-BF16_Optimizer]", "outcome": "skipped",
             "seconds": 0.0, "numbers": {}, "reason": "needs 2+ GPUs (1 here): would test, over NCCL, ..."},
            {"name": "test_the_pipeline_in_bf16_on_gpus[one_job]", "outcome": "failed", "seconds": 500.0}]
    text = summary(env, rows).splitlines()
    assert text[1] == ("GPU: NVIDIA H100 80GB HBM3 x 1; driver 580.1; torch 2.11.0+cu130 (CUDA 13.0, NCCL 2.27.7); "
                       "DeepSpeed 0.19.8; Python 3.12.3; mm-ds abc1234")
    assert text[2] == ("PASSED  test_paper_shape_update_memory_and_throughput[bl_base] (61 s): tokens/s 512,000 (floor "
                       "370,209, plan 740,419); MFU 31.1% (plan 0.45)")
    assert text[3].startswith("SKIPPED") and text[3].endswith("[needs 2+ GPUs (1 here): would test, over NCCL, ...]")
    assert text[-2] == "1 passed, 1 failed, 1 skipped in 9.4 min - OVER the 8-minute budget of one GPU"
    assert "OVER" not in summary(env, rows[:2])

"""The GPU suite's checks that need no GPU (tests/gpu_checks.py), run on CPU: each fails when it should, and sees
on CPU what tests/gpu/test_gpu.py will show it on the GPUs. The suite itself must import and skip here, and keep
what its source promises: an unknown GPU's skip after its other checks, the pipeline run per stage too."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend

from gpu_checks import attention_calls, frozen_mismatches, fused_attention_problems, sdpa_backend

ROOT = Path(__file__).resolve().parents[1]
GPU_SUITE = ROOT / "tests" / "gpu" / "test_gpu.py"


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
    from mm_ds.runtime.ds_config import Geometry

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
    assert "7 skipped" in proc.stdout and "needs CUDA GPUs" in proc.stdout, proc.stdout[-2000:]


# ---------------------------------------------------------------- the GPU suite's own structure, read from its source

def gpu_suite() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(GPU_SUITE.read_text())
    return {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]


def test_an_unknown_gpu_skips_only_after_every_check_that_needs_no_peak():
    """A GPU missing from the peak table (MFU NaN) still runs every check of its test that does not need the
    peak: a skip inside a GPU test has only MFU's asserts after it, and no test is skipped whole for the peak."""
    skips = 0
    for name, test in gpu_suite().items():
        assert not any("peak" in ast.unparse(d).lower() for d in test.decorator_list), name
        for skip in calls(test, "pytest.skip"):
            skips += 1
            later = [ast.unparse(a) for a in ast.walk(test) if isinstance(a, ast.Assert) and a.lineno > skip.lineno]
            assert all("mfu" in a for a in later), f"{name}: asserts after the skip on line {skip.lineno}: {later}"
    assert skips, "the suite no longer skips for a GPU whose peak is unknown (mm_ds/runtime/peaks.py)"


def test_the_gpu_pipeline_tests_run_per_stage_as_well_as_one_job():
    """The paper recipe runs each stage as a launch of its own (`per_stage`): the miniature pipeline on the GPUs
    runs that way too, not only as one job."""
    suite = gpu_suite()
    pipeline = {name: test for name, test in suite.items() if name.startswith("test_") and calls(test, "_recipe")}
    assert len(pipeline) >= 2, list(pipeline)
    for name, test in pipeline.items():
        params = [d for d in test.decorator_list if isinstance(d, ast.Call)
                  and ast.unparse(d.func) == "pytest.mark.parametrize" and ast.literal_eval(d.args[0]) == "mode"]
        modes = ast.literal_eval(params[0].args[1]) if params else []
        assert {"per_stage", "one_job"} <= set(modes), f"{name}: modes {modes}"
        assert all(ast.unparse(c.args[0]) == "mode" for c in calls(test, "_recipe")), name
    assert "'mode': mode" in ast.unparse(suite["_recipe"]), "_recipe must pass the test's mode to the recipe"

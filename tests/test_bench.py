"""`mm-ds bench` on the tiny preset: every stage runs through the real engine step and the JSON report has
every field with sane values. No timing assertions: the speed targets are the benchmark's business."""

import json
import math
import statistics
import subprocess
import sys

import pytest

from mm_ds.tools.bench import bench
from mm_ds.tools.bench import host as bench_host
from mm_ds.tools.bench import pairs as bench_pairs

COMPILED = ("pretrain", "adapt_mini")
"""The stages the bench test times compiled against eager: Step 1 (its target) and the mini-model's Step 2."""
STAGE_FIELDS = ("step_time_s", "tokens_per_s", "flops_per_step", "tflops", "mfu", "loader_share", "cpu_share",
                "peak_rss_bytes", "trainable_params", "total_params", "layers", "losses", "step_times")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    # A fresh process: the bench initialises a (one-rank) process group and sets the thread count.
    # train.compile with aot_eager: its graphs compile in seconds (inductor's kernels are tests/test_compile.py's),
    # for two stages (each compiled stage costs make test ~12 CPU-seconds; every kind compiles in test_compile.py).
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "bench", "--preset", "tiny", "--steps", "2",
                           "--warmup", "1", "--micro-batch", "2", "--seq", "64", "--corpus-mb", "0.5", "--json", str(out),
                           "--quiet", "--compile", "aot_eager", "--compile-stages", *COMPILED, "--profile"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.ranks
def test_every_stage_is_timed_with_sane_numbers(report):
    rep, _ = report
    assert set(rep["stages"]) == set(bench.STAGES)
    for name, r in rep["stages"].items():
        for f in STAGE_FIELDS:
            assert f in r, f"{name}: {f} missing"
        assert len(r["step_times"]) == 2 and len(r["losses"]) == 3
        assert r["step_time_s"] > 0 and r["tokens_per_s"] == pytest.approx(2 * 64 / r["step_time_s"])
        assert r["flops_per_step"] > 0 and 0 < r["mfu"] < 5  # a measured peak can be beaten a little, not 5x
        assert 0 <= r["loader_share"] < 1 and 0 < r["cpu_share"] <= 1.5
        assert r["peak_rss_bytes"] > 50 * 2 ** 20
        assert 0 < r["trainable_params"] <= r["total_params"]
        assert all(math.isfinite(x) for x in r["losses"])


@pytest.mark.ranks
def test_stages_train_the_right_parameters(report):
    s = report[0]["stages"]
    assert s["pretrain"]["trainable_params"] == s["pretrain"]["total_params"]
    # Step 2: only the language group (tied embeddings + output bias) trains, over either body.
    assert s["adapt_full"]["trainable_params"] == s["adapt_mini"]["trainable_params"]
    assert s["adapt_full"]["trainable_params"] < s["adapt_full"]["total_params"] / 2
    assert s["adapt_mini"]["layers"] == bench.PRESETS["tiny"].mini_layers
    assert s["build_mini"]["layers"] == bench.PRESETS["tiny"].mini_layers + bench.PRESETS["tiny"].new_layers
    assert s["finetune"]["trainable_params"] < s["finetune"]["total_params"]  # token embeddings frozen
    # The paper's formulas: a secondary head costs more than one head; Step 2 over fewer layers costs less.
    assert s["pretrain_secondary"]["flops_per_step"] > s["pretrain"]["flops_per_step"]
    assert s["adapt_mini"]["flops_per_step"] < s["adapt_full"]["flops_per_step"]


@pytest.mark.ranks
def test_setup_peak_prepare_peer_and_targets_are_reported(report):
    rep, stdout = report
    setup = rep["setup"]
    for f in ("preset", "hidden", "layers", "vocab", "seq", "micro_batch", "threads", "torch", "deepspeed",
              "load_avg_start", "load_avg_end", "ds_config"):
        assert f in setup, f
    assert setup["seq"] == 64 and setup["micro_batch"] == 2
    # on CPU: the CPU's own figures, with what they were measured on and against
    assert (setup["device"], setup["precision"], setup["gpu"]) == ("cpu", "fp32", None)
    assert rep["peak"]["used_flops"] > 1e9 and rep["peak"]["source"].startswith("measured")
    assert all(r["peak_gpu_bytes"] is None for r in rep["stages"].values())
    enc = rep["prepare"]
    assert enc["prepare_bytes_per_s"] > 0 and enc["single_process_bytes_per_s"] > 0 and enc["ratio"] > 0
    assert [len(v) for v in enc["in_turn_s"].values()] == [3, 3]  # both sides timed in turn, three times each
    assert enc["prepare_encode_s"] == statistics.median(enc["in_turn_s"]["prepare"])
    if rep["peer_note"] is None:  # transformers installed: the peer ran the same batches
        assert set(rep["peer"]) == set(bench.PEER_STAGES)
        for r in rep["peer"].values():
            assert r["tokens_per_s"] > 0 and all(math.isfinite(x) for x in r["losses"])
        assert set(rep["pairs"]) == set(bench_pairs.PAIRS)  # every ratio target timed in turn
    assert set(rep["pairs"]) >= {"a3_speedup"}
    for target, p in rep["pairs"].items():
        (_, a), (_, b) = p["sides"].items()
        assert len(a["step_times"]) == len(b["step_times"]) == 2
        assert p["ratio"] == pytest.approx(a["tokens_per_s"] / b["tokens_per_s"])
        assert next(t for t in rep["targets"] if t["target"] == target)["detail"].endswith("in turn")
    keys = {t["target"] for t in rep["targets"]}
    assert {"a3_speedup", "mfu_pretrain", "prepare_encode", "loader_share", "host_side"} <= keys
    assert "mfu_plan" not in keys  # a GPU's target
    host = rep["host"]
    assert set(host["rows"]) == {"pretrain", "adapt_mini"}  # as `mm-ds run paper` launches them (8 GPUs):
    shapes = [(r["micro_batch"], r["grad_accum"], r["seq"]) for r in host["rows"].values()]
    assert shapes == [(32, 8, 512), (64, 4, 512)]
    assert 0 < host["loop_vocab"] <= bench_host.HOST_VOCAB  # the loop's model sheds the vocabulary's size
    for r in host["rows"].values():
        assert r["device_s"] > 0 and r["loop_s"] > 0 and r["builder_s"] > 0
        assert r["loop_share"] == pytest.approx(r["loop_s"] / r["device_s"])
        assert len(r["loop_rounds_s"]) == host["rounds"] and r["loop_s"] == statistics.median(r["loop_rounds_s"])
    # the analytic device time per sequence: A1 over 12 layers costs more than A3 over the 4-layer mini-model
    per_sequence = {name: r["device_s"] / r["micro_batch"] for name, r in host["rows"].items()}
    assert per_sequence["pretrain"] > 2 * per_sequence["adapt_mini"]
    assert "host side per micro-step" in stdout
    assert {"compile_pretrain", "host_side_compiled"} <= keys
    for r in host["rows"].values():  # the compiled loop, in the same rounds
        assert len(r["loop_compiled_rounds_s"]) == host["rounds"] and r["loop_compiled_s"] > 0
        assert r["loop_compiled_share"] == pytest.approx(r["loop_compiled_s"] / r["device_s"])
    assert all(t["pass"] in (True, False) for t in rep["targets"])
    assert "PASS" in stdout or "FAIL" in stdout
    assert "| Step 2, mini-model" in stdout


@pytest.mark.ranks
def test_every_stage_is_timed_compiled_against_eager_in_turn(report):
    rep, stdout = report
    assert set(rep["compiled"]) == set(COMPILED)
    for name, c in rep["compiled"].items():
        e, k = c["sides"]["eager"], c["sides"]["compiled"]
        assert len(e["step_times"]) == len(k["step_times"]) == 2 and len(k["losses"]) == 4  # one more warm-up
        assert c["ratio"] == pytest.approx(e["step_time_s"] / k["step_time_s"])
        assert e["losses"][0] == k["losses"][0], name  # the same weights and batch; aot_eager: the same kernels
        assert c["graph_breaks"] == 0 and 1 <= c["graphs"] <= 2 and c["compile_s"] > 0, (name, c)
    assert "train.compile (aot_eager) against eager" in stdout


@pytest.mark.ranks
def test_the_profile_puts_an_update_in_parts_that_add_up(report):
    rep, stdout = report
    prof = rep["profile"]
    assert set(prof["sides"]) == {"eager", "compiled"}
    for side in prof["sides"].values():
        parts = side["parts"]
        assert all(parts[p] > 0 for p in ("layer matmuls", "attention", "vocabulary", "optimizer")), parts
        assert 0.5 * side["wall_s"] < sum(parts.values()) < 1.2 * side["wall_s"], side  # self times: each once
        assert set(side["phases"]) == {"forward", "backward", "step"}
    assert prof["flops"]["layer matmuls"] > prof["flops"]["vocabulary"] > 0
    assert "by part (bench_profile.py)" in stdout


def test_the_two_sides_of_a_ratio_step_in_turn():
    """A slow spell of the machine must hit both sides of a ratio: neither runs its updates in a block, and
    neither always goes first."""
    calls = []

    def stepper(name):
        def step(i):
            calls.append((name, i))
            return 1.0 + i, 0.0, 1.0, float(i)
        return step

    raw = bench_pairs.alternate({"a": stepper("a"), "b": stepper("b")}, warmup=1, steps=3)
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]
    assert raw["a"]["step_times"] == raw["b"]["step_times"] == [2.0, 3.0, 4.0]  # the warm-up is not timed
    assert raw["a"]["losses"] == [0.0, 1.0, 2.0, 3.0]


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="--stages nope"):
        bench.main(["--preset", "tiny", "--stages", "nope", "--no-peer"])
    with pytest.raises(ValueError, match="--seq 4096 exceeds"):
        bench.main(["--preset", "tiny", "--seq", "4096", "--no-peer"])


def fake_gpu(monkeypatch, name="NVIDIA H100 80GB HBM3"):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)


def settings(*argv):
    import argparse

    args = argparse.Namespace(device="auto", preset="base", stages=None, seq=None, ds_config=None, micro_batch=None,
                              steps=None, warmup=None, quiet=True, peak_tflops=None, compile="off", profile=False,
                              compile_stages=None)
    for flag, value in zip(argv[::2], argv[1::2]):
        setattr(args, flag, value)
    return bench._settings(args)


def test_on_a_gpu_the_bench_runs_the_paper_config_against_the_gpus_peak(monkeypatch):
    """`mm-ds bench` where torch sees a GPU (faked): the paper presets' bf16 engine JSON, Step 1's per-GPU micro
    batch, more updates, the datasheet's bf16 peak; the CPU-only parts off, the GPU's targets on."""
    from mm_ds.tools.bench import device as bench_device

    cpu = settings()
    assert (cpu.device.kind, cpu.ds_config, cpu.precision, cpu.micro, cpu.peak) == ("cpu", "fp32_zero1.json", "fp32",
                                                                                     2, None)
    fake_gpu(monkeypatch)
    gpu = settings()
    assert (gpu.device.kind, gpu.ds_config, gpu.precision) == ("cuda", "bf16_zero1.json", "bf16")
    assert (gpu.micro, gpu.steps, gpu.warmup) == (32, 10, 2) and not (gpu.device.peer or gpu.device.host)
    assert gpu.peak == {"used_flops": 989.4e12, "source": "datasheet, dense bf16", "gpu": "NVIDIA H100 80GB HBM3"}
    assert settings("micro_batch", 64, "ds_config", "fp32_zero1.json").peak["used_flops"] == 494.7e12  # TF32
    assert settings("peak_tflops", 500.0).peak["source"] == "--peak-tflops"
    assert settings("device", "cpu").device.kind == "cpu"  # the CPU bench on a GPU machine, when asked
    fake_gpu(monkeypatch, "NVIDIA B300")
    unknown = settings().peak
    assert unknown["used_flops"] != unknown["used_flops"] and "--peak-tflops" in unknown["source"]
    stages = {"pretrain": {"mfu": 0.40, "tflops": 396.0, "loader_share": 0.001, "flops_per_step": 1.0}}
    targets = bench.evaluate_targets(stages, {}, None, None, "cuda")
    assert [(t["target"], t["pass"]) for t in targets] == [("mfu_plan", False), ("loader_share", True)]
    assert "--measured-tflops 396" in targets[0]["detail"] and bench_device.PLAN_MFU == 0.45
    assert [t["target"] for t in bench.evaluate_targets(stages, {}, None, None, "cpu")] == ["mfu_pretrain",
                                                                                           "loader_share"]


def test_cuda_is_refused_where_torch_sees_no_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(ValueError, match="--device cuda: torch .* sees no CUDA GPU here"):
        settings("device", "cuda")

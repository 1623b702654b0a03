"""`mm-ds bench`'s speed targets: each a threshold on one figure of the run, judged on the devices whose row in
device.py's DEVICES names it (the CPU targets at the base shape on CPU; on a GPU, those a GPU can judge)."""

from __future__ import annotations

from . import device as bench_device
from . import host as bench_host

# Speed targets at the base shape, as (key, description, threshold).
TARGETS = (
    ("a3_speedup", "Step 2 mini vs full: speedup >= 90% of analytic A3 ratio", 0.90),
    ("peer_pretrain", "pretrain tokens/s >= 1.25x transformers", 1.25),
    ("peer_adapt_mini", "Step 2 mini tokens/s >= 1.6x transformers", 1.6),
    ("mfu_pretrain", "pretrain achieved FLOP/s >= 50% of matmul peak", 0.50),
    ("prepare_encode", "prepare encode >= 80% of 1-proc SentencePiece x workers", 0.80),
    ("loader_share", "loader < 2% of step time (every MLM stage)", 0.02),
    ("host_side", "host keeps an H100 busy: loop and batch builder each < 50% of its time per micro-step "
                  "(Step 1 BL_BASE, Step 2 MINIJOINT mini; bench_host.py)", bench_host.THRESHOLD),
    ("mfu_plan", f"GPU: pretrain MFU >= `mm-ds plan`'s assumed {bench_device.PLAN_MFU:g} (its hours hold here)",
     bench_device.PLAN_MFU),
    ("compile_pretrain", "train.compile: pretrain tokens/s >= eager's (in turn)", 1.0),
    ("host_side_compiled", "host keeps an H100 busy with train.compile: the compiled loop < 25% of its time per "
                           "micro-step (both shapes; bench_host.py)", bench_host.COMPILED_THRESHOLD),
)


def evaluate_targets(results: dict, pairs: dict, encode: dict | None, host: dict | None = None,
                     device: str = "cpu", compiled: dict | None = None) -> list[dict]:
    """Every speed target of `device` (bench_device.DEVICES) the run can judge; the ratio targets from `pairs`
    (pairs.py `measure`), train.compile's from `compiled` (compile_pairs.py `measure`)."""
    out, mine = [], bench_device.DEVICES[device].targets

    def add(key, value, ok, detail):
        desc, thr = next((d, t) for k, d, t in TARGETS if k == key)
        if key in mine:
            out.append({"target": key, "description": desc, "threshold": thr, "value": value,
                        "pass": None if ok is None else bool(ok), "detail": detail})

    if "a3_speedup" in pairs:
        measured = pairs["a3_speedup"]["ratio"]
        analytic = results["adapt_full"]["flops_per_step"] / results["adapt_mini"]["flops_per_step"]
        add("a3_speedup", measured / analytic, measured / analytic >= 0.90,
            f"measured {measured:.2f}x vs analytic {analytic:.2f}x (need >= {0.9 * analytic:.2f}x), in turn")
    for key, thr in (("peer_pretrain", 1.25), ("peer_adapt_mini", 1.6)):
        if key in pairs:
            (_, a), (_, b) = pairs[key]["sides"].items()
            ratio = pairs[key]["ratio"]
            add(key, ratio, ratio >= thr, f"{a['tokens_per_s']:.0f} vs {b['tokens_per_s']:.0f} tokens/s = "
                                          f"{ratio:.2f}x, in turn")
    if "pretrain" in results:
        m, tflops = results["pretrain"]["mfu"], results["pretrain"]["tflops"]
        add("mfu_pretrain", m, m >= 0.5, f"{tflops * 1e3:.1f} GFLOP/s = {100 * m:.1f}% of peak")
        add("mfu_plan", m, m >= bench_device.PLAN_MFU if m == m else None,
            f"{tflops:.1f} TFLOP/s = {100 * m:.1f}% of the GPU's peak (`mm-ds plan --measured-tflops {tflops:.0f}`)")
    if encode:
        add("prepare_encode", encode["ratio"], encode["ratio"] >= 0.8,
            f"{encode['prepare_bytes_per_s'] / 2**20:.2f} MiB/s with {encode['workers']} workers vs "
            f"{encode['single_process_bytes_per_s'] / 2**20:.2f} MiB/s single-process = {encode['ratio']:.2f}")
    mlm = {k: v for k, v in results.items() if k != "finetune"}
    if mlm:
        worst = max(mlm, key=lambda k: mlm[k]["loader_share"])
        share = mlm[worst]["loader_share"]
        add("loader_share", share, share < 0.02, f"worst: {worst} {100 * share:.2f}% of step time")
    if host:
        share, what = bench_host.worst_share(host)
        add("host_side", share, share < bench_host.THRESHOLD, f"worst: {what} = {100 * share:.0f}%")
        if host.get("backend"):
            share, r = max((r["loop_compiled_share"], r) for r in host["rows"].values())
            add("host_side_compiled", share, share < bench_host.COMPILED_THRESHOLD,
                f"worst: {r['what']}: {1e3 * r['loop_compiled_s']:.2f} ms vs device {1e3 * r['device_s']:.2f} ms = "
                f"{100 * share:.0f}% (eager {100 * r['loop_share']:.0f}%)")
    if compiled and "pretrain" in compiled:
        c = compiled["pretrain"]
        add("compile_pretrain", c["ratio"], c["ratio"] >= 1.0,
            f"{c['sides']['compiled']['tokens_per_s']:.0f} vs {c['sides']['eager']['tokens_per_s']:.0f} tokens/s = "
            f"{c['ratio']:.2f}x ({c['backend']}), in turn")
    return out

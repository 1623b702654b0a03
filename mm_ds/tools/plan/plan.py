"""`mm-ds plan`: time, GPU-hours and disk of a recipe's stages on a cluster you do not have yet.

    mm-ds plan                                   # the paper recipe on 4 nodes x 8 H100 (989 TFLOP/s bf16, MFU 0.45)
    mm-ds plan paper --nodes 4 --gpus-per-node 8 --usd-per-gpu-hour 2.5 --time-limit 48h   # a budget
    mm-ds plan paper --nodes 2 --gpus-per-node 8 --peak-tflops 312 --mfu 0.4 --inter-gbps 22
    mm-ds plan --bench bench.json                # also: the compute model against `mm-ds bench` measurements
    mm-ds plan --bench bench-gpu.json            # ... and the cluster at a GPU's measured rate (bench on cuda)

Per optimizer step of each stage:

compute   the paper's analytic FLOPs (mm_ds.model.flops: A1, A1 + secondary head, A3, A4) / (GPUs x peak x MFU).
comm      data-parallel traffic per GPU: the collectives DeepSpeed 0.19.8 makes in one update (read in its source,
          recorded on 2 CPU ranks by tests/test_reduction_dtype.py), T trainable and P parameters, A micro-steps:
          ZeRO-0 all-reduces T gradients; ZeRO-1 (BF16_Optimizer under bf16) too, then all-gathers the T new
          weights; ZeRO-2 all-reduces T gradients on *every micro-step*, then all-gathers T weights; ZeRO-3
          reduce-scatters T gradients on every micro-step and all-gathers all P weights (frozen ones too) in
          every forward pass, those of at most 1e5 elements once per update (a lower bound: a weight released
          between forward and backward is gathered twice). Gradients travel in the reduction dtype
          (`--comm-dtype`; fp32 under bf16, mm-ds's communication_data_type), weights in the training dtype; a
          GPU sends 2(n-1)/n of an all-reduced tensor's bytes, (n-1)/n of a reduce-scattered or gathered one.
          Step 2 trains only the language group (38.45M values at the base shape instead of 125M).
          Time = bytes per GPU / bus bandwidth (nccl-tests' busbw, GB/s): the intra-node figure on one node,
          the inter-node figure across nodes (a ring is as fast as its slowest link). `--overlap` hides
          that share of it behind the backward pass (0 = none, the conservative default).
disk      an engine checkpoint holds the weights in the training dtype plus, for trainable parameters,
          fp32 master weights and two Adam moments (12 bytes each); final/ holds fp32 weights. The
          checkpoint schedule is each stage's (train.checkpoint_steps, every train.checkpoint_every, the last).

A stage's micro-steps A per update follow from its config's micro batch (`--micro-batch` sets one for every stage), at
most a GPU's share of the global batch (mm_ds/runtime/training/ds_config.py `split`), as `mm-ds run` launches it.

Parameter counts are mm_ds.model.model's (`param_count`: FFN 4h, positions s+2, tied output projection, a bias of V
per head). The model is mm_ds/tools/plan/model.py's.

The table prices each system's stages once (one language's Step 2). The totals (mm_ds/tools/plan/totals.py) price
the whole recipe as `mm-ds run` runs it: every stage run of its stage list, every language, Step 3's finetunings as
single-GPU runs packed onto the cluster, Step 4 and the alignment check; and say whether `mm-ds run --check` would
refuse the recipe at the cluster's size. Side by side (`--spread G`, default one group per node: `mm-ds run`'s
`launch.spread`) prices a step's runs on G groups of nodes at once against one after another on every GPU.

The budget (mm_ds/tools/plan/budget.py): wall time, GPU-hours and USD (`--usd-per-gpu-hour`) with start-ups
(`--startup-s` per launch: its default and where it comes from are there), the jobs it takes when each may run at
most `--time-limit`, each at the MFUs of `--mfu-range` (default 0.5x, 1x, 1.5x `--mfu`), one after another and
side by side; and the data preparation before the allocation. The default tables fit 120 columns; `--wide` prints
every column of the stage table.

Checking the compute part here. `--bench FILE` reads `mm-ds bench --json FILE` output (any JSON holding
`stages: {name: {kind?, flops_per_step, step_time_s}}` and `peak: {used_flops}` works) and prints, per stage
kind, the measured step time against the estimate at the plan's MFU (against the bench's peak: on CPU the
matmul rate measured in that run, on a GPU its datasheet rate in the training dtype) and against an estimate
calibrated on the measured pretraining MFU: the latter checks that the FLOPs formulas predict the *relative*
cost of the stages. A GPU's bench (`mm-ds bench --device cuda` on the target GPU, the paper presets' bf16) also
gives the cluster's step times at its measured Step 1 rate, as `--measured-tflops X` does for any one measured
per-GPU throughput.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

from ...pipeline.costs import add_recipe_args, costs_from_args, stage_run_costs
from .budget import STARTUP_S, budget, format_budget, format_prepare, mfu_range, parse_duration, prepare_times
from .model import (  # noqa: F401
    BYTES,
    PERSISTENCE,
    RING,
    Cluster,
    ParamCount,
    StagePlan,
    collectives_per_step,
    comm_bytes_per_step,
    plan_stages,
    stage_params,
)
from .resume import format_resume
from .totals import EvalPlan, format_evaluation, format_totals, plan_evaluation, recipe_phases, refusals, totals_json  # noqa: F401

# ---------------------------------------------------------------- output

WIDTH = 120
"""The default output's width, in characters; `--wide` prints every column of the stage table."""


def wrap(text: str, indent: str = "  ") -> str:
    """A long line (a sentence, an error) folded to WIDTH: tables are built to fit it, prose is folded."""
    return textwrap.fill(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def hours(h: float) -> str:
    return f"{h:.{1 if abs(h) >= 1 or h == 0 else 2}f}"


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def _table(cols: list[str], rows: list[list[str]], right: int | None = None) -> list[str]:
    """A markdown table; `right`: the columns from that index on are numbers, aligned right."""
    align = "|" + "".join("---:|" if right is not None and i >= right else "---|" for i in range(len(cols)))
    return ["| " + " | ".join(cols) + " |", align] + ["| " + " | ".join(r) + " |" for r in rows]


def format_plan(rows: list[StagePlan], c: Cluster, wide: bool = False) -> str:
    head = (f"cluster: {c.nodes} node(s) x {c.gpus_per_node} GPUs = {c.gpus}; peak {c.peak_tflops:g} TFLOP/s/GPU "
            f"at MFU {c.mfu:g}; {c.dtype} (gradients reduced in {c.reduction_dtype}), ZeRO-{c.zero}, micro batch "
            f"{c.micro_batch or 'of each stage'} (per GPU, at most); all-reduce busbw "
            f"{c.intra_gbps:g} GB/s intra-node, {c.inter_gbps:g} GB/s inter-node (using "
            f"{c.busbw / 1e9:g}); overlap {c.overlap:g}")
    usd = c.usd_per_gpu_hour
    if wide:
        cols = ["system", "step", "formula", "layers", "params M", "trainable M", "steps", "micro", "accum",
                "PFLOP/step", "compute s", "comm GB/GPU", "comm s", "step s", "hours", "GPU-h", *(["USD"] if usd else []),
                "ckpt GB", "x ckpts", "final GB"]
        cells = [[r.system, r.step, r.formula, str(r.layers), f"{r.params / 1e6:.1f}", f"{r.trainable / 1e6:.2f}",
                  f"{r.steps:,}", str(r.micro_batch), str(r.grad_accum), f"{r.flops_per_step / 1e15:.2f}",
                  f"{r.compute_s:.3f}", _gb(r.comm_bytes), f"{r.comm_s:.4f}", f"{r.step_s:.3f}", f"{r.hours:.1f}",
                  f"{r.gpu_hours:,.0f}", *([f"{r.usd:,.0f}"] if usd else []), _gb(r.ckpt_bytes), str(r.checkpoints),
                  _gb(r.final_bytes)] for r in rows]
    else:  # the same numbers, fewer columns: compute + communication per step, checkpoints as size x count
        cols = ["system", "step", "layers", "train M", "steps", "micro x acc", "step s (compute+comm)",
                "hours", "GPU-h", *(["USD"] if usd else []), "ckpt GB x n"]
        cells = [[r.system, r.step, str(r.layers), f"{r.trainable / 1e6:.2f}", f"{r.steps:,}",
                  f"{r.micro_batch} x {r.grad_accum}", f"{r.step_s:.3f} ({r.compute_s:.3f}+{r.comm_s:.3f})",
                  f"{r.hours:.1f}", f"{r.gpu_hours:,.0f}", *([f"{r.usd:,.0f}"] if usd else []),
                  f"{_gb(r.ckpt_bytes)} x {r.checkpoints}"] for r in rows]
    lines = [head if wide else wrap(head), "", *_table(cols, cells), ""]
    for system in dict.fromkeys(r.system for r in rows):
        rs = [r for r in rows if r.system == system]
        s2 = [r for r in rs if r.step == "step2"]
        disk = sum(r.ckpt_bytes * r.checkpoints + r.final_bytes for r in rs)
        usd_all = f", {sum(r.usd for r in rs):,.0f} USD" if usd else ""
        lines.append(f"{system}: {sum(r.hours for r in rs):.1f} h, {sum(r.gpu_hours for r in rs):,.0f} GPU-h{usd_all} "
                     f"in all; Step 2 (per new language) {sum(r.hours for r in s2):.1f} h = "
                     f"{sum(r.gpu_hours for r in s2):,.0f} GPU-h; checkpoints {disk / 1e9:.0f} GB")
    return "\n".join(lines)


def format_spread(one: list, side: list, c: Cluster, spread: int) -> str:
    """Each step one after another on every GPU against side by side on `spread` groups (plan_totals.StepTotal)."""
    rows = [[a.step, f"{a.runs:,}", hours(a.hours), f"{a.gpu_hours:,.0f}", hours(b.hours), f"{b.gpu_hours:,.0f}",
             hours(a.hours - b.hours)] for a, b in zip(one, side) if a.step in ("Step 1", "Step 1b", "Step 2")]
    saved = sum(a.hours for a in one) - sum(b.hours for b in side)
    n = c.nodes // spread
    return "\n".join([wrap(f"side by side (`mm-ds run ... --launch spread={spread}`): a step of at least {spread} runs "
                            f"on {spread} groups of {n} node(s) = {n * c.gpus_per_node} GPUs at once, each run's "
                            f"communication inside its group; against one after another on all {c.gpus} GPUs:"),
                       *_table(["step", "runs", "one after another h", "GPU-h", "side by side h", "GPU-h", "saves h"],
                               rows, right=1),
                       f"side by side saves {hours(saved)} h = {saved * c.gpus:,.0f} GPU-h of the whole recipe"
                       + (f" ({saved * c.gpus * c.usd_per_gpu_hour:,.0f} USD)" if c.usd_per_gpu_hour else "")])


# ---------------------------------------------------------------- the compute model against measurements

_BENCH_KIND = {"adapt_full": "adapt", "adapt_mini": "adapt"}


def read_bench(path: str | Path) -> tuple[float | None, list[dict], dict]:
    """(peak FLOP/s of the run or None, [{name, formula, flops_per_step, step_time_s}], {device, gpu, precision,
    peak_source}) of an `mm-ds bench --json`: a CPU run's peak is its measured matmul rate, a GPU run's the GPU's
    datasheet rate in its training dtype (mm_ds/tools/bench/device.py)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--bench {path}: cannot read it as JSON ({e})") from None
    stages = data.get("stages")
    if isinstance(stages, dict):
        stages = [{"name": k, **v} for k, v in stages.items()]
    if not isinstance(stages, list) or not stages:
        raise ValueError(f"--bench {path}: expected `stages` (a mapping or list of stage results) as `mm-ds bench "
                         f"--json` writes it")
    rows = []
    for r in stages:
        if "flops_per_step" not in r or "step_time_s" not in r:
            raise ValueError(f"--bench {path}: stage {r.get('name', r)!r} lacks flops_per_step or step_time_s")
        name = r.get("name", r.get("kind", "?"))
        rows.append({"name": name, "formula": r.get("kind") or _BENCH_KIND.get(name, name),  # bench's name for it
                     "flops_per_step": float(r["flops_per_step"]), "step_time_s": float(r["step_time_s"])})
    peak = data.get("peak", {})
    source = peak.get("source") if isinstance(peak, dict) else None
    peak = peak.get("used_flops") if isinstance(peak, dict) else None
    peak = peak or (data.get("peak_tflops") and data["peak_tflops"] * 1e12)
    setup = data.get("setup") if isinstance(data.get("setup"), dict) else {}
    about = {"device": setup.get("device", "cpu"), "gpu": setup.get("gpu"),
             "precision": setup.get("precision") or setup.get("dtype"), "peak_source": source}
    peak = float(peak) if peak and float(peak) == float(peak) else None  # NaN: a GPU whose peak bench did not know
    return peak, rows, about


def _bench_head(peak: float | None, about: dict, plan_peak_tflops: float) -> list[str]:
    if about.get("device") != "cuda":
        return [f"compute model vs `mm-ds bench` (peak {peak / 1e12:.3f} TFLOP/s measured in that run)" if peak else
                "compute model vs `mm-ds bench` (no peak in the file: calibrated estimate only)"]
    gpu = f"{about.get('gpu') or 'a GPU'}, {about.get('precision') or '?'}"
    if not peak:
        return [f"compute model vs `mm-ds bench` on {gpu} (its peak unknown: calibrated estimate only)"]
    lines = [f"compute model vs `mm-ds bench` on {gpu}: peak {peak / 1e12:g} TFLOP/s ({about.get('peak_source')})"]
    if abs(peak / 1e12 - plan_peak_tflops) > 0.01 * plan_peak_tflops:
        lines.append(f"note: this plan prices GPUs of {plan_peak_tflops:g} TFLOP/s; for this bench's GPU pass "
                     f"--peak-tflops {peak / 1e12:g}")
    return lines


def bench_check(peak: float | None, bench: list[dict], mfu: float, about: dict | None = None,
                plan_peak_tflops: float = Cluster.peak_tflops) -> str:
    """Estimated vs measured step time of each benchmarked stage on the machine that ran the benchmark (a CPU, or
    the GPU `mm-ds bench` ran on: then the estimate at the plan's MFU is the plan's own for that GPU)."""
    ref = next((r for r in bench if r["formula"] == "pretrain"), bench[0])
    ref_mfu = ref["flops_per_step"] / ref["step_time_s"] / peak if peak else None
    lines = _bench_head(peak, about or {}, plan_peak_tflops) + [
             "| stage | formula | GFLOP/step | measured s | TFLOP/s | MFU | est. s at plan MFU | est. s calibrated "
             f"on {ref['name']} | measured / calibrated |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in bench:
        achieved = r["flops_per_step"] / r["step_time_s"]
        est = f"{r['flops_per_step'] / (peak * mfu):.3f}" if peak else "-"
        # The same achieved FLOP/s as the reference stage: how well the formulas predict relative cost.
        cal = r["flops_per_step"] / (ref["flops_per_step"] / ref["step_time_s"])
        lines.append(f"| {r['name']} | {r['formula']} | {r['flops_per_step'] / 1e9:.1f} | {r['step_time_s']:.3f} | "
                     f"{achieved / 1e12:.4f} | {f'{achieved / peak:.1%}' if peak else '-'} | {est} | {cal:.3f} | "
                     f"{r['step_time_s'] / cal:.2f} |")
    if ref_mfu is not None:
        lines.append(f"measured MFU of {ref['name']}: {ref_mfu:.1%} against the plan's {mfu:.0%}; a ratio above 1 in "
                     f"the last column means the stage runs below the reference's efficiency (the plan's "
                     f"estimate for it is optimistic by that factor)")
    return "\n".join(lines)


def bench_tflops(bench: list[dict]) -> float:
    """TFLOP/s the benchmark's reference stage (Step 1 where it ran) achieved: a GPU bench's per-GPU rate."""
    ref = next((r for r in bench if r["formula"] == "pretrain"), bench[0])
    return ref["flops_per_step"] / ref["step_time_s"] / 1e12


def measured_check(rows: list[StagePlan], c: Cluster, tflops: float) -> str:
    lines = [f"compute at a measured {tflops:g} TFLOP/s per GPU (MFU {tflops / c.peak_tflops:.1%} of "
             f"{c.peak_tflops:g}) vs the plan's {c.mfu:g}:",
             "| system | step | est. compute s/step | at measured s/step | est. hours | at measured hours |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        meas = r.flops_per_step / (c.gpus * tflops * 1e12)
        step = meas + (1 - c.overlap) * r.comm_s
        lines.append(f"| {r.system} | {r.step} | {r.compute_s:.3f} | {meas:.3f} | {r.hours:.1f} | "
                     f"{step * r.steps / 3600:.1f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mm-ds plan", description="estimate time, GPU-hours, money and disk of each stage "
                                 "of a recipe on a GPU cluster (see the module docstring for the model)")
    add_recipe_args(ap)
    d = Cluster()
    ap.add_argument("--nodes", type=int, default=d.nodes)
    ap.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    ap.add_argument("--peak-tflops", type=float, default=d.peak_tflops, help="per GPU, training dtype")
    ap.add_argument("--mfu", type=float, default=d.mfu, help="assumed model FLOPs utilisation")
    ap.add_argument("--mfu-range", help="MFUs the budget is priced at, comma-separated (default: 0.5x, 1x, 1.5x --mfu)")
    ap.add_argument("--intra-gbps", type=float, default=d.intra_gbps,
                    help="intra-node all-reduce bus bandwidth, GB/s (gigabytes) per GPU")
    ap.add_argument("--inter-gbps", type=float, default=d.inter_gbps,
                    help="inter-node all-reduce bus bandwidth, GB/s (gigabytes) per GPU")
    ap.add_argument("--zero", type=int, default=d.zero, help="ZeRO stage 0-3")
    ap.add_argument("--dtype", default=d.dtype, choices=sorted(BYTES))
    ap.add_argument("--comm-dtype", default=d.comm_dtype, choices=sorted(BYTES),
                    help="gradient reduction dtype (communication_data_type; default: fp32 under bf16, else --dtype)")
    ap.add_argument("--micro-batch", type=int, default=d.micro_batch,
                    help="sequences per GPU per forward pass, at most, for every stage (default: each stage's own)")
    ap.add_argument("--overlap", type=float, default=d.overlap, help="share of communication hidden (0-1)")
    ap.add_argument("--usd-per-gpu-hour", type=float, help="print cost in USD at this price")
    ap.add_argument("--time-limit", help="a job's time limit (48h, 90m, 2d, SLURM's 2-00:00:00): count the jobs")
    ap.add_argument("--startup-s", type=float, default=STARTUP_S,
                    help="seconds a launch costs before training (default: measured on CPU, see plan_budget.py)")
    ap.add_argument("--spread", type=int, help="groups of nodes for side-by-side runs (launch.spread; default: one "
                    "per node; 1: none)")
    ap.add_argument("--wide", action="store_true", help="every column of the stage table (wider than 120)")
    ap.add_argument("--measured-tflops", type=float, help="measured per-GPU TFLOP/s: print step times at it")
    ap.add_argument("--bench", help="`mm-ds bench --json` output: check the compute model against it")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of tables")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        recipe, cfgs, costs = costs_from_args(a)
        cluster = Cluster(a.nodes, a.gpus_per_node, a.peak_tflops, a.mfu, a.intra_gbps, a.inter_gbps, a.zero,
                          a.dtype, a.comm_dtype, a.micro_batch, a.overlap, a.usd_per_gpu_hour)
        rows = plan_stages(costs, cluster)
        runs = stage_run_costs(recipe, cfgs)
        evaluation = plan_evaluation(recipe, cluster, cfgs)
        phases = recipe_phases(recipe, cfgs, cluster, evaluation, 1, runs)
        totals, refused = [p.total(cluster.gpus) for p in phases], refusals(recipe, cfgs, cluster.gpus)
        spread = _spread(a.spread, cluster)
        side = _side_by_side(recipe, cfgs, cluster, evaluation, spread, runs)
        limit = parse_duration(a.time_limit) if a.time_limit else None
        if a.startup_s < 0:
            raise ValueError(f"--startup-s must be >= 0, got {a.startup_s}")
        spreads = [1] + ([spread] if isinstance(side, list) else [])
        money = [budget(recipe, cfgs, cluster, m, g, limit, a.startup_s, runs)
                 for g in spreads for m in mfu_range(cluster.mfu, a.mfu_range)]
        prepare = prepare_times(recipe)
        bench = read_bench(a.bench) if a.bench else None
        if a.measured_tflops is not None and a.measured_tflops <= 0:
            raise ValueError(f"--measured-tflops must be positive, got {a.measured_tflops}")
    except (OSError, ValueError) as e:
        print(f"mm-ds plan: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        out = {"recipe": a.recipe, "cluster": asdict(cluster), "stages": [asdict(r) for r in rows],
               "evaluation": asdict(evaluation), "totals": totals_json(totals, refused),
               "spread": {"groups": spread, "totals": totals_json(side, []) if isinstance(side, list) else side},
               "budget": [asdict(b) for b in money], "prepare": [asdict(t) for t in prepare]}
        if bench:
            out["bench"] = {"peak_flops": bench[0], "stages": bench[1], **bench[2]}
        print(json.dumps(out, indent=2))
        return 0
    shapes = sorted({(c.hidden, c.vocab, c.seq_len, c.mask_prob) for c in costs})
    print(f"recipe {a.recipe}: " + "; ".join(f"h={h} V={v} s={sq} p={p}" for h, v, sq, p in shapes) +
          "; per stage: its steps U and global batch B")
    print(format_plan(rows, cluster, a.wide))
    print(wrap(format_evaluation(evaluation, cluster)))
    resume = format_resume(rows, cfgs).splitlines()
    print("\n" + "\n".join(line if line.startswith("|") else wrap(line) for line in resume))
    print("\n" + "\n".join(wrap(line, "    ") for line in format_totals(totals, cluster, refused).splitlines()))
    if isinstance(side, list):
        print("\n" + format_spread(totals, side, cluster, spread))
    elif side:
        print("\n" + wrap(side))
    print("\n" + "\n".join(wrap(line, "    ") for line in format_budget(money, cluster, limit, a.startup_s)))
    print("\n" + "\n".join(wrap(line, "    ") for line in format_prepare(prepare, a.recipe)))
    if a.measured_tflops:
        print()
        print(measured_check(rows, cluster, a.measured_tflops))
    if bench:
        print()
        print(bench_check(bench[0], bench[1], cluster.mfu, bench[2], cluster.peak_tflops))
        if bench[2]["device"] == "cuda" and not a.measured_tflops:  # a GPU's rate: the cluster at it
            print()
            print(f"at {bench[2]['gpu']}'s measured Step 1 rate in {a.bench}:")
            print(measured_check(rows, cluster, bench_tflops(bench[1])))
    return 0


def _spread(given: int | None, c: Cluster) -> int:
    """`--spread`: default one group per node; the nodes must split evenly (as `launch.spread`'s)."""
    spread = c.nodes if given is None else given
    if spread < 1 or c.nodes % spread:
        raise ValueError(f"--spread {spread}: {c.nodes} nodes do not split into {spread} groups of equal size; choose "
                         f"from {', '.join(str(g) for g in range(1, c.nodes + 1) if c.nodes % g == 0)}")
    return spread


def _side_by_side(recipe, cfgs: dict, c: Cluster, evaluation, spread: int, runs) -> list | str:
    """Each step's totals with `spread` groups, or why not (a sentence; empty: no side by side to price)."""
    if spread == 1:
        return ""
    def priced(g: int) -> list | str:
        try:
            return [p.total(c.gpus) for p in recipe_phases(recipe, cfgs, c, evaluation, g, runs)]
        except ValueError as e:  # a group's world size cannot keep a stage's global batch
            return str(e)

    side = priced(spread)
    if isinstance(side, list):
        return side
    fits = [g for g in range(2, c.nodes + 1) if c.nodes % g == 0 and g != spread and isinstance(priced(g), list)]
    return (f"side by side (--spread {spread}, {c.nodes // spread} node(s) a group) is refused: {side}; --spread values "
            f"whose groups keep every global batch: {', '.join(map(str, [1, *fits]))}")


if __name__ == "__main__":
    sys.exit(main())

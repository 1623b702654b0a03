"""`mm-ds plan`: time, GPU-hours and disk of a recipe's stages on a cluster you do not have yet.

    mm-ds plan                                   # the paper recipe on 4 nodes x 8 H100 (989 TFLOP/s bf16, MFU 0.45)
    mm-ds plan paper --nodes 2 --gpus-per-node 8 --peak-tflops 312 --mfu 0.4 --inter-gbps 22
    mm-ds plan --bench bench.json                # also: the compute model against `mm-ds bench` measurements

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
most a GPU's share of the global batch (mm_ds/runtime/ds_config.py `split`), as `mm-ds run` launches it.

Parameter counts are mm_ds.model.model's (`param_count`: FFN 4h, positions s+2, tied output projection, a bias of V
per head). The model is mm_ds/tools/plan_model.py's.

The table prices each system's stages once (one language's Step 2). The totals (mm_ds/tools/plan_totals.py) price
the whole recipe as `mm-ds run` runs it: every stage run of its stage list, every language, Step 3's finetunings as
single-GPU runs packed onto the cluster, Step 4 and the alignment check; and say whether `mm-ds run --check` would
refuse the recipe at the cluster's size.

Checking the compute part here. `--bench FILE` reads `mm-ds bench --json FILE` output (any JSON holding
`stages: {name: {kind?, flops_per_step, step_time_s}}` and `peak: {used_flops}` works) and prints, per stage
kind, the measured step time against the estimate at the plan's MFU (against the peak measured in that
run) and against an estimate calibrated on the measured pretraining MFU: the latter checks that the FLOPs
formulas predict the *relative* cost of the stages. `--measured-tflops X` instead takes one measured
per-GPU throughput (e.g. `mm-ds bench` on the target GPU) and prints the cluster step times at it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..model import flops as F
from ..pipeline.costs import add_recipe_args, costs_from_args
from .plan_model import (BYTES, PERSISTENCE, RING, Cluster, ParamCount, StagePlan, collectives_per_step,  # noqa: F401
                         comm_bytes_per_step, plan_stages, stage_params)
from .plan_resume import format_resume
from .plan_totals import format_totals, recipe_totals, refusals, totals_json

# ---------------------------------------------------------------- Step 4: evaluation

@dataclass(frozen=True)
class EvalPlan:
    units: int
    """Independent evaluations (a Step-2 checkpoint, a control or the source language, with all seeds)."""
    model_runs: int
    """units x seeds: one finetuned model scoring one test set."""
    sequences: int
    flops: float
    hours: float
    gpu_hours: float


def plan_evaluation(recipe, cluster: Cluster, cfgs: dict | None = None) -> EvalPlan:
    """Step 4 of a pipeline recipe (`mm-ds run`'s units, mm_ds/eval/transfer.py) on the cluster: per task, the
    languages it covers, every Step-2 checkpoint of each system when the recipe draws curves (the adapt stage's
    checkpoint schedule) plus a control, and the source language once per primary model, each scored by every
    seed's finetuned model on the official test set's size (mm_ds/data/tasks.py) at the task's full sequence
    length (an upper bound: evaluation batches by length). Forward passes only, at the plan's MFU."""
    from ..data.tasks import get_task
    from ..pipeline.stage_runs import stage_configs
    from ..recipe import english_tasks, minis_in_english, primaries
    from ..systems import system_of

    cfgs = stage_configs(recipe) if cfgs is None else cfgs
    units = runs = sequences = 0
    flops = 0.0
    seeds = len(recipe.seeds)
    for task in recipe.tasks:
        spec = get_task(task)
        n = spec.eval_sizes.get(recipe.split(task), 0)
        n = min(n, recipe.eval_examples) if recipe.eval_examples else n
        langs = recipe.evaluated(task)
        targets = [lang for lang in langs if lang != recipe.source_lang]
        for p in primaries(recipe):
            m = cfgs[f"pretrain/{p}"].model
            seq = min(spec.max_length, m.max_positions)
            per_run = n * m.num_layers * F.flop_layer(seq, m.hidden_size)
            count = 1 if recipe.source_lang in langs else 0
            for system in (s for s in recipe.systems if system_of(s).primary == p):  # + the control
                count += sum((cfgs[f"adapt/{system}/{lang}"].train.checkpoints() if recipe.curve else 1) + 1
                             for lang in targets)  # each language its own schedule (early_checkpoints)
            units += count
            runs += count * seeds
            sequences += count * seeds * n
            flops += count * seeds * per_run
        for s in minis_in_english(recipe) if task in english_tasks(recipe) else []:  # Table 5: one unit each
            row, pre = system_of(s), cfgs[f"pretrain/{system_of(s).primary}"].model
            layers = row.adapted_depths(pre, cfgs[f"build_mini/{s}"].mini)[-1]
            units, runs, sequences = units + 1, runs + seeds, sequences + seeds * n
            flops += seeds * n * layers * F.flop_layer(min(spec.max_length, pre.max_positions), pre.hidden_size)
    seconds = flops / (cluster.gpus * cluster.peak_tflops * 1e12 * cluster.mfu)
    return EvalPlan(units, runs, sequences, flops, seconds / 3600, seconds / 3600 * cluster.gpus)


def format_evaluation(e: EvalPlan, c: Cluster) -> str:
    return (f"Step 4 (evaluation, shared by every rank of a launch): {e.units:,} units, {e.model_runs:,} finetuned-"
            f"model runs over {e.sequences:,} test sequences, {e.flops / 1e15:,.0f} PFLOP (forward passes): about "
            f"{e.hours:.1f} h = {e.gpu_hours:,.0f} GPU-h at MFU {c.mfu:g} on {c.gpus} GPUs, plus reading each unit's "
            f"Step-2 checkpoint and (once per task and rank) the finetuned models")


# ---------------------------------------------------------------- output

def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def format_plan(rows: list[StagePlan], c: Cluster) -> str:
    head = (f"cluster: {c.nodes} node(s) x {c.gpus_per_node} GPUs = {c.gpus}; peak {c.peak_tflops:g} TFLOP/s/GPU "
            f"at MFU {c.mfu:g}; {c.dtype} (gradients reduced in {c.reduction_dtype}), ZeRO-{c.zero}, micro batch "
            f"{c.micro_batch or 'of each stage'} (per GPU, at most); all-reduce busbw "
            f"{c.intra_gbps:g} GB/s intra-node, {c.inter_gbps:g} GB/s inter-node (using "
            f"{c.busbw / 1e9:g}); overlap {c.overlap:g}")
    cols = ["system", "step", "formula", "layers", "params M", "trainable M", "steps", "micro", "accum",
            "PFLOP/step", "compute s", "comm GB/GPU", "comm s", "step s", "hours", "GPU-h"]
    if c.usd_per_gpu_hour:
        cols.append("USD")
    cols += ["ckpt GB", "x ckpts", "final GB"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r.system, r.step, r.formula, str(r.layers), f"{r.params / 1e6:.1f}", f"{r.trainable / 1e6:.2f}",
                 f"{r.steps:,}", str(r.micro_batch), str(r.grad_accum), f"{r.flops_per_step / 1e15:.2f}",
                 f"{r.compute_s:.3f}", _gb(r.comm_bytes), f"{r.comm_s:.4f}", f"{r.step_s:.3f}", f"{r.hours:.1f}",
                 f"{r.gpu_hours:,.0f}"]
        if c.usd_per_gpu_hour:
            cells.append(f"{r.usd:,.0f}")
        cells += [_gb(r.ckpt_bytes), str(r.checkpoints), _gb(r.final_bytes)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for system in dict.fromkeys(r.system for r in rows):
        rs = [r for r in rows if r.system == system]
        s2 = [r for r in rs if r.step == "step2"]
        disk = sum(r.ckpt_bytes * r.checkpoints + r.final_bytes for r in rs)
        usd = f", {sum(r.usd for r in rs):,.0f} USD" if c.usd_per_gpu_hour else ""
        lines.append(f"{system}: {sum(r.hours for r in rs):.1f} h, {sum(r.gpu_hours for r in rs):,.0f} GPU-h{usd} "
                     f"in all; Step 2 (per new language) {sum(r.hours for r in s2):.1f} h = "
                     f"{sum(r.gpu_hours for r in s2):,.0f} GPU-h; checkpoints {disk / 1e9:.0f} GB")
    return "\n".join(lines)


# ---------------------------------------------------------------- the compute model against measurements

_BENCH_KIND = {"adapt_full": "adapt", "adapt_mini": "adapt"}


def read_bench(path: str | Path) -> tuple[float | None, list[dict]]:
    """(peak FLOP/s of the run or None, [{name, formula, flops_per_step, step_time_s}]) of an `mm-ds bench --json`."""
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
    peak = peak.get("used_flops") if isinstance(peak, dict) else None
    peak = peak or (data.get("peak_tflops") and data["peak_tflops"] * 1e12)
    return (float(peak) if peak else None), rows


def bench_check(peak: float | None, bench: list[dict], mfu: float) -> str:
    """Estimated vs measured step time of each benchmarked stage on the machine that ran the benchmark."""
    ref = next((r for r in bench if r["formula"] == "pretrain"), bench[0])
    ref_mfu = ref["flops_per_step"] / ref["step_time_s"] / peak if peak else None
    lines = [f"compute model vs `mm-ds bench` (peak {peak / 1e12:.3f} TFLOP/s measured in that run)" if peak else
             "compute model vs `mm-ds bench` (no peak in the file: calibrated estimate only)",
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

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mm-ds plan", description="estimate time, GPU-hours and disk of each stage "
                                 "of a recipe on a GPU cluster (see the module docstring for the model)")
    add_recipe_args(ap)
    d = Cluster()
    ap.add_argument("--nodes", type=int, default=d.nodes)
    ap.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    ap.add_argument("--peak-tflops", type=float, default=d.peak_tflops, help="per GPU, training dtype")
    ap.add_argument("--mfu", type=float, default=d.mfu, help="assumed model FLOPs utilisation")
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
    ap.add_argument("--measured-tflops", type=float, help="measured per-GPU TFLOP/s: print step times at it")
    ap.add_argument("--bench", help="`mm-ds bench --json` output: check the compute model against it")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of tables")
    a = ap.parse_args(argv)
    try:
        recipe, cfgs, costs = costs_from_args(a)
        cluster = Cluster(a.nodes, a.gpus_per_node, a.peak_tflops, a.mfu, a.intra_gbps, a.inter_gbps, a.zero,
                          a.dtype, a.comm_dtype, a.micro_batch, a.overlap, a.usd_per_gpu_hour)
        rows = plan_stages(costs, cluster)
        evaluation = plan_evaluation(recipe, cluster, cfgs)
        totals, refused = recipe_totals(recipe, cfgs, cluster, evaluation), refusals(recipe, cfgs, cluster.gpus)
        bench = read_bench(a.bench) if a.bench else None
        if a.measured_tflops is not None and a.measured_tflops <= 0:
            raise ValueError(f"--measured-tflops must be positive, got {a.measured_tflops}")
    except (OSError, ValueError) as e:
        print(f"mm-ds plan: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        out = {"recipe": a.recipe, "cluster": asdict(cluster), "stages": [asdict(r) for r in rows],
               "evaluation": asdict(evaluation), "totals": totals_json(totals, refused)}
        if bench:
            out["bench"] = {"peak_flops": bench[0], "stages": bench[1]}
        print(json.dumps(out, indent=2))
        return 0
    shapes = sorted({(c.hidden, c.vocab, c.seq_len, c.mask_prob) for c in costs})
    print(f"recipe {a.recipe}: " + "; ".join(f"h={h} V={v} s={sq} p={p}" for h, v, sq, p in shapes) +
          "; per stage: its steps U and global batch B")
    print(format_plan(rows, cluster))
    print(format_evaluation(evaluation, cluster))
    print("\n" + format_resume(rows, cfgs))
    print("\n" + format_totals(totals, cluster, refused))
    if a.measured_tflops:
        print()
        print(measured_check(rows, cluster, a.measured_tflops))
    if bench:
        print()
        print(bench_check(bench[0], bench[1], cluster.mfu))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`mm-ds plan`: time, GPU-hours and disk of a recipe's stages on a cluster you do not have yet.

    mm-ds plan                                   # the paper recipe on 4 nodes x 8 H100 (989 TFLOP/s bf16, MFU 0.45)
    mm-ds plan paper --nodes 2 --gpus-per-node 8 --peak-tflops 312 --mfu 0.4 --inter-gbps 22
    mm-ds plan --bench bench.json                # also: the compute model against `mm-ds bench` measurements

Per optimizer step of each stage:

compute   the paper's analytic FLOPs (mm_ds.flops: A1, A1 + second head, A3, A4) / (GPUs x peak x MFU).
comm      data-parallel gradient traffic per GPU from the ZeRO stage and the *trainable* parameters only:
          ZeRO-0 ring all-reduce 2(n-1)/n x grad bytes at the step boundary; ZeRO-1 reduce-scatter of
          gradients + all-gather of the updated parameters, (n-1)/n each, once per step (the same volume);
          ZeRO-2 reduce-scatters on every micro-step; ZeRO-3 adds all-gathers of *all* parameters (frozen
          ones too) in every forward and backward. Step 2 trains only the language group (token embeddings
          + output biases: 38.45M values at the base shape instead of 125M), so it moves ~30% of the bytes.
          Time = bytes per GPU / bus bandwidth (nccl-tests' busbw, GB/s): the intra-node figure on one node,
          the inter-node figure across nodes (a ring is as fast as its slowest link). `--overlap` hides
          that share of it behind the backward pass (0 = none, the conservative default).
disk      an engine checkpoint holds the weights in the training dtype plus, for trainable parameters,
          fp32 master weights and two Adam moments (12 bytes each); final/ holds fp32 weights. The
          checkpoint schedule is each stage's (train.checkpoint_steps, every train.checkpoint_every, the last).

Parameter counts are mm_ds.model's (`param_count`: FFN 4h, positions s+2, tied output projection, a bias of V
per head).

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

from .. import flops as F
from ..config import ModelConfig
from ..model import LANGUAGE_PARAMS, param_count
from ..surgery import minipost_trainable
from .costs import StageCost, add_recipe_args, costs_from_args

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


# ---------------------------------------------------------------- parameter counts (mm_ds.model's layout)

@dataclass(frozen=True)
class ParamCount:
    total: int
    trainable: int


def stage_params(kind: str, h: int, V: int, layers: int, seq_len: int, trainable_layers: int | None = None,
                 ffn: int | None = None, secondary_heads: int = 1) -> ParamCount:
    """Parameters of a stage's model and those it trains, counted by the model's own layout (no model built)."""
    dual = list(range(1, secondary_heads + 1)) if kind == "pretrain_dual" else None  # a head's size is N-free
    cfg = ModelConfig(vocab_size=V, hidden_size=h, num_layers=layers, ffn_size=ffn or 4 * h, max_positions=seq_len,
                      secondary_head_layer=dual)
    if kind in ("pretrain", "pretrain_dual"):
        return ParamCount(param_count(cfg), param_count(cfg))
    if kind == "adapt":  # the language group: token embeddings + the output bias of the (one) head
        return ParamCount(param_count(cfg), param_count(cfg, lambda k: k in LANGUAGE_PARAMS))
    if kind == "build_mini":
        return ParamCount(param_count(cfg), param_count(cfg, minipost_trainable(cfg, layers - (trainable_layers or 0))))
    if kind == "finetune":  # the body without the MLM head; token embeddings frozen; the task head is negligible
        body = param_count(cfg, lambda k: not k.startswith("head."))
        return ParamCount(body, body - param_count(cfg, lambda k: k == "embed.tokens.weight"))
    raise ValueError(f"unknown stage kind {kind!r}")


# ---------------------------------------------------------------- the cluster and the plan

@dataclass(frozen=True)
class Cluster:
    nodes: int = 4
    gpus_per_node: int = 8
    peak_tflops: float = 989.0
    """Per GPU, in the training dtype (H100 SXM bf16 dense: 989)."""
    mfu: float = 0.45
    intra_gbps: float = 360.0
    """All-reduce bus bandwidth inside a node, GB/s per GPU (NVLink; nccl-tests busbw)."""
    inter_gbps: float = 45.0
    """All-reduce bus bandwidth across nodes, GB/s per GPU (e.g. one 400 Gb/s NIC per GPU)."""
    zero: int = 1
    dtype: str = "bf16"
    """Training dtype: weights in checkpoints, gradients and parameters on the wire."""
    micro_batch: int = 32
    overlap: float = 0.0
    """Share of communication hidden behind compute (0..1)."""
    usd_per_gpu_hour: float | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def busbw(self) -> float:
        return (self.intra_gbps if self.nodes == 1 else self.inter_gbps) * 1e9

    def check(self) -> None:
        for name in ("nodes", "gpus_per_node", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        for name in ("peak_tflops", "intra_gbps", "inter_gbps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"--mfu must lie in (0, 1], got {self.mfu}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"--overlap must lie in [0, 1], got {self.overlap}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"--zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.dtype not in BYTES:
            raise ValueError(f"--dtype must be one of {', '.join(BYTES)}, got {self.dtype}")


def comm_bytes_per_step(zero: int, n: int, trainable: int, total: int, grad_accum: int, dtype: str) -> float:
    """Bytes each GPU sends per optimizer step for data parallelism (what it receives is the same)."""
    if n == 1:
        return 0.0
    b = BYTES[dtype]
    share = (n - 1) / n
    if zero == 0:
        return 2 * share * trainable * b  # ring all-reduce at the step boundary
    if zero == 1:
        return share * trainable * b + share * trainable * b  # reduce-scatter grads + all-gather params
    if zero == 2:
        return grad_accum * share * trainable * b + share * trainable * b  # reduce-scatter every micro-step
    # ZeRO-3: reduce-scatter every micro-step, all-gather every parameter in forward and in backward
    return grad_accum * (share * trainable * b + 2 * share * total * b)


@dataclass(frozen=True)
class StagePlan:
    system: str
    stage: str
    kind: str
    layers: int
    steps: int
    global_batch: int
    grad_accum: int
    params: int
    trainable: int
    flops_per_step: float
    compute_s: float
    comm_bytes: float
    comm_s: float
    step_s: float
    hours: float
    gpu_hours: float
    usd: float | None
    ckpt_bytes: float
    final_bytes: float
    checkpoints: int


def plan_stages(costs: list[StageCost], cluster: Cluster) -> list[StagePlan]:
    cluster.check()
    rows = []
    for cost in costs:
        B, s = cost.global_batch, cost.seq_len
        n = cluster.gpus
        if B % (cluster.micro_batch * n):
            raise ValueError(f"{cost.system} {cost.stage}: global batch {B} is not divisible by micro batch "
                             f"{cluster.micro_batch} x {n} GPUs; change --micro-batch or the cluster size")
        accum = B // (cluster.micro_batch * n)
        pc = stage_params(cost.kind, cost.hidden, cost.vocab, cost.layers, s, cost.trainable_layers,
                          secondary_heads=cost.secondary_heads)
        compute = cost.flops_per_step / (n * cluster.peak_tflops * 1e12 * cluster.mfu)
        vol = comm_bytes_per_step(cluster.zero, n, pc.trainable, pc.total, accum, cluster.dtype)
        comm = vol / cluster.busbw
        step = compute + (1 - cluster.overlap) * comm
        hours = step * cost.steps / 3600
        gpu_hours = hours * n
        w = BYTES[cluster.dtype]
        rows.append(StagePlan(
            cost.system, cost.stage, cost.kind, cost.layers, cost.steps, B, accum, pc.total, pc.trainable,
            cost.flops_per_step, compute, vol, comm, step, hours, gpu_hours,
            gpu_hours * cluster.usd_per_gpu_hour if cluster.usd_per_gpu_hour else None,
            pc.total * w + pc.trainable * 12, pc.total * 4, cost.checkpoints))
    return rows


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
    """Step 4 of a pipeline recipe (`mm-ds run`'s units, mm_ds/stages/transfer.py) on the cluster: per task, the
    languages it covers, every Step-2 checkpoint of each system when the recipe draws curves (the adapt stage's
    checkpoint schedule) plus a control, and the source language once per primary model, each scored by every
    seed's finetuned model on the official test set's size (mm_ds/data/tasks.py) at the task's full sequence
    length (an upper bound: evaluation batches by length). Forward passes only, at the plan's MFU."""
    from ..data.tasks import get_task
    from ..recipe import english_tasks, minis_in_english, primaries, stage_configs
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
            f"at MFU {c.mfu:g}; {c.dtype}, ZeRO-{c.zero}, micro batch {c.micro_batch}; all-reduce busbw "
            f"{c.intra_gbps:g} GB/s intra-node, {c.inter_gbps:g} GB/s inter-node (using "
            f"{c.busbw / 1e9:g}); overlap {c.overlap:g}")
    cols = ["system", "stage", "kind", "layers", "params M", "trainable M", "steps", "accum", "PFLOP/step",
            "compute s", "comm GB/GPU", "comm s", "step s", "hours", "GPU-h"]
    if c.usd_per_gpu_hour:
        cols.append("USD")
    cols += ["ckpt GB", "x ckpts", "final GB"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r.system, r.stage, r.kind, str(r.layers), f"{r.params / 1e6:.1f}", f"{r.trainable / 1e6:.2f}",
                 f"{r.steps:,}", str(r.grad_accum), f"{r.flops_per_step / 1e15:.2f}", f"{r.compute_s:.3f}",
                 _gb(r.comm_bytes), f"{r.comm_s:.4f}", f"{r.step_s:.3f}", f"{r.hours:.1f}", f"{r.gpu_hours:,.0f}"]
        if c.usd_per_gpu_hour:
            cells.append(f"{r.usd:,.0f}")
        cells += [_gb(r.ckpt_bytes), str(r.checkpoints), _gb(r.final_bytes)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for system in dict.fromkeys(r.system for r in rows):
        rs = [r for r in rows if r.system == system]
        s2 = [r for r in rs if r.stage == "step2"]
        disk = sum(r.ckpt_bytes * r.checkpoints + r.final_bytes for r in rs)
        usd = f", {sum(r.usd for r in rs):,.0f} USD" if c.usd_per_gpu_hour else ""
        lines.append(f"{system}: {sum(r.hours for r in rs):.1f} h, {sum(r.gpu_hours for r in rs):,.0f} GPU-h{usd} "
                     f"in all; Step 2 (per new language) {sum(r.hours for r in s2):.1f} h = "
                     f"{sum(r.gpu_hours for r in s2):,.0f} GPU-h; checkpoints {disk / 1e9:.0f} GB")
    total_h = sum(r.hours for r in rows)
    lines.append(f"all stages in sequence: {total_h:.1f} h = {total_h / 24:.1f} days, "
                 f"{sum(r.gpu_hours for r in rows):,.0f} GPU-h (MINIPOST's step1 is BL_BASE's in practice)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the compute model against measurements

_BENCH_KIND = {"adapt_full": "adapt", "adapt_mini": "adapt"}


def read_bench(path: str | Path) -> tuple[float | None, list[dict]]:
    """(peak FLOP/s of the run or None, [{name, kind, flops_per_step, step_time_s}]) of an `mm-ds bench --json`."""
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
        rows.append({"name": name, "kind": r.get("kind") or _BENCH_KIND.get(name, name),
                     "flops_per_step": float(r["flops_per_step"]), "step_time_s": float(r["step_time_s"])})
    peak = data.get("peak", {})
    peak = peak.get("used_flops") if isinstance(peak, dict) else None
    peak = peak or (data.get("peak_tflops") and data["peak_tflops"] * 1e12)
    return (float(peak) if peak else None), rows


def bench_check(peak: float | None, bench: list[dict], mfu: float) -> str:
    """Estimated vs measured step time of each benchmarked stage on the machine that ran the benchmark."""
    ref = next((r for r in bench if r["kind"] == "pretrain"), bench[0])
    ref_mfu = ref["flops_per_step"] / ref["step_time_s"] / peak if peak else None
    lines = [f"compute model vs `mm-ds bench` (peak {peak / 1e12:.3f} TFLOP/s measured in that run)" if peak else
             "compute model vs `mm-ds bench` (no peak in the file: calibrated estimate only)",
             "| stage | kind | GFLOP/step | measured s | TFLOP/s | MFU | est. s at plan MFU | est. s calibrated "
             f"on {ref['name']} | measured / calibrated |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in bench:
        achieved = r["flops_per_step"] / r["step_time_s"]
        est = f"{r['flops_per_step'] / (peak * mfu):.3f}" if peak else "-"
        # The same achieved FLOP/s as the reference stage: how well the formulas predict relative cost.
        cal = r["flops_per_step"] / (ref["flops_per_step"] / ref["step_time_s"])
        lines.append(f"| {r['name']} | {r['kind']} | {r['flops_per_step'] / 1e9:.1f} | {r['step_time_s']:.3f} | "
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
             "| system | stage | est. compute s/step | at measured s/step | est. hours | at measured hours |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        meas = r.flops_per_step / (c.gpus * tflops * 1e12)
        step = meas + (1 - c.overlap) * r.comm_s
        lines.append(f"| {r.system} | {r.stage} | {r.compute_s:.3f} | {meas:.3f} | {r.hours:.1f} | "
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
    ap.add_argument("--micro-batch", type=int, default=d.micro_batch, help="sequences per GPU per forward")
    ap.add_argument("--overlap", type=float, default=d.overlap, help="share of communication hidden (0-1)")
    ap.add_argument("--usd-per-gpu-hour", type=float, help="print cost in USD at this price")
    ap.add_argument("--measured-tflops", type=float, help="measured per-GPU TFLOP/s: print step times at it")
    ap.add_argument("--bench", help="`mm-ds bench --json` output: check the compute model against it")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of tables")
    a = ap.parse_args(argv)
    try:
        recipe, cfgs, costs = costs_from_args(a)
        cluster = Cluster(a.nodes, a.gpus_per_node, a.peak_tflops, a.mfu, a.intra_gbps, a.inter_gbps, a.zero,
                          a.dtype, a.micro_batch, a.overlap, a.usd_per_gpu_hour)
        rows = plan_stages(costs, cluster)
        evaluation = plan_evaluation(recipe, cluster, cfgs)
        bench = read_bench(a.bench) if a.bench else None
        if a.measured_tflops is not None and a.measured_tflops <= 0:
            raise ValueError(f"--measured-tflops must be positive, got {a.measured_tflops}")
    except (OSError, ValueError) as e:
        print(f"mm-ds plan: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        out = {"recipe": a.recipe, "cluster": asdict(cluster), "stages": [asdict(r) for r in rows],
               "evaluation": asdict(evaluation)}
        if bench:
            out["bench"] = {"peak_flops": bench[0], "stages": bench[1]}
        print(json.dumps(out, indent=2))
        return 0
    shapes = sorted({(c.hidden, c.vocab, c.seq_len, c.mask_prob) for c in costs})
    print(f"recipe {a.recipe}: " + "; ".join(f"h={h} V={v} s={sq} p={p}" for h, v, sq, p in shapes) +
          "; per stage: its steps U and global batch B")
    print(format_plan(rows, cluster))
    print(format_evaluation(evaluation, cluster))
    if a.measured_tflops:
        print()
        print(measured_check(rows, cluster, a.measured_tflops))
    if bench:
        print()
        print(bench_check(bench[0], bench[1], cluster.mfu))
    return 0


if __name__ == "__main__":
    sys.exit(main())

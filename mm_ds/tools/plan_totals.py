"""`mm-ds plan`'s totals: the whole recipe as `mm-ds run` runs it, step by step, on the planned cluster.

Every stage run of `stage_runs.stage_runs` is priced once (the pretraining MINIPOST shares with BL_BASE is one run;
every target language's Step 2; every finetuning), as it will run:

    Steps 1, 1b, 2   one after another, each data-parallel on every GPU (mm_ds/tools/plan_model.py `plan_stages`)
    Step 3           single-GPU runs, as many at once as there are GPUs, longest first (mm_ds/pipeline/pack.py): its
                     time is that schedule's makespan, at the plan's MFU on one GPU with no communication
    Step 4           the evaluation units over every GPU (`plan_evaluation`)
    alignment check  the forward passes of the held-out sequences per Step-2 checkpoint and step 0 of every run it
                     scores (`plan_alignment`), a language's runs on one GPU, the languages over every GPU

GPU-hours are what an allocation of the whole cluster pays: its GPUs x each step's hours, idle GPUs included
(Step 3's tail); `busy` counts the GPUs' own work. Disk: every run's engine checkpoints and final weights.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..model import flops as F

STEPS = {"pretrain": "Step 1", "build_mini": "Step 1b", "adapt": "Step 2", "finetune": "Step 3"}


@dataclass(frozen=True)
class StepTotal:
    step: str
    runs: int
    """Stage runs (Steps 1-3), units (Step 4), checkpoints (the alignment check)."""
    how: str
    hours: float
    gpu_hours: float
    busy_gpu_hours: float
    disk_bytes: float


def makespan(seconds: list[float], devices: int) -> float:
    """Wall time of independent jobs of `seconds`, taken longest first by `devices` devices as each frees up."""
    free = [0.0] * max(1, devices)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def recipe_totals(recipe, cfgs: dict, cluster, evaluation) -> list[StepTotal]:
    """Steps 1-4 and the alignment check of `recipe` on `cluster`: `cfgs` are `stage_configs(recipe)`,
    `evaluation` its `plan_evaluation`."""
    from ..pipeline.costs import stage_run_costs
    from .plan_model import BYTES, plan_stages, stage_params

    runs = stage_run_costs(recipe, cfgs)
    out, n = [], cluster.gpus
    for stage, step in STEPS.items():
        mine = [(key, rows) for key, rows in runs if key.split("/")[0] == stage]
        if not mine:
            continue
        if stage == "finetune":
            costs = [c for _, rows in mine for c in rows]
            one_gpu = cluster.peak_tflops * 1e12 * cluster.mfu
            seconds = [c.flops / one_gpu for c in costs]
            hours = makespan(seconds, n) / 3600
            w = BYTES[cluster.dtype]
            disk = 0.0
            for c in costs:
                p = stage_params(c.formula, c.hidden, c.vocab, c.layers, c.seq_len)
                disk += (p.total * w + p.trainable * 12) * c.checkpoints + p.total * 4
            out.append(StepTotal(step, len(mine), f"single-GPU runs, {min(n, len(mine))} at once",
                                 hours, hours * n, sum(seconds) / 3600, disk))
            continue
        per_run = [plan_stages(rows, cluster) for _, rows in mine if rows]  # an extraction: none
        hours = sum(r.hours for rows in per_run for r in rows)
        disk = sum(sum(r.ckpt_bytes * r.checkpoints for r in rows) + rows[-1].final_bytes for rows in per_run)
        out.append(StepTotal(step, len(mine), f"data-parallel on {n} GPUs, one run after another", hours,
                             hours * n, hours * n, disk))
    out.append(StepTotal("Step 4", evaluation.units, f"units over {n} GPUs", evaluation.hours,
                         evaluation.gpu_hours, evaluation.gpu_hours, 0.0))
    align = plan_alignment(recipe, cfgs, cluster, runs)
    if align is not None:
        out.append(align)
    return out


def plan_alignment(recipe, cfgs: dict, cluster, runs: list | None = None) -> StepTotal | None:
    """The alignment check `mm-ds run` ends with (mm_ds/eval/align.py), as it runs: the Step-2 runs of
    `align.aligned_runs` (the rule the run follows; every system, BL_BASE's too), their checkpoints and step 0 each
    scored over `align_sequences` held-out sequences by `row_for`'s forward passes: the primary model with the
    checkpoint's embeddings, and with the untrained ones beside its output bias ("bias only"; the same model at step
    0), and the mini-model at the depth Step 2 was training (mini-model systems). A target language's runs are one
    job on one GPU (align_spread.py), the languages taken longest first by every GPU. `runs`: `stage_run_costs`.
    Left out: a pass per primary model and mini-model on source-language text (align.source_rows)."""
    from ..eval.align import aligned_runs
    from ..pipeline.costs import stage_run_costs
    from ..systems import system_of

    pairs = aligned_runs(recipe)
    if not pairs:
        return None
    costs = dict(stage_run_costs(recipe, cfgs) if runs is None else runs)
    points, seconds = 0, {}
    one_gpu = cluster.peak_tflops * 1e12 * cluster.mfu
    for s, lang in pairs:
        phases, row = costs[f"adapt/{s}/{lang}"], system_of(s)  # a cost row per depth Step 2 trains at
        c, checkpoints = phases[0], sum(p.checkpoints for p in phases)
        # (layers, passes): the primary with each checkpoint's embeddings and bias only, once at step 0; the
        # mini-model at step 0 at the first phase's depth, then at each checkpoint's phase's
        passes = [(cfgs[f"pretrain/{row.primary}"].model.num_layers, 1 + 2 * checkpoints)]
        if row.mini:
            passes += [(c.layers, 1)] + [(p.layers, p.checkpoints) for p in phases]
        flops = recipe.align_sequences * sum(n * F.forward_flops(c.seq_len, c.hidden, c.vocab, layers, c.mask_prob)
                                             for layers, n in passes)
        points += checkpoints + 1
        seconds[lang] = seconds.get(lang, 0.0) + flops / one_gpu
    hours = makespan(list(seconds.values()), cluster.gpus) / 3600
    return StepTotal("alignment check", points, f"checkpoints of {len(pairs)} Step-2 runs, a language per GPU, "
                     f"{min(cluster.gpus, len(seconds))} at once", hours, hours * cluster.gpus,
                     sum(seconds.values()) / 3600, 0.0)


def refusals(recipe, cfgs: dict, gpus: int) -> list[str]:
    """What `mm-ds run --check` would refuse about the cluster's size: each stage run's batch geometry on `gpus`
    ranks (one for the single-device runs of Step 3), grouped by message."""
    from ..config import ConfigError
    from ..runtime.ds_config import geometry
    from ..pipeline.stage_runs import PACKED

    grouped: dict[str, list[str]] = {}
    for name, cfg in cfgs.items():
        try:
            geometry(cfg, 1 if cfg.stage in PACKED else gpus)
        except ConfigError as e:
            grouped.setdefault(str(e), []).append(name)
    return [f"{names[0]}{f' (and {len(names) - 1} more like it)' if len(names) > 1 else ''}: {msg}"
            for msg, names in grouped.items()]


def format_totals(totals: list[StepTotal], cluster, refused: list[str]) -> str:
    lines = [f"the whole recipe as `mm-ds run` runs it on {cluster.gpus} GPUs (every language, shared stages once):",
             "| step | runs | how | hours | GPU-h | busy GPU-h | disk GB |", "|---|---:|---|---:|---:|---:|---:|"]
    for t in totals:
        lines.append(f"| {t.step} | {t.runs:,} | {t.how} | {t.hours:.{1 if t.hours >= 1 else 2}f} | "
                     f"{t.gpu_hours:,.0f} | {t.busy_gpu_hours:,.{0 if t.busy_gpu_hours >= 10 else 1}f} | "
                     f"{t.disk_bytes / 1e9:,.0f} |")
    hours = sum(t.hours for t in totals)
    lines.append(f"all steps in sequence: {hours:.1f} h = {hours / 24:.1f} days, "
                 f"{sum(t.gpu_hours for t in totals):,.0f} GPU-h ({sum(t.busy_gpu_hours for t in totals):,.0f} "
                 f"busy), {sum(t.disk_bytes for t in totals) / 1e12:.2f} TB of checkpoints; Step 4 and the alignment "
                 f"check add reading each checkpoint they score")
    if refused:
        lines.append(f"`mm-ds run --check` would refuse the recipe on {cluster.gpus} GPUs:")
        lines += [f"  {r}" for r in refused]
    else:
        lines.append(f"`mm-ds run --check` passes the batch geometry of every stage on {cluster.gpus} GPUs")
    return "\n".join(lines)


def totals_json(totals: list[StepTotal], refused: list[str]) -> dict:
    from dataclasses import asdict

    return {"steps": [asdict(t) for t in totals], "hours": sum(t.hours for t in totals),
            "gpu_hours": sum(t.gpu_hours for t in totals), "refused": refused}


"""`mm-ds plan`'s totals: the whole recipe as `mm-ds run` runs it, step by step, on the planned cluster.

Every stage run of `stage_runs.stage_runs` is priced once (the pretraining MINIPOST shares with BL_BASE is one run;
every target language's Step 2; every finetuning), as it will run:

    Steps 1, 1b, 2   one after another, each data-parallel on every GPU (mm_ds/tools/plan/model.py `plan_stages`); or
                     with `spread` G (`launch.spread`, mm_ds/pipeline/spread.py) a step of at least G runs side by
                     side on G groups of nodes/G nodes, each run on its group's GPUs, each group taking the next run
                     in the recipe's order as it frees up: the step's time is the longest group's
    Step 3           single-GPU runs, as many at once as there are GPUs, longest first (mm_ds/pipeline/pack.py): its
                     time is that schedule's makespan, at the plan's MFU on one GPU with no communication
    Step 4           the evaluation units over every GPU (`plan_evaluation`)
    alignment check  the forward passes of the held-out sequences per Step-2 checkpoint and step 0 of every run it
                     scores (`plan_alignment`), a language's runs on one GPU, the languages over every GPU

A step is a `Phase`: lanes side by side (groups, or one lane of the whole cluster), each a sequence of `Launch`es
(what the budget's submission count walks: mm_ds/tools/plan/budget.py). GPU-hours are what an allocation of the
whole cluster pays: its GPUs x each step's hours, idle GPUs included (Step 3's tail, a group that waits for the
last run of a step); `busy` counts the GPUs' own work. Disk: every run's engine checkpoints and final weights.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from ...config import ConfigError
from ...data.tasks import get_task
from ...model import flops as F
from ...pipeline.alignment import aligned_runs
from ...pipeline.costs import stage_run_costs
from ...pipeline.recipe import english_tasks, minis_in_english, primaries
from ...pipeline.stage_runs import PACKED, stage_configs
from ...runtime.training.ds_config import geometry
from ...systems import system_of
from .model import BYTES, Cluster, plan_stages, stage_params

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


@dataclass(frozen=True)
class Launch:
    """One launch `mm-ds run` starts, as the budget counts it: a stage run, Step 3's pack, Step 4, the alignment check."""
    name: str
    seconds: float
    """Its work, start-up not included."""
    resume_s: float
    """Work a job's time limit may cost it: the seconds between two checkpoints it can resume from (`resume_interval`)."""


@dataclass(frozen=True)
class Phase:
    step: str
    how: str
    runs: int
    lanes: tuple[tuple[Launch, ...], ...]
    """Side by side; each lane's launches one after another."""
    busy_gpu_s: float
    disk_bytes: float

    @property
    def seconds(self) -> float:
        return max(sum(launch.seconds for launch in lane) for lane in self.lanes)

    def total(self, gpus: int) -> StepTotal:
        hours = self.seconds / 3600
        return StepTotal(self.step, self.runs, self.how, hours, hours * gpus, self.busy_gpu_s / 3600, self.disk_bytes)


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


def makespan(seconds: list[float], devices: int) -> float:
    """Wall time of independent jobs of `seconds`, taken longest first by `devices` devices as each frees up."""
    free = [0.0] * max(1, devices)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def lanes_in_order(launches: list[Launch], lanes: int) -> tuple[tuple[Launch, ...], ...]:
    """`launches` in their order, each to the lane that frees up first (mm_ds/pipeline/spread.py's scheduling)."""
    free, out = [(0.0, k) for k in range(lanes)], [[] for _ in range(lanes)]
    for launch in launches:
        t, k = heapq.heappop(free)
        out[k].append(launch)
        heapq.heappush(free, (t + launch.seconds, k))
    return tuple(tuple(lane) for lane in out if lane)


def resume_interval(cfg, rows: list) -> float:
    """Seconds of a stage run's work between two checkpoints it can resume from: what a job cut off by its time limit
    loses at most. Its config's `train.checkpoint_every` updates at the step time of its slowest phase (`rows`: its
    StagePlans). The one place the budget asks it (its cost, the writes, is not counted here)."""
    every = cfg.train.checkpoint_every if 0 < cfg.train.checkpoint_every < cfg.train.steps else cfg.train.steps
    return every * max(r.step_s for r in rows)


def recipe_phases(recipe, cfgs: dict, cluster, evaluation, spread: int = 1, runs: list | None = None) -> list[Phase]:
    """Steps 1-4 and the alignment check of `recipe` on `cluster`: `cfgs` are `stage_configs(recipe)`, `evaluation`
    its `plan_evaluation`, `spread` the groups of `launch.spread` (the cluster's nodes must split evenly), `runs`
    its `stage_run_costs` (computed unless given)."""
    runs = stage_run_costs(recipe, cfgs) if runs is None else runs
    out, n = [], cluster.gpus
    for stage, step in STEPS.items():
        mine = [(key, rows) for key, rows in runs if key.split("/")[0] == stage]
        if not mine:
            continue
        if stage == "finetune":
            costs = [c for _, rows in mine for c in rows]
            one_gpu = cluster.peak_tflops * 1e12 * cluster.mfu
            seconds = [c.flops / one_gpu for c in costs]
            w = BYTES[cluster.dtype]
            disk = 0.0
            for c in costs:
                p = stage_params(c.formula, c.hidden, c.vocab, c.layers, c.seq_len)
                disk += (p.total * w + p.trainable * 12) * c.checkpoints + p.total * 4
            # a time limit stops the runs in flight: the longest loses its work since its last checkpoint at most
            pack = Launch("Step 3", makespan(seconds, n), max(seconds))
            out.append(Phase(step, f"single-GPU runs, {min(n, len(mine))} at once", len(mine), ((pack,),),
                             sum(seconds), disk))
            continue
        groups = spread if spread > 1 and len(mine) >= spread else 1
        where = replace(cluster, nodes=cluster.nodes // groups)
        launches, disk = [], 0.0
        for key, rows in mine:
            plans = plan_stages(rows, where) if rows else []  # an extraction: none
            launches.append(Launch(key, sum(r.hours for r in plans) * 3600,
                                   resume_interval(cfgs[key], plans) if plans else 0.0))
            disk += sum(r.ckpt_bytes * r.checkpoints for r in plans) + (plans[-1].final_bytes if plans else 0.0)
        busy = sum(launch.seconds for launch in launches) * where.gpus
        how = (f"side by side: {groups} groups of {where.gpus} GPUs, a run each" if groups > 1
               else f"data-parallel on {n} GPUs, one run after another")
        out.append(Phase(step, how, len(mine), lanes_in_order(launches, groups), busy, disk))
    units = Launch("Step 4", evaluation.hours * 3600, 0.0)  # each unit's result is kept as it is written
    out.append(Phase("Step 4", f"units over {n} GPUs", evaluation.units, ((units,),), evaluation.gpu_hours * 3600, 0.0))
    align = plan_alignment(recipe, cfgs, cluster, runs)
    if align is not None:
        check = Launch("alignment check", align.hours * 3600, 0.0)
        out.append(Phase(align.step, align.how, align.runs, ((check,),), align.busy_gpu_hours * 3600, 0.0))
    return out


def recipe_totals(recipe, cfgs: dict, cluster, evaluation, spread: int = 1) -> list[StepTotal]:
    """Steps 1-4 and the alignment check of `recipe` on `cluster` (`recipe_phases`), one total per step."""
    return [p.total(cluster.gpus) for p in recipe_phases(recipe, cfgs, cluster, evaluation, spread)]


def plan_alignment(recipe, cfgs: dict, cluster, runs: list | None = None) -> StepTotal | None:
    """The alignment check `mm-ds run` ends with (mm_ds/pipeline/alignment.py), as it runs: the Step-2 runs of
    `alignment.aligned_runs` (the rule the run follows; every system, BL_BASE's too), their checkpoints and step 0 each
    scored over `align_sequences` held-out sequences by `row_for`'s forward passes: the primary model with the
    checkpoint's embeddings, and with the untrained ones beside its output bias ("bias only"; the same model at step
    0), and the mini-model at the depth Step 2 was training (mini-model systems). A target language's runs are one
    job on one GPU (align_spread.py), the languages taken longest first by every GPU. `runs`: `stage_run_costs`.
    Left out: a pass per primary model and mini-model on source-language text (align.source_rows)."""
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
                 f"busy), {sum(t.disk_bytes for t in totals) / 1e12:.2f} TB of checkpoints")
    lines.append("(Step 4 and the alignment check add reading each checkpoint they score)")
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

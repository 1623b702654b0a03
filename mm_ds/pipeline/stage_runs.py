"""A recipe's stage runs, in dependency order: each `StageRun` (stage, preset, overrides) gives its effective config
exactly as the stage command would, so the recipe check, `mm-ds flops` and `mm-ds plan` see what a run would run.
"""

from __future__ import annotations

from pathlib import Path

from ..stages.resolve import StageRun
from ..systems import system_of
from .recipe import MINI_DIR, Recipe, english_tasks, minis_in_english, primaries, task_root

PACKED = ("finetune",)
"""Stages of many small independent runs (Step 3: every primary model x task x seed, 60 in the paper recipe): each
runs on one device with the paper's batch, several at once on the launch's devices (mm_ds/pipeline/pack.py)."""
ONE_DEVICE = ["launch.launcher=none", "launch.ranks=1", "launch.nodes=1"]


def stage_runs(recipe: Recipe, out: Path) -> list[StageRun]:
    """Every training stage in dependency order (each node's parents come before it)."""
    data = out / "data"
    # launch.spread is `mm-ds run`'s own (mm_ds/pipeline/spread.py): it gives each side-by-side run its group's launch
    launch = [f"launch.{k}={v}" for k, v in recipe.launch.items() if k != "spread"]
    runs: list[StageRun] = []

    def add(stage: str, run: Path, system: str, lang: str, parent: Path | None, extra: list[str]) -> None:
        row = system_of(system)  # a variant takes its row's presets and overrides, then its own, then its depth
        preset = recipe.presets.get(stage, "").format(system=row.base)
        own = [*recipe.overrides.get(f"{stage}/{row.base}", [])] + (
            recipe.overrides.get(f"{stage}/{system}", []) if system != row.base else [])
        protocol = ["train.checkpoint_steps=[]"] if stage == "adapt" and not recipe.early(system, lang) else []
        overrides = [f"system={system}", f"lang={lang}", *(ONE_DEVICE if stage in PACKED else launch),
                     *recipe.overrides.get(stage, []), *own, *row.overrides(stage), *protocol, *extra]
        if parent is not None:
            overrides.append(f"parent={parent}")
        runs.append(StageRun(stage, run, preset, tuple(overrides), f"{stage}/{run.relative_to(out)}", stage in PACKED))

    for p in primaries(recipe):
        add("pretrain", out / "pretrain" / p, p, recipe.source_lang, None, [f"data.corpus={data / recipe.source_lang}"])
    for s in recipe.systems:
        if system_of(s).mini:
            add("build_mini", out / "build_mini" / s, s, recipe.source_lang, out / "pretrain" / system_of(s).primary,
                [f"data.corpus={data / recipe.source_lang}"])
    for s in recipe.systems:
        parent = out / "build_mini" / s if system_of(s).mini else out / "pretrain" / system_of(s).primary
        for lang in recipe.langs:
            add("adapt", out / "adapt" / s / lang, s, lang, parent, [f"data.corpus={data / lang}"])
    def finetune(model: str, system: str, parent: Path, tasks: list[str]) -> None:
        for task in tasks:
            for seed in recipe.seeds:
                add("finetune", out / "finetune" / model / task / f"seed{seed}", system, recipe.source_lang,
                    parent, [f"finetune.task={task}", f"train.seed={seed}",
                             f"finetune.data_root={task_root(recipe, out)}",
                             *recipe.overrides.get(f"finetune/{task}", [])])

    for p in primaries(recipe):
        finetune(p, p, out / "pretrain" / p, recipe.tasks)
    for s in minis_in_english(recipe):
        finetune(f"{MINI_DIR}/{s}", s, out / "build_mini" / s, english_tasks(recipe))
    return runs


def stage_configs(recipe: Recipe, out: Path = Path("OUT")) -> dict[str, object]:
    """Each planned stage run's effective RunConfig (preset, stage, system and task overrides), as the stage
    command `mm-ds run` would launch gives it, keyed by the run directory under `out`."""
    return {n.name.split("/", 1)[1]: n.config() for n in stage_runs(recipe, out)}

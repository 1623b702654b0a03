"""A recipe's work items besides its stage runs (mm_ds/pipeline/stage_runs.py): Step 3's pack, Step 4's evaluation and
the alignment check, made from the recipe on the launching side; the ranks that run them read no recipe
(mm_ds/pipeline/jobs.py).
"""

from __future__ import annotations

from pathlib import Path

from ..eval.align_spread import Alignment
from ..runtime.checkpointing.rundir import logs_dir
from ..stages.resolve import StageRun
from ..systems import system_of
from .alignment import aligned_runs
from .costs import finetune_costs
from .evaluation import PROGRESS, Evaluation, expand
from .jobs import Training
from .pack import STEP3, Pack, pack
from .recipe import MINI_DIR, data_path, english_tasks, minis_in_english, primaries, task_root
from .stage_runs import stage_configs


def work_items(recipe, out: Path, todo: list[StageRun]) -> list:
    """What `mm-ds run` has left to do, in order: the data-parallel stage runs of `todo` (not complete), Step 3's
    single-device runs as one pack, the evaluation, and the alignment check after it."""
    items: list = [Training(n) for n in todo if not n.packed]
    items += [step3([n for n in todo if n.packed], recipe, out)] if any(n.packed for n in todo) else []
    items.append(evaluation(recipe, out))
    return items + ([a] if (a := alignment(recipe, out)) is not None else [])


# ---------------------------------------------------------------- Step 3

def step3(runs: list, recipe, out: Path) -> Pack:
    """Step 3's runs as a pack, longest first (their costs as `mm-ds plan` counts them): the last to start are the
    shortest, so the devices finish close together."""
    costs = finetune_costs(recipe, stage_configs(recipe, out), out)
    order = sorted(runs, key=lambda r: -costs[r.name.split("/", 1)[1]].flops)
    return pack(logs_dir(out) / STEP3, STEP3, order, logs_dir(out))


# ---------------------------------------------------------------- Step 4

def evaluation(recipe, out: Path) -> Evaluation:
    """Step 4 of the recipe's run tree as a work item: its unit groups, the task data, where results go."""
    return Evaluation(str(task_root(recipe, out)), str(out / "eval"), tuple(eval_groups(recipe, out)),
                      str(logs_dir(out) / PROGRESS))


def eval_groups(recipe, out: Path) -> list[dict]:
    """Every Step-4 evaluation of the recipe as unit groups, sorted by task and primary model: the languages each
    task covers, every Step-2 checkpoint (curve) or the final one, a control per language, all seeds per unit."""
    groups = []
    for task in recipe.tasks:
        split, langs = recipe.split(task), recipe.evaluated(task)
        for p in primaries(recipe):
            ft = [str(out / "finetune" / p / task / f"seed{seed}") for seed in recipe.seeds]
            systems = [s for s in recipe.systems if system_of(s).primary == p]
            common = dict(task=task, finetuned=ft, split=split, limit=recipe.eval_examples)
            if recipe.source_lang in langs:  # one evaluation for every system sharing the primary model
                groups.append(common | dict(lang=recipe.source_lang, systems=systems))
            for s in systems:
                for lang in (lang for lang in langs if lang != recipe.source_lang):
                    groups.append(common | dict(lang=lang, systems=[s], adapted=str(out / "adapt" / s / lang),
                                                curve=recipe.curve, control=True))
        for s in minis_in_english(recipe) if task in english_tasks(recipe) else []:
            ft = [str(out / "finetune" / MINI_DIR / s / task / f"seed{seed}") for seed in recipe.seeds]
            groups.append(dict(task=task, lang=recipe.source_lang, systems=[s], finetuned=ft, split=split,
                               limit=recipe.eval_examples, mini=True))
    return groups


def eval_units(recipe, out: Path) -> list:
    """Every Step-4 evaluation of the recipe (`eval_groups`), as units."""
    return expand(eval_groups(recipe, out))


# ---------------------------------------------------------------- the alignment check

def runs_to_align(recipe, out: Path) -> tuple[list[list[Path]], dict[str, str]]:
    """(the Step-2 runs `alignment.align_recipe` scores, by target language: those of `alignment.aligned_runs`, the
    rule it follows; the held-out texts it is given)."""
    by_lang: dict[str, list[Path]] = {}
    for s, lang in aligned_runs(recipe, out):
        by_lang.setdefault(lang, []).append(out / "adapt" / s / lang)
    return list(by_lang.values()), {lang: str(data_path(recipe, f)) for lang, f in recipe.heldout.items()}


def alignment(recipe, out: Path) -> Alignment | None:
    """The alignment check of a recipe's run tree as a work item; None when there is nothing to score."""
    jobs, texts = runs_to_align(recipe, out)
    if not recipe.align_sequences or not jobs:
        return None
    return Alignment(tuple(tuple(str(r) for r in runs) for runs in jobs), texts, str(out), recipe.align_sequences)



"""`mm-ds flops`: the analytic training cost (paper appendix A.1) of every stage of a recipe.

The stages are read from the recipe the way `mm-ds run` would run them (each stage's effective config), and
each system's row of the systems table says which formula each of its stages costs: the paper recipe is
`presets/recipes/paper.yaml` and its presets, nothing else. Table 2 counts Step 2 only.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..data.tasks import get_task
from ..data.world import DEFAULT_TASK_SIZES
from ..model import flops
from ..runtime.training.ds_config import global_batch, micro_batch
from ..runtime.training.phases import DepthSchedule
from ..systems import system_of
from .check import model_after
from .recipe import load_recipe
from .stage_runs import stage_configs, stage_runs


@dataclass(frozen=True)
class StageCost:
    system: str
    """The paper's name (BL_BASE, ...)."""
    step: str
    """The paper's step: step1, step1b, step2 (multi-depth: one step2 row per depth, in order)."""
    formula: str
    """The FLOPs formula (flops.FORMULAS)."""
    layers: int
    """Layers the stage runs through (for build_mini: the whole mini-model, N + trainable)."""
    trainable_layers: int | None
    steps: int
    global_batch: int
    seq_len: int
    hidden: int
    vocab: int
    mask_prob: float
    checkpoints: int
    """Engine checkpoints the stage writes (its config's schedule)."""
    secondary_heads: int = 1
    """pretrain_secondary: the secondary MLM heads (multi-depth MINIJOINT has several)."""
    micro_batch: int | None = None
    """Sequences per device per forward pass, at most (its config's: ds_config.split); None: not set."""

    @property
    def flops_per_step(self) -> float:
        return flops.stage_flops_per_step(self.formula, hidden=self.hidden, vocab=self.vocab, layers=self.layers,
                                          seq_len=self.seq_len, mask_prob=self.mask_prob,
                                          global_batch=self.global_batch, trainable_layers=self.trainable_layers,
                                          secondary_heads=self.secondary_heads)

    @property
    def flops(self) -> float:
        return self.flops_per_step * self.steps

    @property
    def v100_days(self) -> float:
        return flops.to_v100_days(self.flops)

    def row(self) -> dict:
        return asdict(self) | {"flops_per_step": self.flops_per_step, "flops": self.flops, "v100_days": self.v100_days}


CHANGES = ("steps", "global_batch", "seq_len", "hidden", "vocab", "mask_prob")
"""What a cost estimate may change in every stage (`--steps`, `--batch`, ...)."""


def recipe_costs(recipe, systems: list[str] | None = None, cfgs: dict | None = None, **changes) -> list[StageCost]:
    """Steps 1, 1b and 2 of each system (label or config name) of an `mm-ds run` recipe, from its stage configs
    (`stage_runs.stage_configs`, parsed here unless given; one target language's Step 2 stands for every language's:
    the one with most checkpoints), with `changes` applied to every stage."""
    bad = [k for k in changes if k not in CHANGES]
    if bad:
        raise ValueError(f"cannot change {', '.join(bad)}; only {', '.join(CHANGES)}")
    names = {system_of(n).label: n for n in recipe.systems}
    chosen = [names.get(s, s) for s in systems] if systems else list(recipe.systems)
    missing = [s for s, n in zip(systems or chosen, chosen) if n not in recipe.systems]
    if missing:
        raise ValueError(f"--system {', '.join(missing)} not in the recipe (it has "
                         f"{', '.join(system_of(s).label for s in recipe.systems)})")
    price = _Prices(recipe, stage_configs(recipe) if cfgs is None else cfgs, changes)
    rows = []
    for name in chosen:
        # every language's Step 2 costs the same; the checkpoints (disk) are those of the language with most
        lang = max(recipe.langs, key=lambda lang: price.cfgs[f"adapt/{name}/{lang}"].train.checkpoints())
        rows += [price.step1(name, label=system_of(name).label), *price.step1b(name), *price.step2(name, lang)]
    return rows


def stage_run_costs(recipe, cfgs: dict, out: Path = Path("OUT")) -> list[tuple[str, list[StageCost]]]:
    """Every stage run `mm-ds run` would launch (`stage_runs.stage_runs`: shared stages once, every language, every
    finetuning), with its cost rows: a multi-depth Step 2 has one per depth, MINIJOINT's Step 1b (an extraction)
    none. `cfgs`: `stage_configs(recipe, out)`."""
    price, step3 = _Prices(recipe, cfgs, {}), finetune_costs(recipe, cfgs, out)
    rows = []
    for run in stage_runs(recipe, out):
        key = run.name.split("/", 1)[1]
        stage, system, *rest = key.split("/")
        rows.append((key, [price.step1(system)] if stage == "pretrain" else price.step1b(system)
                     if stage == "build_mini" else price.step2(system, rest[0]) if stage == "adapt" else [step3[key]]))
    return rows


class _Prices:
    """The cost rows of Steps 1, 1b and 2 from a recipe's stage configs (`stage_configs`), `changes` applied."""

    def __init__(self, recipe, cfgs: dict, changes: dict):
        self.cfgs, self.changes = cfgs, changes
        self.vocab = int(recipe.prepare.get("vocab_size", 50_000))

    def _row(self, label, primary, step, formula, cfg, layers, trainable=None) -> StageCost:
        model = self.cfgs[f"pretrain/{primary}"].model
        row = StageCost(label, step, formula, layers, trainable, cfg.train.steps, global_batch(cfg), cfg.data.seq_len,
                        model.hidden_size, model.vocab_size or self.vocab, cfg.data.mask_prob, cfg.train.checkpoints(),
                        micro_batch=micro_batch(cfg))
        return replace(row, **self.changes)

    def step1(self, name: str, label: str | None = None) -> StageCost:
        """The pretraining of `name`'s primary model (labelled `label`, default: the primary's)."""
        system = system_of(name)
        pre = self.cfgs[f"pretrain/{system.primary}"]
        return replace(self._row(label or system_of(system.primary).label, system.primary, "step1",
                                 system_of(system.primary).step1, pre, pre.model.num_layers),
                       secondary_heads=max(1, len(pre.model.secondary_depths)))

    def step1b(self, name: str) -> list[StageCost]:
        system = system_of(name)
        if system.mini != "build":
            return []  # none, or MINIJOINT's extraction: no update
        b, model = self.cfgs[f"build_mini/{name}"], self.cfgs[f"pretrain/{system.primary}"].model
        return [self._row(system.label, system.primary, "step1b", "build_mini", b,
                          system.adapted_depths(model, b.mini)[0], b.mini.new_layers)]

    def step2(self, name: str, lang: str) -> list[StageCost]:
        system = system_of(name)
        model = self.cfgs[f"pretrain/{system.primary}"].model
        mini = self.cfgs[f"build_mini/{name}"].mini if system.mini == "build" else None
        adapt = self.cfgs[f"adapt/{name}/{lang}"]
        return [replace(self._row(system.label, system.primary, "step2", "adapt", adapt, depth), steps=steps,
                        checkpoints=ckpts)
                for depth, steps, ckpts in step2_phases(adapt, system.adapted_depths(model, mini),
                                                        self.changes.get("steps"))]


WORLD_TRAIN = {"xnli": "nli_train", "pawsx": "paws_train", "mlqa": "qa_train", "xquad": "qa_train"}
"""The generated world's task size (mm_ds/data/world DEFAULT_TASK_SIZES) that is each task's English training set."""


def train_examples(recipe, task: str) -> int:
    """English training examples of `task` in the recipe's data: the task table's official size, or the
    generated world's."""
    if recipe.world is not None:
        return {**DEFAULT_TASK_SIZES, **(recipe.world.get("task_sizes") or {})}[WORLD_TRAIN[task]]
    return get_task(task).train_size


def finetune_costs(recipe, cfgs: dict | None = None, out: Path = Path("OUT")) -> dict[str, StageCost]:
    """Step 3 of an `mm-ds run` recipe, one row per finetuning run (keyed as `stage_configs` keys them, its
    configs parsed with `out` unless given), each on one device: the model its parent hands on, updates as the
    stage computes them (mm_ds/stages/finetune.py schedule) from the English training examples (QA: questions,
    a lower bound of its windows), epochs and batch."""
    import dataclasses
    import math

    cfgs = stage_configs(recipe, out) if cfgs is None else cfgs
    by_dir = {(out / name).resolve(): cfg for name, cfg in cfgs.items()}
    rows = {}
    for name, cfg in cfgs.items():
        if cfg.stage != "finetune":
            continue
        spec, ft = get_task(cfg.finetune.task), cfg.finetune
        model = model_after(by_dir[Path(cfg.parent).resolve()], by_dir)
        n = min(train_examples(recipe, spec.name), ft.max_train_examples or math.inf)
        B = global_batch(cfg)
        steps = max(1, math.ceil((ft.epochs if ft.epochs is not None else spec.epochs) * n / B))
        rows[name] = StageCost(system_of(cfg.system).label, "step3", "finetune", model.num_layers, None, steps, B,
                               min(ft.max_length or spec.max_length, model.max_positions), model.hidden_size,
                               model.vocab_size or int(recipe.prepare.get("vocab_size", 50_000)), 0.0,
                               dataclasses.replace(cfg.train, steps=steps).checkpoints(), micro_batch=micro_batch(cfg))
    return rows


def step2_phases(cfg, depths: tuple[int, ...], steps: int | None = None) -> list[tuple[int, int, int]]:
    """(depth, updates, checkpoints) of each phase of a Step 2 of `steps` updates (default: its config's), one
    phase unless multi-depth (mm_ds/runtime/training/phases.py). A plateau schedule's split is known only after the run:
    it is estimated as equal shares. Checkpoints follow the config's own schedule."""
    steps = cfg.train.steps if steps is None else steps
    if len(depths) == 1:
        return [(depths[0], steps, cfg.train.checkpoints())]
    phases = DepthSchedule(depths, steps, cfg.mini.depth_shares).phases_until(steps)
    return [(d, b - a, sum(cfg.train.is_checkpoint_step(s) for s in range(a + 1, min(b, cfg.train.steps) + 1)))
            for d, a, b in phases]


def format_costs(rows: list[StageCost]) -> str:
    head = "| system | step | formula | layers | trainable | steps | batch | seq | EFLOPs | V100-days |"
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.system} | {r.step} | {r.formula} | {r.layers} | {r.trainable_layers or ''} | "
                     f"{r.steps:,} | {r.global_batch} | {r.seq_len} | {r.flops / flops.EXA:.3g} | {r.v100_days:.3g} |")
    return "\n".join(lines)


def add_recipe_args(ap: argparse.ArgumentParser) -> None:
    """The recipe and what an estimate may change in it (shared with `mm-ds plan`)."""
    ap.add_argument("recipe", nargs="?", default="paper",
                    help="an `mm-ds run` recipe: packaged (paper, the default; tiny, quick, ...) or a YAML file")
    ap.add_argument("--system", action="append", help="only this system (repeatable), e.g. BL_BASE or bl_base")
    ap.add_argument("--steps", type=int, help="updates of every stage (paper: 125000)")
    ap.add_argument("--batch", type=int, help="global batch in sequences of every stage (paper: 2048)")
    ap.add_argument("--seq", type=int, help="sequence length (paper: 512)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="change a recipe key (repeatable), as `mm-ds run --set`")


def costs_from_args(a: argparse.Namespace, **extra) -> tuple[object, dict, list[StageCost]]:
    """(the recipe, its stage configs, their costs) as `add_recipe_args`' arguments ask."""
    changes = {k: v for k, v in dict(steps=a.steps, global_batch=a.batch, seq_len=a.seq, **extra).items()
               if v is not None}
    recipe = load_recipe(a.recipe, a.set)
    cfgs = stage_configs(recipe)  # ~3 s for the paper recipe's 121 stage runs: parsed once per command
    return recipe, cfgs, recipe_costs(recipe, a.system, cfgs, **changes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mm-ds flops", description="Analytic training cost of every stage of a recipe "
                                 "(paper appendix A.1; 1 V100-day = 2.592 EFLOPs). Table 2 counts step2 only.")
    add_recipe_args(ap)
    ap.add_argument("--recipe", dest="recipe_opt", help=argparse.SUPPRESS)  # the positional's earlier spelling
    ap.add_argument("--hidden", type=int, help="hidden size (paper: 768)")
    ap.add_argument("--vocab", type=int, help="vocabulary size (paper: 50000)")
    ap.add_argument("--mask-prob", type=float, help="MLM mask probability (paper: 0.15)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args(argv)
    args.recipe = args.recipe_opt or args.recipe
    try:
        _, _, rows = costs_from_args(args, hidden=args.hidden, vocab=args.vocab, mask_prob=args.mask_prob)
    except (OSError, ValueError) as e:  # ConfigError is a ValueError
        print(f"mm-ds flops: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"recipe": args.recipe, "stages": [r.row() for r in rows]}, indent=2))
    else:
        shapes = sorted({(r.hidden, r.vocab, r.mask_prob) for r in rows})
        print(f"recipe {args.recipe}: " + "; ".join(f"h={h} V={v} p={p}" for h, v, p in shapes) +
              "; per stage: U steps, B sequences of s tokens")
        print(format_costs(rows))
        print("Table 2 and the speedups count step2 only (paid per new language); step1/step1b are paid once.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Step 4: zero-shot transfer by swapping target embeddings into each finetuned model (paper §2.1).

Because Step 3 does not depend on Step 2, every Step-2 checkpoint of a language is scored by swapping its
language group into the finetuned models (one per seed) and averaging over seeds: whole training curves
cost evaluations, not finetuning runs. A control swaps in the *untrained* target embeddings (the Step-2
initialisation: overlap rows copied, the rest random), so the margin that Step 2 buys is visible.

One `Unit` is one checkpoint, or the source language, or a control, with all its seeds: `run_unit` scores it (its
model made once, each seed's weights loaded into it). Which units a recipe has, where their results are kept and
how the ranks of a launch share them is the pipeline's (mm_ds/pipeline/evaluation.py). `mm-ds transfer` scores one
task and language here, in this process.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import sentencepiece as spm

from ..config import ConfigError, model_config_from_dict
from ..data.task_files import load_split
from ..data.tasks import get_task, task_type_of
from ..data.tokenizer import pieces
from ..model import flops, surgery
from ..model.heads import RobertaForTask
from ..runtime.checkpointing import checkpoint
from .evaluate import evaluate, features_for, scoring_precision

SOURCE, ADAPTED, CONTROL, MINI = "source", "adapted", "control", "mini"
"""MINI: a finetuned mini-model in the source language, as it is (Table 5)."""


@dataclass(frozen=True)
class Unit:
    """One evaluation: the finetuned models of one primary model (one per seed) on one task and language,
    as they are (source), with one Step-2 checkpoint's language group (adapted), or with the untrained one
    (control). Its result is one row per system label (MINIPOST shares BL_BASE's source-language rows)."""

    task: str
    lang: str
    split: str
    condition: str
    """SOURCE, ADAPTED, CONTROL or MINI: what the finetuned models are scored with (results rows' `condition`)."""
    systems: tuple[str, ...]
    finetuned: tuple[str, ...]
    adapted: str | None = None
    """The Step-2 checkpoint (or run) whose language group is swapped in; for a control, the one whose
    initialisation is rebuilt."""
    limit: int | None = None
    """Only the first N examples of the evaluation file (recipe key eval_examples)."""

    @property
    def name(self) -> str:
        step = Path(self.adapted).name if self.adapted else "-"
        return f"{self.task}.{self.lang}.{'+'.join(self.systems)}.{self.condition}.{step}"


def load_finetuned(run: str | Path, task: str):
    meta, sd = checkpoint.load_final(run)
    if meta.get("stage") != "finetune":
        raise ConfigError(f"{run} is a {meta.get('stage')!r} checkpoint, not a finetuned model")
    if meta.get("task") != task:
        raise ConfigError(f"{run} was finetuned for task {meta.get('task')!r}, not {task!r}")
    return meta, model_config_from_dict(meta["model"]), sd


def adapted_checkpoints(adapted: str | Path, curve: bool) -> list[Path]:
    """The final weights of an adapt run, or every complete curve checkpoint of it (for training curves: not the
    time-based resume checkpoints, which fall wherever a clock or a stop put them)."""
    adapted = Path(adapted)
    if curve:
        found = checkpoint.list_checkpoints(adapted, of_kind="curve")
        if not found:
            raise ConfigError(f"{adapted} has no complete curve checkpoints to draw a curve from")
        return found
    return [adapted]


def units_for(task: str, lang: str, systems: list[str], finetuned: list[str], split: str,
              adapted: str | None = None, curve: bool = False, control: bool = False,
              limit: int | None = None, mini: bool = False) -> list[Unit]:
    """The units of one task, language and primary model (its finetuned models, one per seed): the source language
    as it is, or a mini-model as it is (`mini`), or every checkpoint of the Step-2 run `adapted` (`curve`; else its
    final weights) and, with `control`, the untrained embeddings."""
    common = dict(task=task, lang=lang, split=split, systems=tuple(systems), finetuned=tuple(finetuned), limit=limit)
    if mini:
        return [Unit(condition=MINI, **common)]
    if adapted is None:
        return [Unit(condition=SOURCE, **common)]
    ckpts = adapted_checkpoints(adapted, curve)
    units = [Unit(condition=ADAPTED, adapted=str(c), **common) for c in ckpts]
    return units + ([Unit(condition=CONTROL, adapted=str(ckpts[-1]), **common)] if control else [])


# ---------------------------------------------------------------- one unit

def _primary_of(meta: dict) -> str | None:
    p = meta.get("primary")
    if not p:
        return None
    p = Path(p).resolve()
    return str(p.parent if p.name == checkpoint.FINAL else p)


def _check_same_primary(adapted: str, adapt_meta: dict, ft_run: str, ft_meta: dict) -> None:
    """Embeddings learnt over a mini-model only fit the primary model that mini-model was cut from."""
    a, f = _primary_of(adapt_meta), _primary_of(ft_meta)
    if a and f and a != f:
        raise ConfigError(f"{adapted} was adapted over a model cut from {a}, but the finetuned model {ft_run} "
                          f"comes from {f}; pair each Step-2 run with finetuned models of its own primary model")


def control_group(adapt_meta: dict, seed: int) -> dict:
    """The language group Step 2 started from (deterministic), rebuilt from the adapt run's parent."""
    parent_meta, parent_sd = checkpoint.load_final(adapt_meta["parent"])
    pcfg = model_config_from_dict(parent_meta["model"])
    _, group, _ = surgery.init_target_embeddings(pcfg, parent_sd, pieces(parent_meta["tokenizer"]),
                                                 pieces(adapt_meta["tokenizer"]), seed=seed)
    return group


@lru_cache(maxsize=4)  # a job's units differ by task (4 in the paper) and share the primary model's seeds
def _finetuned(runs: tuple[str, ...], task: str) -> list:
    if not runs:
        raise ConfigError("give at least one finetuned run (--finetuned)")
    return [load_finetuned(r, task) for r in runs]


@lru_cache(maxsize=8)
def _examples(task: str, split: str, lang: str, data_root: str, limit: int | None):
    examples, report = load_split(get_task(task), split, lang, data_root)
    return examples[:limit] if limit else examples, sum(report.skipped.values())


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=path)


def score(finetuned: list, group: dict | None, spec, examples, sp, lang: str, device, batch: int = 64) -> list[float]:
    """One score per finetuned model (seed), with `group` swapped in (None: as it is). The seeds share the
    architecture and the tokenizer: one model is made on the device (no random initialisation: its weights are
    only ever loaded), each seed's weights are loaded into it, and the examples are encoded once."""
    import torch

    scores, features, model, made = [], None, None, None
    for meta, cfg, sd in finetuned:
        if group is not None:
            cfg, sd = surgery.swap_embeddings(cfg, sd, group)
        if (cfg, task_type_of(meta), meta["num_labels"]) != made:
            with torch.device("meta"):
                model = RobertaForTask(cfg, task_type_of(meta), meta["num_labels"])
            model, made = model.to_empty(device=device), (cfg, task_type_of(meta), meta["num_labels"])
            features = features_for(cfg, spec, examples, sp)
        model.load_state_dict(sd, strict=True)
        scores.append(evaluate(model, spec, examples, sp, lang, batch_size=batch, features=features).score)
    return scores


@lru_cache(maxsize=1)  # a job's units swap in the same checkpoint
def _step2(path: str) -> tuple[dict, dict]:
    """(meta, language group) of a Step-2 checkpoint or run: consolidated and hashed once for every task."""
    meta, sd = checkpoint.load_final(path)
    if meta.get("stage") != "adapt":
        raise ConfigError(f"{path} is a {meta.get('stage')!r} checkpoint, not a Step-2 (adapt) run")
    return meta, surgery.language_group(sd)


@lru_cache(maxsize=1)
def _control(parent: str, tokenizer: str, seed: int) -> dict:
    """The control's language group of a Step-2 run (`control_group`), made once for every task."""
    return control_group({"parent": parent, "tokenizer": tokenizer}, seed)


def run_unit(unit: Unit, data_root: str, device="cpu") -> list[dict]:
    spec = get_task(unit.task)
    finetuned = _finetuned(unit.finetuned, unit.task)
    examples, skipped = _examples(unit.task, unit.split, unit.lang, str(data_root), unit.limit)
    row = {"task": unit.task, "lang": unit.lang, "split": unit.split, "seeds": len(finetuned), "condition": unit.condition,
           "examples": len(examples), "skipped": skipped}
    if unit.condition in (SOURCE, MINI):
        sp = _tokenizer(finetuned[0][0]["tokenizer"])
        s = score(finetuned, None, spec, examples, sp, unit.lang, device)
        row |= {"step": 0, "flops": 0.0, "v100_days": 0.0, "layers": finetuned[0][1].num_layers}
    else:
        meta, group = _step2(unit.adapted)
        _check_same_primary(unit.adapted, meta, unit.finetuned[0], finetuned[0][0])
        sp = _tokenizer(meta["tokenizer"])
        if unit.condition == ADAPTED:
            surgery.check_vocab(group, sp.get_piece_size())
            row |= {"step": meta["step"], "flops": meta["flops"], "v100_days": flops.to_v100_days(meta["flops"])}
        else:
            group = _control(meta["parent"], meta["tokenizer"], meta["run_config"]["train"]["seed"])
            row |= {"step": 0, "flops": 0.0, "v100_days": 0.0}
        s = score(finetuned, group, spec, examples, sp, unit.lang, device)
    row |= {"score": statistics.mean(s), "per_seed": s}
    return [{"system": system} | row for system in unit.systems]


# ---------------------------------------------------------------- how a unit is scored

def scored_with(device) -> str:
    """How a unit scored on `device` is computed: its device type and precision, e.g. cuda/bf16 or cpu/fp32."""
    import torch

    return f"{torch.device(device).type}/{scoring_precision(device)}"


def transfer(task: str, lang: str, finetuned_runs: list[str], data_root: str, adapted: str | None = None,
             split: str = "test", curve: bool = False, control: bool = False, system: str | None = None,
             device="cpu") -> list[dict]:
    """Rows of one (task, language, primary model), in this process."""
    if not finetuned_runs:
        raise ConfigError("give at least one finetuned run (--finetuned)")
    label = system or _finetuned(tuple(finetuned_runs), task)[0][0].get("system")
    rows = []
    for unit in units_for(task, lang, [label], list(finetuned_runs), split, adapted, curve, control):
        rows += run_unit(unit, data_root, device)
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds transfer", description="Step 4: zero-shot transfer by embedding swap")
    p.add_argument("--task", required=True)
    p.add_argument("--lang", required=True)
    p.add_argument("--finetuned", nargs="+", required=True, help="finetune runs (one per seed) of one primary model")
    p.add_argument("--adapted", help="Step-2 run of --lang (omit to score the source language as is)")
    p.add_argument("--data-root", required=True, help="directory with the task files (official layout), or hub: "
                                                      "the Hugging Face hub through datasets (network or cache)")
    p.add_argument("--split", default="test")
    p.add_argument("--curve", action="store_true", help="score every checkpoint of --adapted, not only its final")
    p.add_argument("--control", action="store_true", help="also score the untrained target embeddings")
    p.add_argument("--system", help="label for the results (default: the finetuned model's system)")
    p.add_argument("--out", help="append result rows (JSON lines) to this file")
    a = p.parse_args(argv)
    import torch
    rows = transfer(a.task, a.lang, a.finetuned, a.data_root, a.adapted, a.split, a.curve, a.control,
                    system=a.system, device="cuda" if torch.cuda.is_available() else "cpu")
    for r in rows:
        print(json.dumps(r))
    if a.out:
        with open(a.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0

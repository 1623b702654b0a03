"""Step 4: zero-shot transfer by swapping target embeddings into each finetuned model (paper §2.1).

Because Step 3 does not depend on Step 2, every Step-2 checkpoint of a language is scored by swapping its
language group into the finetuned models (one per seed) and averaging over seeds: whole training curves
cost evaluations, not finetuning runs. A control swaps in the *untrained* target embeddings (the Step-2
initialisation: overlap rows copied, the rest random), so the margin that Step 2 buys is visible.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import sentencepiece as spm

from .. import checkpoint, flops, surgery
from ..config import ConfigError, model_config_from_dict
from ..data.tasks import get_task, load_split
from ..evaluate import evaluate
from ..heads import RobertaForTask
from .common import pieces


def load_finetuned(run: str | Path, task: str):
    meta, sd = checkpoint.load_final(run)
    if meta.get("stage") != "finetune":
        raise ConfigError(f"{run} is a {meta.get('stage')!r} checkpoint, not a finetuned model")
    if meta.get("task") != task:
        raise ConfigError(f"{run} was finetuned for task {meta.get('task')!r}, not {task!r}")
    return meta, model_config_from_dict(meta["model"]), sd


def adapted_checkpoints(adapted: str | Path, curve: bool) -> list[Path]:
    """The final weights of an adapt run, or every complete checkpoint of it (for training curves)."""
    adapted = Path(adapted)
    if curve:
        found = checkpoint.list_checkpoints(adapted)
        if not found:
            raise ConfigError(f"{adapted} has no complete checkpoints to draw a curve from")
        return found
    return [adapted]


def _primary_of(meta: dict) -> str | None:
    p = meta.get("primary")
    if not p:
        return None
    p = Path(p).resolve()
    return str(p.parent if p.name == checkpoint.FINAL else p)


def _check_same_primary(adapted: Path, adapt_meta: dict, ft_run: str, ft_meta: dict) -> None:
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


def score_group(finetuned: list, group: dict | None, spec, examples, sp, lang: str, batch: int) -> list[float]:
    scores = []
    for meta, cfg, sd in finetuned:
        if group is not None:
            cfg, sd = surgery.swap_embeddings(cfg, sd, group)
        model = RobertaForTask(cfg, meta["kind"], meta["num_labels"])
        model.load_state_dict(sd, strict=True)
        scores.append(evaluate(model, spec, examples, sp, lang, batch_size=batch).score)
    return scores


def transfer(task: str, lang: str, finetuned_runs: list[str], data_root: str, adapted: str | None = None,
             split: str = "test", curve: bool = False, control: bool = False, batch: int = 64,
             system: str | None = None) -> list[dict]:
    spec = get_task(task)
    finetuned = [load_finetuned(r, task) for r in finetuned_runs]
    if not finetuned:
        raise ConfigError("give at least one finetuned run (--finetuned)")
    rows = []
    base = {"task": task, "lang": lang, "split": split, "seeds": len(finetuned),
            "system": system or finetuned[0][0].get("system")}
    if adapted is None:  # source language: the finetuned models as they are
        examples, report = load_split(spec, split, lang, data_root)
        sp = spm.SentencePieceProcessor(model_file=finetuned[0][0]["tokenizer"])
        s = score_group(finetuned, None, spec, examples, sp, lang, batch)
        return [base | {"kind": "source", "step": 0, "flops": 0.0, "v100_days": 0.0,
                        "score": statistics.mean(s), "per_seed": s, "skipped": sum(report.skipped.values())}]
    examples, report = load_split(spec, split, lang, data_root)
    for ck in adapted_checkpoints(adapted, curve):
        meta, sd = checkpoint.load_final(ck)
        if meta.get("stage") != "adapt":
            raise ConfigError(f"{ck} is a {meta.get('stage')!r} checkpoint, not a Step-2 (adapt) run")
        _check_same_primary(ck, meta, finetuned_runs[0], finetuned[0][0])
        group = surgery.language_group(sd)
        sp = spm.SentencePieceProcessor(model_file=meta["tokenizer"])
        surgery.check_vocab(group, sp.get_piece_size())
        s = score_group(finetuned, group, spec, examples, sp, lang, batch)
        rows.append(base | {"kind": "adapted", "step": meta["step"], "flops": meta["flops"],
                            "v100_days": flops.to_v100_days(meta["flops"]), "score": statistics.mean(s),
                            "per_seed": s, "skipped": sum(report.skipped.values())})
        if control and ck == adapted_checkpoints(adapted, curve)[-1]:
            s = score_group(finetuned, control_group(meta, meta["run_config"]["train"]["seed"]), spec,
                            examples, sp, lang, batch)
            rows.append(base | {"kind": "control", "step": 0, "flops": 0.0, "v100_days": 0.0,
                                "score": statistics.mean(s), "per_seed": s})
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds transfer", description="Step 4: zero-shot transfer by embedding swap")
    p.add_argument("--task", required=True)
    p.add_argument("--lang", required=True)
    p.add_argument("--finetuned", nargs="+", required=True, help="finetune runs (one per seed) of one primary model")
    p.add_argument("--adapted", help="Step-2 run of --lang (omit to score the source language as is)")
    p.add_argument("--data-root", required=True, help="directory with the task files (official layout)")
    p.add_argument("--split", default="test")
    p.add_argument("--curve", action="store_true", help="score every checkpoint of --adapted, not only its final")
    p.add_argument("--control", action="store_true", help="also score the untrained target embeddings")
    p.add_argument("--system", help="label for the results (default: the finetuned model's system)")
    p.add_argument("--out", help="append result rows (JSON lines) to this file")
    a = p.parse_args(argv)
    rows = transfer(a.task, a.lang, a.finetuned, a.data_root, a.adapted, a.split, a.curve, a.control,
                    system=a.system)
    for r in rows:
        print(json.dumps(r))
    if a.out:
        with open(a.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0

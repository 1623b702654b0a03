"""Step 4: zero-shot transfer by swapping target embeddings into each finetuned model (paper §2.1).

Because Step 3 does not depend on Step 2, every Step-2 checkpoint of a language is scored by swapping its
language group into the finetuned models (one per seed) and averaging over seeds: whole training curves
cost evaluations, not finetuning runs. A control swaps in the *untrained* target embeddings (the Step-2
initialisation: overlap rows copied, the rest random), so the margin that Step 2 buys is visible.

At the paper's scale that is 4 systems x 14 languages x ~29 checkpoints x 5 seeds over four test sets, so the
work is cut into independent `Unit`s (one checkpoint, or the source language, or a control, with all its seeds)
that the ranks of a launch share, each on its rank's device: they take jobs one at a time from a queue
(mm_ds/runtime/jobs.py), a job being the units that swap in one Step-2 checkpoint (one per task, and its control), which
is read and hashed once for all of them. A unit builds its model once and loads each seed's weights into it.
A unit's result is a file under OUT/eval/ keyed by a fingerprint of its inputs (manifests of the checkpoints,
the task file) and of how it was scored (device type and precision: bf16 autocast on GPUs, fp32 on CPU): an
interrupted evaluation resumes, a finished one is not redone, and a result scored on another kind of device is
scored again, so that one table never mixes precisions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import sentencepiece as spm

from ..runtime import checkpoint
from ..model import flops, surgery
from ..config import ConfigError, model_config_from_dict
from ..data.task_files import load_split
from ..data.tasks import find_local, get_task, hub_source, is_hub, task_type_of
from ..data.tokenizer import pieces
from .evaluate import evaluate, features_for, scoring_precision
from ..model.heads import RobertaForTask
from ..recipe import MINI_DIR, english_tasks, minis_in_english, primaries, task_root
from ..systems import system_of

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
              limit: int | None = None) -> list[Unit]:
    common = dict(task=task, lang=lang, split=split, systems=tuple(systems), finetuned=tuple(finetuned), limit=limit)
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


# ---------------------------------------------------------------- many units, many ranks

def scored_with(device) -> str:
    """How a unit scored on `device` is computed: its device type and precision, e.g. cuda/bf16 or cpu/fp32."""
    import torch

    return f"{torch.device(device).type}/{scoring_precision(device)}"


def unit_fingerprint(unit: Unit, data_root: str, base: Path, how: str | None) -> str:
    """Changes when any input of the unit changes: the manifests (sha256 of every weight file) of the
    finetuned models and of the Step-2 checkpoint, the task file's size and time (the hub's dataset, config
    and split for data root `hub`), and `how` it is scored (`scored_with`). Paths count relative to `base`
    (the run tree), so a run tree moved elsewhere keeps its results."""
    base = base.resolve()

    def rel(p) -> str:
        p = Path(p).resolve()
        return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)

    fields = asdict(unit) | {"finetuned": [rel(r) for r in unit.finetuned],
                             "adapted": rel(unit.adapted) if unit.adapted else None, "scored_with": how}
    fields["kind"] = fields.pop("condition")  # its name when earlier results were hashed: they stay current
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for run in (*unit.finetuned, *([unit.adapted] if unit.adapted else [])):
        man = checkpoint.manifest_of(run)
        h.update(man.read_bytes() if man.is_file() else b"-")
    spec = get_task(unit.task)
    if is_hub(data_root):  # the hub's name for the split; its revision is the datasets cache's business
        h.update(repr(hub_source(spec, unit.split, unit.lang)).encode())
    else:
        f = find_local(spec, unit.split, unit.lang, data_root)
        h.update(f"{rel(f)}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode())
    return h.hexdigest()


def _result_path(results: Path, unit: Unit) -> Path:
    return results / f"{unit.name}.json"


def _saved(results: Path, unit: Unit, data_root: str) -> dict | None:
    """The unit's result file ({fingerprint, scored_with, rows}) when its inputs are current."""
    try:
        saved = json.loads(_result_path(results, unit).read_text())
        how = saved.get("scored_with")
    except (OSError, ValueError, AttributeError):
        return None
    return saved if saved.get("fingerprint") == unit_fingerprint(unit, data_root, results.parent, how) else None


def cached(results: Path, unit: Unit, data_root: str, how: str) -> list[dict] | None:
    """The unit's rows when its result is current and was scored `how` (`scored_with`); else None."""
    saved = _saved(results, unit, data_root)
    return saved["rows"] if saved is not None and saved["scored_with"] == how else None


def eval_jobs(units: list[Unit]) -> list[list[int]]:
    """What a rank takes at once (`run_units`): the units that swap in the same Step-2 checkpoint (one per task
    covering its language, and the control) together, so that it is read and hashed once; the others alone."""
    jobs: dict = {}
    for i, unit in enumerate(units):
        jobs.setdefault(unit.adapted or i, []).append(i)
    return list(jobs.values())


def run_units(units: list[Unit], data_root: str, results: Path, device="cpu", say=print) -> None:
    """Every unit without a current result, written to results/, scored on this kind of device: under a launch,
    this rank's share, taking jobs (`eval_jobs`) from the queue the ranks share until none is left (mm_ds/runtime/jobs.py;
    a failure stops every rank from taking more and is raised here once all have stopped)."""
    from ..runtime import dist
    from ..runtime.jobs import Queue

    jobs, how, error = eval_jobs(units), scored_with(device), None
    queue, rank, world = Queue("eval", len(jobs)), dist.rank(), dist.world_size()
    t0, last = time.monotonic(), 0.0
    try:
        results.mkdir(parents=True, exist_ok=True)
        while (j := queue.claim()) is not None:
            for unit in (units[i] for i in jobs[j]):
                if cached(results, unit, data_root, how) is None:
                    rows = run_unit(unit, data_root, device)
                    checkpoint.write_json_atomic(_result_path(results, unit), {
                        "fingerprint": unit_fingerprint(unit, data_root, results.parent, how), "scored_with": how,
                        "rows": rows})
            if rank == 0 and time.monotonic() - last > 10:  # progress from the shared files
                last = time.monotonic()
                done = sum(_result_path(results, u).is_file() for u in units)
                say(f"[mm-ds] evaluation: {done}/{len(units)} units done ({world} rank(s)), {last - t0:.0f} s")
    except Exception as e:  # noqa: BLE001  raised below, once no rank works on
        error = e
        queue.stop()
    queue.drain()
    if error is not None:
        raise error
    if rank == 0:
        say(f"[mm-ds] evaluation: {len(units)} units done ({world} rank(s)), {time.monotonic() - t0:.0f} s")


def collect(units: list[Unit], data_root: str, results: Path) -> list[dict]:
    """Every unit's rows, in unit order; a unit without a current result, or results scored on different
    kinds of device (`scored_with`), are an error naming them."""
    rows, by_how = [], {}
    for unit in units:
        saved = _saved(results, unit, data_root)
        if saved is None:
            raise ConfigError(f"evaluation {unit.name} has no current result in {results}; re-run the same "
                              f"command (finished units are kept)")
        rows += saved["rows"]
        by_how.setdefault(saved["scored_with"], []).append(unit.name)
    if len(by_how) > 1:
        mix = "; ".join(f"{how}: {len(names)} (e.g. {names[0]})" for how, names in by_how.items())
        raise ConfigError(f"the results in {results} were scored on different kinds of device and precision ({mix}), "
                          f"which one table must not mix; re-run the evaluation where the rest should be scored "
                          f"(it scores again whatever another kind of device scored)")
    return rows


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


def eval_units(recipe, out: Path) -> list[Unit]:
    """Every Step-4 evaluation of the recipe, sorted by task and primary model: the languages each task
    covers, every Step-2 checkpoint (curve) or the final one, a control per language, all seeds per unit."""
    units = []
    for task in recipe.tasks:
        split, langs = recipe.split(task), recipe.evaluated(task)
        for p in primaries(recipe):
            ft = [str(out / "finetune" / p / task / f"seed{seed}") for seed in recipe.seeds]
            systems = [s for s in recipe.systems if system_of(s).primary == p]
            if recipe.source_lang in langs:  # one evaluation for every system sharing the primary model
                units += units_for(task, recipe.source_lang, systems, ft, split, limit=recipe.eval_examples)
            for s in systems:
                for lang in (lang for lang in langs if lang != recipe.source_lang):
                    units += units_for(task, lang, [s], ft, split, str(out / "adapt" / s / lang),
                                       curve=recipe.curve, control=True, limit=recipe.eval_examples)
        for s in minis_in_english(recipe) if task in english_tasks(recipe) else []:
            ft = tuple(str(out / "finetune" / MINI_DIR / s / task / f"seed{seed}") for seed in recipe.seeds)
            units.append(Unit(task, recipe.source_lang, split, MINI, (s,), ft, limit=recipe.eval_examples))
    return units


def write_eval_spec(recipe, out: Path) -> Path:
    """OUT/logs/eval.json: the units and where their results go, for `mm-ds run-eval` on every rank."""
    path = out / "logs" / "eval.json"
    spec = {"data_root": str(task_root(recipe, out)), "results": str(out / "eval"),
            "units": [asdict(u) for u in eval_units(recipe, out)]}
    with checkpoint.writing(path, then="re-run the same command"):
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_json_atomic(path, spec)
    return path


def units_from_spec(spec: dict) -> list[Unit]:
    """The units of an eval.json (`write_eval_spec`)."""
    return [Unit(**{**u, "systems": tuple(u["systems"]), "finetuned": tuple(u["finetuned"])}) for u in spec["units"]]


def results_written(spec: dict) -> int:
    """How many units of an eval.json have a result file (current or not): progress, not correctness."""
    return sum(_result_path(Path(spec["results"]), u).is_file() for u in units_from_spec(spec))


def run_eval_main(argv: list[str]) -> int:
    """`mm-ds run`'s evaluation on every rank of a launch (internal): EVAL.json lists the units. Given
    RECIPE.json and OUT as well (a one-job run, whose Step 2 has only just finished), rank 0 lists them first."""
    from ..runtime import dist

    rank, _, world = dist.init()
    if len(argv) == 3:
        from ..config import from_dict
        from ..recipe import Recipe
        dist.on_rank0(lambda: write_eval_spec(from_dict(Recipe, json.loads(Path(argv[1]).read_text())),
                                              Path(argv[2])), f"listing the evaluation units into {argv[0]}")
    spec = dist.on_rank0(lambda: json.loads(Path(argv[0]).read_text()), f"reading {argv[0]}")  # rank 0's, for all
    error = None
    try:
        units, device = units_from_spec(spec), dist.device()
        if rank == 0:
            print(f"[mm-ds] evaluation: {len(units)} units on {world} rank(s), {scored_with(device)}", flush=True)
        run_units(units, spec["data_root"], Path(spec["results"]), device, say=lambda m: print(m, flush=True))
    except Exception as e:  # noqa: BLE001  reported below, after every rank knows
        error = f"rank {rank}: {type(e).__name__}: {e}"
    if dist.any_rank(error is not None):  # every rank learns of a failure: none waits forever in a barrier
        if error:
            raise ConfigError(error)
        raise dist.OtherRankFailed(f"rank {rank} stopped: another rank failed in the evaluation (its output says why)")
    return 0

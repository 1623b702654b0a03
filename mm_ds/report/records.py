"""Evaluation records in: one per evaluated checkpoint, {system, task, lang, step, flops, v100_days, score}, the
score already averaged over finetuning seeds, from CSV, JSON (a list, or {"results": [...]}) or JSONL (as
`mm-ds run` writes results.jsonl; its `examples` and `per_seed` are kept for the significance test). What is wrong
with a record is collected as a warning, never raised.

The alignment check's rows (mm_ds/eval/align.py) are records too (`mlm_results`): task MLM, the score the held-out
target-language MLM accuracy (%) of the primary model with a Step-2 checkpoint's embeddings, n its masked tokens;
the control is step 0, the untrained embeddings."""
from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..model.flops import V100_DAY_FLOPS

FIELDS = ("system", "task", "lang", "step", "flops", "v100_days", "score")
MLM = "mlm"
"""The task name of the MLM-level records (`mlm_results`)."""


@dataclass(frozen=True)
class Result:
    system: str
    task: str
    lang: str
    step: int
    flops: float
    v100_days: float
    score: float
    n: int | None = None
    """Test examples the score is over (masked tokens for MLM); None: not recorded."""
    per_seed: tuple[float, ...] = ()
    """The score of each finetuning seed (the significance test's paired differences)."""


class _Problems:
    """Groups per-record problems by message, so 1,000 bad rows make one warning, not 1,000."""

    def __init__(self):
        self.where: dict[str, list[str]] = defaultdict(list)

    def add(self, msg: str, loc: str):
        self.where[msg].append(loc)

    def warnings(self) -> list[str]:
        out = []
        for msg, locs in self.where.items():
            more = f" and {len(locs) - 3} more" if len(locs) > 3 else ""
            out.append(f"{msg}: {len(locs)} record(s) skipped ({', '.join(locs[:3])}{more})")
        return out


def condition(rec: dict, default: str | None = None) -> str | None:
    """A results row's condition (source, adapted, control, mini: mm_ds/eval/transfer.py); results files written
    before it had that name call it `kind`."""
    return rec.get("condition", rec.get("kind", default))


def _number(v, cast):
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        x = cast(float(v))
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {v!r}") from None
    return None if isinstance(x, float) and math.isnan(x) else x


def clean_records(raw: Iterable[dict], source: str = "records") -> tuple[list[Result], list[str]]:
    """Dicts -> Results. Skips (and reports) records missing a name field, the step, the score, or both costs;
    fills flops from v100_days or the reverse when only one is given."""
    problems, results = _Problems(), []
    for i, rec in enumerate(raw):
        loc = f"{source}#{i + 1}"
        if not isinstance(rec, dict):
            problems.add("record is not an object/row", loc)
            continue
        if condition(rec, "adapted") != "adapted":  # mm-ds run also records source-language and control rows
            continue
        missing = [k for k in ("system", "task", "lang") if not str(rec.get(k) or "").strip()]
        if missing:
            problems.add(f"missing {'/'.join(missing)}", loc)
            continue
        try:
            step = _number(rec.get("step"), int)
            score = _number(rec.get("score"), float)
            flops = _number(rec.get("flops"), float)
            days = _number(rec.get("v100_days"), float)
            n, per_seed = _n_and_seeds(rec)
        except ValueError as e:
            problems.add(f"bad value ({e})", loc)
            continue
        if step is None:
            problems.add("missing step", loc)
            continue
        if score is None:
            problems.add("missing score", loc)
            continue
        if flops is None and days is None:
            problems.add("missing both flops and v100_days", loc)
            continue
        flops = days * V100_DAY_FLOPS if flops is None else flops
        days = flops / V100_DAY_FLOPS if days is None else days
        results.append(Result(str(rec["system"]).strip().upper(), str(rec["task"]).strip(), str(rec["lang"]).strip(),
                              step, flops, days, score, n, per_seed))
    return results, problems.warnings()


def _n_and_seeds(rec: dict) -> tuple[int | None, tuple[float, ...]]:
    """A record's example count (`examples` as mm-ds run writes it, or `n`) and per-seed scores (a list, or its
    JSON text in a CSV cell)."""
    n = _number(rec.get("examples", rec.get("n")), int)
    seeds = rec.get("per_seed") or ()
    if isinstance(seeds, str):
        try:
            seeds = json.loads(seeds)
        except json.JSONDecodeError:
            raise ValueError(f"per_seed is not a JSON list: {seeds!r}") from None
    if not isinstance(seeds, (list, tuple)):
        raise ValueError(f"per_seed is not a list: {seeds!r}")
    return n, tuple(_number(x, float) for x in seeds)


def control_scores(raw: Iterable[dict]) -> dict[tuple[str, str, str], Result]:
    """(task, lang, SYSTEM) -> the control row `mm-ds run` records (the finetuned model with untrained target
    embeddings, with its examples and per-seed scores): what a transfer must beat to have learned anything."""
    controls = [{"step": 0, "flops": 0.0} | rec | {"condition": "adapted"} for rec in raw  # no cost: step 0
                if isinstance(rec, dict) and condition(rec) == "control"]
    return {(r.task, r.lang, r.system): r for r in clean_records(controls, "controls")[0]}


def mlm_results(rows: Iterable[dict]) -> tuple[list[Result], dict[tuple[str, str, str], Result]]:
    """(records, controls) of the alignment check's rows (align.py): per Step-2 checkpoint the primary model's
    held-out MLM accuracy with its embeddings, task MLM; step 0 (the initial, untrained embeddings) is both the
    curve's first point and the control."""
    results, controls = [], {}
    for r in rows:
        if r.get("kind", "target") != "target":  # the source-language rows (English MLM) are no curve
            continue
        res = Result(str(r["system"]).upper(), MLM, r["lang"], int(r["step"]), float(r["flops"]),
                     float(r["v100_days"]), 100 * float(r["primary_acc"]), int(r["targets"]))
        results.append(res)
        if res.step == 0:
            controls[(MLM, res.lang, res.system)] = res
    return results, controls


def mlm_baselines(rows: Iterable[dict]) -> dict[tuple[str, str], float]:
    """(task MLM, lang) -> the target unigram predictor's held-out accuracy % on the alignment check's tokens (the
    MLM-level Table 2's baseline row); absent in rows written before 2026-11-27."""
    return {(MLM, r["lang"]): 100 * float(r["unigram_acc"]) for r in rows
            if r.get("kind", "target") == "target" and r.get("unigram_acc") is not None}


def source_scores(raw: Iterable[dict]) -> dict[tuple[str, str, str], float]:
    """(task, lang, SYSTEM) -> the source-language score `mm-ds run` records for each system (its primary model
    finetuned and scored in English, no swap): Table 2's source column."""
    out = {}
    for rec in raw:
        if isinstance(rec, dict) and condition(rec) == "source":
            score = _number(rec.get("score"), float)
            if score is not None:
                out[(str(rec["task"]).strip(), str(rec["lang"]).strip(), str(rec["system"]).strip().upper())] = score
    return out


def recorded(raw: Iterable[dict], key: str) -> dict[str, list]:
    """task -> the distinct values of `key` (e.g. `seeds`, `split`) its records carry, sorted; tasks whose records
    do not carry it are absent (a CSV of your own need not say how many seeds stand behind a score)."""
    out: dict[str, set] = defaultdict(set)
    for rec in raw:
        if isinstance(rec, dict) and rec.get(key) not in (None, "") and rec.get("task"):
            out[str(rec["task"]).strip()].add(rec[key])
    return {t: sorted(v, key=str) for t, v in out.items()}


def read_records(path: str | Path) -> tuple[list[dict], list[str]]:
    """Raw dicts from a .csv, .json or .jsonl file, plus warnings (a file that cannot be read is one)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        return [], [f"cannot read results file {path}: {e}"]
    try:
        if path.suffix == ".csv":
            reader = csv.DictReader(text.splitlines())
            rows = list(reader)
            absent = [f for f in FIELDS if f not in (reader.fieldnames or [])]
            absent = [f for f in absent if f not in ("flops", "v100_days")] + (
                ["flops and v100_days"] if {"flops", "v100_days"} <= set(absent) else [])
            return rows, [f"{path}: no column {', '.join(absent)} (expected {', '.join(FIELDS)})"] if absent else []
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()], []
        if path.suffix == ".json":
            data = json.loads(text)
            data = data.get("results", data) if isinstance(data, dict) else data
            if not isinstance(data, list):
                return [], [f"{path}: expected a list of records or {{\"results\": [...]}}"]
            return data, []
    except json.JSONDecodeError as e:
        return [], [f"{path}: invalid JSON ({e})"]
    return [], [f"{path}: unsupported file type {path.suffix!r}; use .csv, .json or .jsonl"]


def load_results(paths: Sequence[str | Path], controls: dict | None = None,
                 rows_out: list | None = None) -> tuple[list[Result], list[str]]:
    """Results and warnings of every file; `controls`, if given, gets their control scores (control_scores),
    `rows_out` every raw row (for source_scores and recorded)."""
    results, warnings = [], []
    for p in paths:
        rows, w = read_records(p)
        warnings += w
        if controls is not None:
            controls.update(control_scores(rows))
        if rows_out is not None:
            rows_out += [r for r in rows if isinstance(r, dict)]
        r, w = clean_records(rows, source=str(p))
        results += r
        warnings += w
    return results, warnings

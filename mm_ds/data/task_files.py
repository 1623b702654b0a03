"""Task files (and hub splits) -> records: readers for the four file formats `TASKS` names.

Loaders return plain records plus a `LoadReport` that counts every skipped row by reason: a bad row is never
silently trained on or scored, and a file with nothing usable in it is an error for the whole file.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

from .tasks import EXTRACTIVE_QA, HUB, TaskDataError, TaskSpec, check_split, find_local, hub_source, is_hub

# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class PairExample:
    id: str
    text_a: str
    text_b: str
    label: int
    """Index into the task's `labels`."""


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    """(text, character start in `context`) per gold answer; SQuAD dev / MLQA / XQuAD may list several."""


Example = Union[PairExample, QAExample]


@dataclass
class LoadReport:
    """What a loader kept and what it skipped, by reason.

    Reasons count rows (TSV/JSONL) or questions (SQuAD JSON), except `answer_*` reasons, which count single
    gold answers dropped from a question that is otherwise kept.
    """

    source: str
    loaded: int = 0
    skipped: Counter = field(default_factory=Counter)
    first_seen: dict[str, str] = field(default_factory=dict)
    """reason -> where it first happened (line number or question id), to find the bad row quickly."""
    other_language: int = 0
    """Rows of a multi-language file (XNLI-1.0) that belong to another language: filtered, not bad."""

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self.first_seen.setdefault(reason, where)

    def counts(self) -> str:
        parts = [f"{self.loaded} loaded"]
        parts += [f"{n} skipped ({reason}, first at {self.first_seen[reason]})"
                  for reason, n in sorted(self.skipped.items())]
        return "; ".join(parts)

    def summary(self) -> str:
        return f"{self.source}: {self.counts()}"


# ------------------------------------------------------------------------------------- record checks


def _pair(spec: TaskSpec, report: LoadReport, where: str, id_: str, a: Any, b: Any,
          label: str | None) -> PairExample | None:
    """One validated pair example, or None with the reason counted."""
    if label is None:
        report.skip("no_gold_label", where)
        return None
    if label not in spec.labels:
        report.skip("label_not_in_set", where)
        return None
    if not isinstance(a, str) or not isinstance(b, str) or not a.strip() or not b.strip():
        report.skip("empty_text", where)
        return None
    report.loaded += 1
    return PairExample(id_, a, b, spec.labels.index(label))


def _qa(report: LoadReport, seen: set[str], id_: Any, question: Any, context: str, answers: Any,
        check_offsets: bool) -> QAExample | None:
    """One validated QA example, or None with the reason counted.

    With `check_offsets`, answers whose text is not at `answer_start` are dropped (training needs the
    offsets); the official scorers only compare answer texts, so `score` passes False.
    """
    where = f"question {id_}"
    if not isinstance(id_, str) or not id_ or not isinstance(question, str) or not isinstance(answers, list):
        report.skip("malformed_question", where)
        return None
    if id_ in seen:
        report.skip("duplicate_id", where)
        return None
    if not question.strip():
        report.skip("empty_question", where)
        return None
    if not answers:
        report.skip("no_answers", where)
        return None
    kept = []
    for ans in answers:
        text, start = (ans.get("text"), ans.get("answer_start")) if isinstance(ans, dict) else (None, None)
        if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, int):
            report.skip("answer_malformed", where)
        elif check_offsets and context[start:start + len(text)] != text:
            report.skip("answer_start_mismatch", where)
        else:
            kept.append((text, start))
    if not kept:
        report.skip("no_valid_answer", where)
        return None
    seen.add(id_)
    report.loaded += 1
    return QAExample(id_, question, context, tuple(kept))


def _finish(examples: list, report: LoadReport) -> tuple[list, LoadReport]:
    if not examples:
        raise TaskDataError(f"{report.source}: nothing usable in it ({report.counts()}); check that it is "
                            f"the right file for the task and split")
    return examples, report


# ------------------------------------------------------------------------------------------- readers


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskDataError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise TaskDataError(f"{path}: not UTF-8 text ({e}); task files must be UTF-8") from None


def _tsv_rows(path: Path, required: Sequence[str], report: LoadReport) -> Iterable[tuple[int, dict[str, str]]]:
    """(line number, row-by-column-name) for each well-formed data line of a header-first TSV.

    Fields are split on tabs with no quote handling: XNLI and PAWS-X text contains bare `"` characters.
    """
    lines = _read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or not lines[0].strip():
        raise TaskDataError(f"{path}: empty file (expected a header line with columns {', '.join(required)})")
    header = lines[0].rstrip("\r").split("\t")
    missing = [c for c in required if c not in header]
    if missing:
        raise TaskDataError(f"{path}: missing column(s) {', '.join(missing)}; the header has "
                            f"{', '.join(header)}. Is this the right file for the task?")
    for lineno, line in enumerate(lines[1:], start=2):
        where = f"line {lineno}"
        line = line.rstrip("\r")
        if not line.strip():
            report.skip("empty_line", where)
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            report.skip("malformed_row", where)
            continue
        yield lineno, dict(zip(header, fields))


def read_xnli_tsv(path: Path, spec: TaskSpec, lang: str | None) -> tuple[list[PairExample], LoadReport]:
    """XNLI-1.0 TSV (all languages in one file, or one file per language), read by header names.

    With `lang`, rows whose `language` column names another language are filtered out (not counted bad).
    """
    report = LoadReport(str(path))
    out, present = [], Counter()
    for lineno, row in _tsv_rows(path, ("gold_label", "sentence1", "sentence2"), report):
        row_lang = row.get("language", "")
        present[row_lang] += 1
        if lang is not None and row_lang and row_lang != lang:
            report.other_language += 1
            continue
        id_ = row.get("pairID") or f"{path.name}:{lineno}"
        ex = _pair(spec, report, f"line {lineno}", id_, row["sentence1"], row["sentence2"],
                   row["gold_label"].strip())
        if ex is not None:
            out.append(ex)
    if not out and report.other_language:
        raise TaskDataError(f"{path}: no rows for language {lang!r}; languages present: "
                            f"{', '.join(sorted(present))}")
    return _finish(out, report)


def read_mnli_jsonl(path: Path, spec: TaskSpec, lang: str | None) -> tuple[list[PairExample], LoadReport]:
    """MultiNLI JSONL; `gold_label` "-" (no annotator majority) is skipped and counted as no_gold_label."""
    report = LoadReport(str(path))
    out = []
    lines = _read_text(path).split("\n")
    for lineno, line in enumerate(lines, start=1):
        where = f"line {lineno}"
        if not line.strip():
            if lineno < len(lines):
                report.skip("empty_line", where)
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not all(k in row for k in ("gold_label", "sentence1", "sentence2")):
            report.skip("malformed_row", where)
            continue
        label = None if row["gold_label"] == "-" else row["gold_label"]
        id_ = str(row.get("pairID") or f"{path.name}:{lineno}")
        ex = _pair(spec, report, where, id_, row["sentence1"], row["sentence2"], label)
        if ex is not None:
            out.append(ex)
    return _finish(out, report)


def read_pawsx_tsv(path: Path, spec: TaskSpec, lang: str | None) -> tuple[list[PairExample], LoadReport]:
    """PAWS-X TSV `id sentence1 sentence2 label` (the zh copy here has empty ids: line numbers stand in)."""
    report = LoadReport(str(path))
    out = []
    for lineno, row in _tsv_rows(path, ("sentence1", "sentence2", "label"), report):
        id_ = row.get("id") or f"{path.name}:{lineno}"
        ex = _pair(spec, report, f"line {lineno}", id_, row["sentence1"], row["sentence2"], row["label"].strip())
        if ex is not None:
            out.append(ex)
    return _finish(out, report)


def read_squad_json(path: Path, spec: TaskSpec | None = None, lang: str | None = None, *,
                    check_offsets: bool = True) -> tuple[list[QAExample], LoadReport]:
    """SQuAD-v1.1-format JSON (SQuAD, MLQA, XQuAD): data[].paragraphs[].{context, qas[]}."""
    report = LoadReport(str(path))
    try:
        doc = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}: not JSON ({e}); expected SQuAD-format JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise TaskDataError(f"{path}: no top-level 'data' list; expected SQuAD-format JSON "
                            f"{{'version': ..., 'data': [{{'paragraphs': [...]}}]}}")
    out: list[QAExample] = []
    seen: set[str] = set()
    for i, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            report.skip("malformed_article", f"data[{i}]")
            continue
        for j, para in enumerate(paragraphs):
            qas = para.get("qas") if isinstance(para, dict) else None
            context = para.get("context") if isinstance(para, dict) else None
            if not isinstance(qas, list) or not isinstance(context, str):
                report.skip("malformed_paragraph", f"data[{i}].paragraphs[{j}]")
                continue
            for qa in qas:
                if not isinstance(qa, dict):
                    report.skip("malformed_question", f"data[{i}].paragraphs[{j}]")
                    continue
                if not context.strip():
                    report.skip("empty_context", f"question {qa.get('id')}")
                    continue
                ex = _qa(report, seen, qa.get("id"), qa.get("question"), context, qa.get("answers"),
                         check_offsets)
                if ex is not None:
                    out.append(ex)
    return _finish(out, report)


READERS = {
    "xnli_tsv": read_xnli_tsv,
    "mnli_jsonl": read_mnli_jsonl,
    "pawsx_tsv": read_pawsx_tsv,
    "squad_json": read_squad_json,
}


# ------------------------------------------------------------------------------------ hub conversion


def examples_from_hub(spec: TaskSpec, rows: Any, source: str, *,
                      check_offsets: bool = True) -> tuple[list[Example], LoadReport]:
    """Records from a `datasets.Dataset` (or any iterable of dict rows) in the hub's schema.

    Pairs: premise/hypothesis (xnli, multi_nli) or sentence1/sentence2 (paws-x), integer `label` with -1 for
    "no gold label"; ClassLabel names, when the dataset has them, map hub indices onto `spec.labels`.
    QA: id, question, context, answers = {text: [...], answer_start: [...]}.
    """
    report = LoadReport(source)
    out: list[Example] = []
    features = getattr(rows, "features", None)
    names = getattr(features.get("label"), "names", None) if features is not None else None
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = f"row {i}"
        if spec.task_type == EXTRACTIVE_QA:
            answers = row.get("answers") or {}
            texts, starts = answers.get("text", []), answers.get("answer_start", [])
            context = row.get("context")
            if not isinstance(context, str) or not context.strip():
                report.skip("empty_context", where)
                continue
            answer_list = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
            ex = _qa(report, seen, row.get("id"), row.get("question"), context, answer_list, check_offsets)
        else:
            a = row.get("premise", row.get("sentence1"))
            b = row.get("hypothesis", row.get("sentence2"))
            idx = row.get("label")
            if not isinstance(idx, int) or idx < 0:
                label = None
            elif names is not None:
                label = names[idx] if idx < len(names) else f"#{idx}"
            else:
                label = spec.labels[idx] if idx < len(spec.labels) else f"#{idx}"
            id_ = str(row.get("pairID") or row.get("id") or f"{source}:{i}")
            ex = _pair(spec, report, where, id_, a, b, label)
        if ex is not None:
            out.append(ex)
    return _finish(out, report)


# --------------------------------------------------------------------------------------- entry points


def load_file(spec: TaskSpec, split: str, path: str | Path, lang: str | None = None, *,
              check_offsets: bool = True) -> tuple[list[Example], LoadReport]:
    """Records from one local file in the format of the task's `split` side (train or eval)."""
    source = spec.train if split == "train" else spec.eval
    reader = READERS[source.format]
    if reader is read_squad_json:
        return read_squad_json(Path(path), spec, lang, check_offsets=check_offsets)
    return reader(Path(path), spec, lang)


def load_hub(spec: TaskSpec, split: str, lang: str) -> tuple[list[Example], LoadReport]:
    """Records from the Hugging Face hub (needs network or a populated datasets cache)."""
    import datasets  # heavy; only this path needs it

    name, config, hub_split = hub_source(spec, split, lang)
    where = f"hub:{name}/{config or '-'}/{hub_split}"
    try:
        rows = datasets.load_dataset(name, config, split=hub_split)
    except (OSError, ValueError) as e:  # offline (ConnectionError), not cached, renamed on the hub
        raise TaskDataError(f"{where}: datasets.load_dataset failed ({type(e).__name__}: {e}). The data root "
                            f"{HUB!r} needs a network or a Hugging Face datasets cache that holds this split "
                            f"(HF_DATASETS_OFFLINE=1 reads the cache only); or point the data root at the "
                            f"task files on disk") from e
    return examples_from_hub(spec, rows, where)


def load_split(spec: TaskSpec, split: str, lang: str, data_dir: str | Path | None = None, *,
               hub: bool = False) -> tuple[list[Example], LoadReport]:
    """Records for (split, lang): from the hub when `data_dir` is HUB ("hub"), else from `data_dir` when the
    file is there, else the hub if `hub`."""
    check_split(spec, split, lang)
    if data_dir is not None and is_hub(data_dir):
        return load_hub(spec, split, lang)
    if data_dir is not None:
        try:
            path = find_local(spec, split, lang, data_dir)
        except TaskDataError:
            if not hub:
                raise
        else:
            return load_file(spec, split, path, lang)
    if not hub:
        raise TaskDataError(f"{spec.name} {split} {lang}: give a data directory, or {HUB!r} to load it from the "
                            f"hub (or allow hub=True)")
    return load_hub(spec, split, lang)

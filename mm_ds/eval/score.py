"""`mm-ds score`: score a prediction file against an official dataset file, as the official scripts would.

Prediction formats:
- QA (mlqa, xquad): SQuAD-style JSON object `{question id: answer text}`. Questions without a prediction
  score 0 (`missing`); ids not in the dataset are ignored (`unknown`).
- Classification (xnli, pawsx): UTF-8 text, one label per line, one line per example the loader keeps,
  in file order (rows the loader skips, listed under `skipped`, have no line). A label is either a string
  of the task's label set (xnli: entailment/neutral/contradiction; pawsx: 0/1) or its integer index.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from mm_ds.data.task_files import PairExample, QAExample, load_file
from mm_ds.data.tasks import EXTRACTIVE_QA, TASKS, TaskDataError, TaskSpec, get_task
from mm_ds.eval.metrics import accuracy, normalizer, qa_scores


def read_qa_predictions(path: str | Path) -> dict[str, str]:
    try:
        preds = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskDataError(f"{path}: prediction file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskDataError(f"{path}: not a JSON prediction file ({e}); expected {{question id: answer}}") from None
    if not isinstance(preds, dict):
        raise TaskDataError(f"{path}: expected a JSON object {{question id: answer text}}, "
                            f"got a {type(preds).__name__}")
    bad = [qid for qid, text in preds.items() if not isinstance(text, str)]
    if bad:
        raise TaskDataError(f"{path}: answers must be strings; question {bad[0]!r} has "
                            f"{type(preds[bad[0]]).__name__} ({len(bad)} such ids)")
    return preds


def read_label_predictions(path: str | Path, spec: TaskSpec, expected: int) -> list[int]:
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        raise TaskDataError(f"{path}: prediction file not found") from None
    except UnicodeDecodeError as e:
        raise TaskDataError(f"{path}: not UTF-8 text ({e})") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != expected:
        raise TaskDataError(f"{path}: {len(lines)} prediction lines for {expected} examples; write one label "
                            f"per loaded example, in dataset order")
    out = []
    for lineno, line in enumerate(lines, start=1):
        label = line.strip()
        if label in spec.labels:
            out.append(spec.labels.index(label))
        elif label.isdigit() and int(label) < spec.num_labels:
            out.append(int(label))
        else:
            raise TaskDataError(f"{path}: line {lineno}: {label!r} is not a {spec.name} label; use one of "
                                f"{', '.join(spec.labels)} or an index 0..{spec.num_labels - 1}")
    return out


def score(task: str, lang: str, dataset_path: str | Path, predictions_path: str | Path,
          metric_lang: str | None = None) -> dict:
    """Scores of `predictions_path` on `dataset_path` (an evaluation file of `task` in `lang`).

    QA: {"exact_match", "f1", "count", "missing", "unknown", "skipped"}; classification: {"accuracy",
    "correct", "count", "skipped"}. Scores are percentages; `skipped` counts dataset rows the loader
    rejected, by reason (empty when the file is clean). `metric_lang` picks MLQA's normalisation rules when
    `lang` has none of its own (e.g. "hi" -- whitespace tokens, no articles -- for generated languages).
    """
    spec = get_task(task)
    if spec.task_type == EXTRACTIVE_QA:
        try:
            norm = normalizer(spec.metric, metric_lang or lang)
        except ValueError as e:
            raise TaskDataError(f"{e}; pass --metric-lang to score {lang!r} with one of those rules") from None
        # The official scripts compare answer texts only, so answer_start is not checked here.
        examples, report = load_file(spec, "test", dataset_path, lang, check_offsets=False)
        golds = {ex.id: [text for text, _ in ex.answers] for ex in examples if isinstance(ex, QAExample)}
        result = qa_scores(golds, read_qa_predictions(predictions_path), norm)
    else:
        examples, report = load_file(spec, "test", dataset_path, lang)
        labels = [ex.label for ex in examples if isinstance(ex, PairExample)]
        preds = read_label_predictions(predictions_path, spec, len(labels))
        correct = sum(p == y for p, y in zip(preds, labels))
        result = {"accuracy": accuracy(preds, labels), "correct": correct, "count": len(labels)}
    result["skipped"] = dict(report.skipped)
    return result


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="mm-ds score", description=__doc__.split("\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--lang", required=True, help="language of the dataset (MLQA: the context language)")
    parser.add_argument("--metric-lang", help="MLQA: normalise answers by this language's rules instead of "
                                              "--lang's (for languages the official evaluator does not know)")
    parser.add_argument("dataset", help="official evaluation file (XNLI/PAWS-X TSV, MLQA/XQuAD JSON)")
    parser.add_argument("predictions", help="QA: JSON {id: answer}; classification: one label per line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = score(args.task, args.lang, args.dataset, args.predictions, args.metric_lang)
    except TaskDataError as e:
        print(f"mm-ds score: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

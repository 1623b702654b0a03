"""The alignment check as `mm-ds run` and `mm-ds align` schedule it: which Step-2 runs a recipe scores
(`aligned_runs`), the recipe's whole check (`align_recipe`), and the rows written out: OUT/align.jsonl, the report's
align.md and curves, and the MLM-level Tables 2 and 3, Figure 3 and speedups. The scoring is mm_ds/eval/align.py,
which reads neither the recipe nor the report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..config import ConfigError
from ..eval.align import Settings, adapt_runs, align, align_run, source_rows
from ..eval.align_diagnose import diagnose_run
from ..eval.heldout import prepared_heldout
from ..report.align_report import align_table, diagnosis_table, write_align
from ..report.report import mlm_report
from ..runtime.checkpointing import checkpoint
from .recipe import data_path, prepare_options


def aligned_runs(recipe, out: Path | None = None) -> list[tuple[str, str]]:
    """The one rule for the (system, target language) Step-2 runs `mm-ds run`'s alignment check scores, for
    `align_recipe`, its spread over ranks (eval/align_spread.py) and `mm-ds plan` (tools/plan/totals.py): with
    align_sequences, every system in each language with held-out text: a file (recipe key heldout), the generated
    world's, or the prepared corpus's slice (prepare_options: real text gets one unless prepare.heldout is 0). With
    `out` (its data prepared), a language whose corpus holds no held-out line (too few lines, or prepared without) is
    left out."""
    sliced = bool(prepare_options(recipe).get("heldout"))
    langs = [lang for lang in recipe.langs if lang in recipe.heldout or recipe.world is not None
             or sliced and (out is None or prepared_heldout(out / "data" / lang) is not None)]
    return [(s, lang) for s in recipe.systems for lang in langs] if recipe.align_sequences else []


def align_recipe(recipe, out: Path, device="cpu", say=print) -> list[Path]:
    """`mm-ds run`'s alignment check and MLM level: `aligned_runs`, the source rows, OUT/align.jsonl, the report."""
    texts, runs = {lang: str(data_path(recipe, f)) for lang, f in recipe.heldout.items()}, aligned_runs(recipe, out)
    if skipped := [lang for lang in recipe.langs if lang not in {pair[1] for pair in runs}]:
        say(f"[mm-ds] alignment check skipped for {', '.join(skipped)}: no held-out text (recipe key heldout: {{LANG: "
            f"FILE}}, or prepare: {{heldout: FRACTION}} when OUT/data/LANG is prepared, with at least a line held out)")
    settings = Settings(sequences=recipe.align_sequences)
    rows = [row for s, lang in runs for row in align_run(out / "adapt" / s / lang, texts, out, settings, device, say)]
    rows += source_rows(out, settings, device, say)
    return write_rows(rows, out, out / "report") if rows else []


def write_rows(rows: list[dict], out: Path, report_dir: Path) -> list[Path]:
    """OUT/align.jsonl and the report's table and curves, and the MLM-level Tables 2 and 3, Figure 3 and speedups."""
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.write_text_atomic(out / "align.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return [out / "align.jsonl", *write_align(rows, report_dir), *mlm_report(rows, report_dir)[1]]


def parse_texts(items: list[str]) -> dict[str, str]:
    texts = {}
    for item in items:
        lang, eq, file = item.partition("=")
        if not eq or not lang or not file:
            raise ConfigError(f"--text {item!r} must look like LANG=FILE, e.g. --text t1=heldout_t1.txt")
        texts[lang] = file
    return texts


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds align", description="the alignment check and MLM-level measure: target-"
                                "language MLM loss and accuracy of each Step-2 checkpoint's primary model with its "
                                "embeddings (and mini-model), on held-out text (no task data); Tables 2 and 3, "
                                "Figure 3 and the speedups at the MLM level")
    p.add_argument("path", help="a recipe output (OUT of `mm-ds run`) or one Step-2 run directory")
    p.add_argument("--text", action="append", default=[], metavar="LANG=FILE",
                   help="held-out target text (CC-100 layout) for LANG; default: the prepared corpus's held-out "
                        "slice (OUT/data/LANG/heldout.txt), or a generated world's own (OUT/world/heldout/LANG.txt)")
    p.add_argument("--sequences", type=int, default=Settings.sequences, help="held-out sequences per checkpoint "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=Settings.seed,
                   help="seed of the evaluation masks (default: %(default)s)")
    p.add_argument("--fit-sequences", type=int, help="training sequences the output-bias refit reads per checkpoint "
                   "(default: as many as --sequences)")
    p.add_argument("--report", help="directory for align.md, align.csv, align_<lang>.png and mlm/ (default: "
                   "OUT/report, or RUN/align/report for one run)")
    p.add_argument("--diagnose", type=int, metavar="FIT_SEQUENCES", help="also read each run's control and last "
                   "checkpoint four ways (step bias, bias refit, a fresh linear read-out, beside the mini-model and "
                   "the unigram predictor) fitting on this many training sequences: align_diagnosis.md (minutes per "
                   "run)")
    p.add_argument("--readout-classes", type=int, default=2048, help="--diagnose's read-out predicts this many of "
                   "the most frequent pieces and 'other' (default: %(default)s)")
    a = p.parse_args(argv)
    for flag, n in (("--sequences", a.sequences), ("--fit-sequences", a.fit_sequences), ("--diagnose", a.diagnose)):
        if n is not None and n < 1:
            raise ConfigError(f"{flag} {n} must be at least 1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, out = align(Path(a.path), parse_texts(a.text), Settings(a.sequences, a.seed, 16, a.fit_sequences),
                      device=device)
    where = out if (Path(a.path) / "adapt").is_dir() else Path(a.path) / "align"  # one run: its own files
    report = Path(a.report) if a.report else where / "report"
    written = write_rows(rows, where, report)
    print(align_table(rows))
    if a.diagnose:
        written += diagnose(Path(a.path), parse_texts(a.text), out, Settings(a.sequences, a.seed, 16, a.diagnose),
                            a.readout_classes, device, report)
    print(f"wrote {', '.join(str(w) for w in written)}")
    return 0


def diagnose(path: Path, texts: dict[str, str], out: Path | None, settings: Settings, classes: int, device,
             report: Path) -> list[Path]:
    """`--diagnose`: each run's control and last checkpoint read four ways, to report/align_diagnosis.{md,jsonl}."""
    found = [row for run in adapt_runs(path)[0]
             for row in diagnose_run(run, texts, out, settings, classes, device)]
    checkpoint.write_text_atomic(report / "align_diagnosis.md", diagnosis_table(found) + "\n")
    checkpoint.write_text_atomic(report / "align_diagnosis.jsonl", "".join(json.dumps(r) + "\n" for r in found))
    print(diagnosis_table(found))
    return [report / "align_diagnosis.md", report / "align_diagnosis.jsonl"]

"""`mm-ds extend`: an existing English model and target-language text in, a Hugging Face model for the target
language out, in one command (paper §2.2: MINIPOST starts from an existing pretrained model).

    mm-ds extend SRC --lang de --text de.txt --source-text en.txt --out runs/ext-de [key=value ...]
    mm-ds extend SRC --lang de --text corpus/de --system bl_base --out runs/ext-de --check

SRC is a Hugging Face RoBERTa/XLM-R masked LM directory (config.json, weights and its tokenizer: a SentencePiece
model, or the Hugging Face tokenizer of a byte-level BPE RoBERTa such as roberta-base) or a finished mm-ds
Step-1 run. The plan, each step skipped when it is complete, each training stage run as `mm-ds run` runs it
(its own launch, progress, resumed from its newest checkpoint when interrupted):

    OUT/import/            SRC as an mm-ds Step-1 run (`mm-ds import --from hf`): its tokenizer's ids moved to
                           mm-ds's rows (spm.model or tokenizer.json); an mm-ds run is used in place
    OUT/data/text/         the held-out tail of --text, and the rest (without --heldout: extend_card.split_heldout)
    OUT/data/{src lang}/   MINIPOST: the source text in SRC's own tokenizer, as imported
    OUT/data/{lang}/       the target text and its new SentencePiece tokenizer (`prepare`)
    OUT/build_mini/        MINIPOST Step 1b: new bridge layers over SRC's frozen bottom layers, MLM on source text
    OUT/adapt/{lang}/      Step 2: target embeddings over the frozen mini-model (BL_BASE: over SRC itself)
    OUT/hf/ (--hf-out)     SRC's body with the target embeddings swapped in, tokenizer files (`mm-ds export`),
                           a model card with the held-out MLM loss next to the untrained-embedding control

MINIPOST (the default) needs source-language text for Step 1b (`--source-text`); `--system bl_base` adapts
over the whole source model and needs none, at several times the cost per Step-2 update. Stage sizes are the
`extend/*` presets (seconds on a CPU); real ones: `--presets paper`, or overrides such as train.steps=20000
(every stage) and adapt/train.lr=5e-4 (one stage). The target vocabulary: `default_vocab`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from ..config import ConfigError, ModelConfig
from ..data.corpus import prepare
from ..interop import export, import_hf
from ..runtime.checkpointing import checkpoint
from ..runtime.checkpointing.rundir import logs_dir
from ..systems import SystemNameError, system_of
from . import extend_card
from .extend_check import (EXPORTED, SETTINGS, Plan, check, exported, extend_runs, final_of, source_model,
                           source_tokenizer, text_files)
from .progress import say, speaking_as
from .run import StageFailed, complete, run_stages

PAPER_VOCAB = 50_000
"""Pieces per language in the paper (§3), as many as its English model has."""


def default_vocab(model: ModelConfig) -> int:
    """The target vocabulary without --vocab-size: as many pieces as the source model's vocabulary (the paper
    gives each language as many as its English model, 50k), at most PAPER_VOCAB (a multilingual source's 250k
    serve a hundred languages, one needs no more than the paper's). Fewer, with a warning, when the target
    text cannot support that many: SentencePiece builds the largest vocabulary it can (data.tokenizer)."""
    return min(model.vocab_size, PAPER_VOCAB)


# ---------------------------------------------------------------- running

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(plan: Plan) -> int:
    findings = check(plan)
    if findings.problems:  # before any work: nothing is written
        raise ConfigError(f"mm-ds extend cannot run:\n{findings.format()}")
    plan.out.mkdir(parents=True, exist_ok=True)
    checkpoint.write_json_atomic(plan.out / SETTINGS, plan.settings())
    if plan.is_run:
        say(f"source model: the mm-ds run {plan.src}")
    elif complete(plan.primary) and Path(checkpoint.read_meta(plan.primary / checkpoint.FINAL).get("tokenizer")
                                         or "").is_file():
        say(f"skip import: complete ({plan.primary})")
    else:
        say(f"import {plan.src} -> {plan.primary}")
        import_hf(plan.src, plan.primary, tokenizer=plan.tokenizer, lang=plan.source_lang,
                  force=(plan.primary / checkpoint.FINAL).exists())  # an import interrupted before its manifest
    model, _ = source_model(plan)
    data = plan.out / "data"
    if plan.row.mini == "build":  # Step 1b reads the source language in the source model's own pieces
        prepare(plan.source_lang, _files(plan.source_text, "--source-text"), str(data / plan.source_lang),
                spm_model=source_tokenizer(plan))
    text = _files(plan.text, "--text")
    if plan.heldout:
        heldout = Path(plan.heldout)
    else:
        train, heldout = extend_card.split_heldout(text, data / "text", plan.lang)
        text = [str(train)]
    prepare(plan.lang, text, str(data / plan.lang), model_type=plan.model_type,
            vocab_size=plan.vocab_size or default_vocab(model))
    runs = extend_runs(plan, model)
    todo = [n for n in runs if not complete(n.out)]
    for n in runs:
        if n not in todo:
            say(f"skip {n.name.partition('/')[2]}: complete")  # its run dir under OUT
    run_stages(todo, logs_dir(plan.out))
    adapted = runs[-1].out
    want = _digest(checkpoint.manifest_of(adapted))
    done = exported(plan)
    metrics = extend_card.heldout_metrics(plan.primary, adapted, heldout, plan.out)  # once: OUT/card.json
    if done is not None and done.get("adapt_manifest_sha256") == want and (plan.hf_out / "config.json").is_file():
        say(f"skip export: {plan.hf_out} holds this Step-2 result")
    else:
        claim = {"hf_out": str(plan.hf_out.resolve()), "adapt_manifest_sha256": None}
        checkpoint.write_json_atomic(plan.out / EXPORTED, claim)  # an export cut short is still ours to replace
        summary = export(plan.primary, plan.hf_out, lang_from=adapted, force=done is not None)
        metas = [checkpoint.read_meta(final_of(n.out)) for n in runs]
        readme = plan.hf_out / "README.md"
        checkpoint.write_text_atomic(readme, extend_card.card(plan, metas, metas[-1]["overlap"], metrics,
                                                              readme.read_text()))
        checkpoint.write_json_atomic(plan.out / EXPORTED, claim | {"adapt_manifest_sha256": want, "summary": summary})
        say(f"exported: {json.dumps(summary)}")
    if "result" in metrics:
        r, c = metrics["result"], metrics["control"]
        say(f"held-out {plan.lang} MLM: loss {r['loss']:.3f}, accuracy {100 * r['acc']:.1f}% (untrained-embedding "
            f"control: {c['loss']:.3f}, {100 * c['acc']:.1f}%); model card: {plan.hf_out / 'README.md'}")
    say(f"{plan.lang} model: {plan.hf_out} (AutoTokenizer / AutoModelForMaskedLM.from_pretrained)")
    if plan.presets == "extend":
        say(f"warning: {extend_card.demo_warning(plan)}")
    return 0


def _files(specs: list[str], flag: str) -> list[str]:
    return [f for spec in specs for f in text_files(spec, flag)]


# ---------------------------------------------------------------- command line

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mm-ds extend", description="an existing English model + target-language "
                                "text -> a Hugging Face model for the target language (MINIPOST by default)")
    p.add_argument("src", help="Hugging Face RoBERTa/XLM-R masked LM directory (config.json, weights, tokenizer) "
                               "or a finished mm-ds pretrain/import run")
    p.add_argument("--lang", required=True, help="code of the new language, e.g. de")
    p.add_argument("--text", required=True, action="append", help="target-language text: a file or a directory "
                   "of files (.txt, .gz, .xz; repeatable)")
    p.add_argument("--source-text", action="append", default=[], help="source-language text for MINIPOST's Step "
                   "1b (required for minipost, unused by bl_base; repeatable)")
    p.add_argument("--source-lang", default="en", help="the source model's language (default: %(default)s)")
    p.add_argument("--out", required=True, help="working directory: imported model, corpora, stage runs, logs")
    p.add_argument("--hf-out", help="the target-language Hugging Face directory (default: OUT/hf)")
    p.add_argument("--system", default="minipost", help="minipost (default; minipost@N: over the bottom N "
                   "layers) or bl_base (Step 2 over the whole model, no source text); minijoint for an mm-ds "
                   "MINIJOINT run")
    p.add_argument("--presets", default="extend", help="stage presets FAMILY/build_mini and FAMILY/adapt: extend "
                   "(default; seconds on a CPU), tiny, paper")
    p.add_argument("--tokenizer", help="tokenizer of SRC when it is not beside the weights: a SentencePiece model "
                   "or a tokenizer.json")
    p.add_argument("--vocab-size", type=int, help="pieces of the target tokenizer (default: the source model's "
                   "vocabulary size, at most the paper's 50000; fewer with a warning when the text cannot support "
                   "them)")
    p.add_argument("--heldout", help="held-out target text for the model card's MLM loss (default: the last "
                   "tenth of --text, at most 2000 lines, kept out of training)")
    p.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"],
                   help="target SentencePiece algorithm (default: %(default)s)")
    p.add_argument("--check", "--dry-run", dest="check", action="store_true", help="validate SRC, the texts, the "
                   "output directories and every stage config; train nothing (--dry-run: the same)")
    p.add_argument("overrides", nargs="*", metavar="[STAGE/]key=value", help="config overrides for every stage, "
                   "or for one with build_mini/ or adapt/, e.g. train.steps=2000 adapt/train.lr=5e-4")
    return p


def plan_of(argv: list[str]) -> tuple[Plan, bool]:
    """The plan of `mm-ds extend ARGV`, and whether it is only to be checked (--check)."""
    a = parser().parse_intermixed_args(argv)
    try:
        system = system_of(a.system).name
    except SystemNameError as e:
        raise ConfigError(f"--system: {e}") from None
    overrides: dict[str, list[str]] = {}
    for item in a.overrides:
        key, eq, _ = item.partition("=")
        if not eq:
            raise ConfigError(f"override {item!r} must look like key=value or STAGE/key=value, e.g. train.steps=500")
        stage, slash, _ = key.rpartition("/")
        overrides.setdefault(stage if slash else "", []).append(item.split("/", 1)[1] if slash else item)
    out = Path(a.out)
    plan = Plan(src=Path(a.src), lang=a.lang, text=a.text, out=out, hf_out=Path(a.hf_out) if a.hf_out else out / "hf",
                system=system, source_text=a.source_text, source_lang=a.source_lang, presets=a.presets,
                overrides=overrides, tokenizer=a.tokenizer, vocab_size=a.vocab_size, model_type=a.model_type,
                heldout=a.heldout)
    return plan, a.check


def main(argv: list[str]) -> int:
    plan, check_only = plan_of(argv)
    if check_only:
        findings = check(plan)
        print(f"mm-ds extend --check: {findings.format()}")
        return 1 if findings.problems else 0
    try:
        with speaking_as("mm-ds extend"):
            return run(plan)
    except StageFailed as e:  # the stage's own traceback is in its log
        print(f"mm-ds extend: error: {e}", file=sys.stderr)
        return 1

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
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.checkpointing import checkpoint
from .. import tokens
from .check import Findings, check_stages
from ..config import ConfigError, ModelConfig, RunConfig, model_config_from_dict
from ..stages.resolve import StageRun
from ..systems import SystemNameError, system_of
from ..runtime.checkpointing.rundir import logs_dir
from . import extend_card
from ..data.inputs import chunks, resolve_inputs, split_lines
from ..data.tokenizer import check_tokenizer
from ..interop.importers import inspect_hf
from ..interop.spm import InteropError
from ..data.corpus import prepare
from ..interop import export, import_hf
from .run import complete, run_stages
from .progress import say
from .run import StageFailed
from .progress import speaking_as

SETTINGS = "extend.json"
"""OUT/extend.json: the arguments that made OUT; a re-run with other ones would mix two models' stages."""
EXPORTED = "export.json"
"""OUT/export.json: --hf-out is this run's (written before the export) and which Step-2 result it holds (after)."""
EXTEND_STAGES = ("build_mini", "adapt")
"""The training stages extend may run; `STAGE/key=value` overrides name one of them."""
PAPER_VOCAB = 50_000
"""Pieces per language in the paper (§3), as many as its English model has."""


def default_vocab(model: ModelConfig) -> int:
    """The target vocabulary without --vocab-size: as many pieces as the source model's vocabulary (the paper
    gives each language as many as its English model, 50k), at most PAPER_VOCAB (a multilingual source's 250k
    serve a hundred languages, one needs no more than the paper's). Fewer, with a warning, when the target
    text cannot support that many: SentencePiece builds the largest vocabulary it can (data.tokenizer)."""
    return min(model.vocab_size, PAPER_VOCAB)


@dataclass
class Plan:
    """What `mm-ds extend` was asked to do (its arguments, parsed); the steps follow from it."""

    src: Path
    lang: str
    text: list[str]
    out: Path
    hf_out: Path
    system: str = "minipost"
    source_text: list[str] = field(default_factory=list)
    source_lang: str = "en"
    presets: str = "extend"
    overrides: dict[str, list[str]] = field(default_factory=dict)
    """"" (every stage) or a stage of EXTEND_STAGES -> key=value list."""
    tokenizer: str | None = None
    vocab_size: int | None = None
    model_type: str = "unigram"
    heldout: str | None = None
    """Held-out target text; None: the tail of --text (extend_card.split_heldout)."""

    @property
    def row(self):
        return system_of(self.system)

    @property
    def is_run(self) -> bool:
        """SRC is an mm-ds run (used in place); otherwise a Hugging Face directory, imported first."""
        return (self.src / checkpoint.FINAL).is_dir() or (self.src / checkpoint.MANIFEST).is_file()

    @property
    def primary(self) -> Path:
        return self.src if self.is_run else self.out / "import"

    def settings(self) -> dict:
        return {"src": str(self.src.resolve()), "system": self.system, "lang": self.lang,
                "source_lang": self.source_lang, "text": [str(Path(t).resolve()) for t in self.text],
                "source_text": [str(Path(t).resolve()) for t in self.source_text], "tokenizer": self.tokenizer,
                "vocab_size": self.vocab_size, "model_type": self.model_type, "presets": self.presets,
                "heldout": str(Path(self.heldout).resolve()) if self.heldout else None}


# ---------------------------------------------------------------- what goes in

def text_files(spec: str, flag: str) -> list[str]:
    """The text files of a file or a directory (its files, not hidden), or an error naming the path: one that
    does not exist, is empty, or holds no line `prepare` could encode (blank or not UTF-8)."""
    p = Path(spec)
    if p.is_dir():
        files = [str(f) for f in sorted(p.iterdir()) if f.is_file() and not f.name.startswith(".")
                 and f.stat().st_size > 0]
        if not files:
            raise ConfigError(f"{flag} {spec}: the directory holds no non-empty file; put the text there "
                              f"(.txt, .gz or .xz, one sentence per line)")
    elif not p.is_file():
        raise ConfigError(f"{flag} {spec} does not exist; pass a text file or a directory of them")
    elif p.stat().st_size == 0:
        raise ConfigError(f"{flag} {spec} is empty; pass a file with text in it")
    else:
        files = [str(p)]
    if not _has_text(files, f"{flag} {spec}"):
        raise ConfigError(f"{flag} {spec} holds no line of text (only blank lines, or none in UTF-8); pass text, "
                          f"one sentence per line")
    return files


def _has_text(files: list[str], where: str) -> bool:
    """Whether any line is text: read up to the first one (a chunk, for a normal text)."""
    try:
        return any(any(line.strip() for line in split_lines(block)[0]) for block, _, _ in chunks(resolve_inputs(files)))
    except ValueError as e:
        raise ConfigError(f"{where}: {str(e.__cause__ or e)}; fix the file or leave it out") from e


def _final(run: Path) -> Path:
    return run / checkpoint.FINAL if (run / checkpoint.FINAL).is_dir() else run


def source_model(plan: Plan) -> tuple[ModelConfig, str]:
    """The source model's config and system, its tokenizer checked as the run will use it (the import's
    conversion included), without loading its weights; errors name SRC."""
    src = plan.src
    if not src.exists():
        raise ConfigError(f"SRC {src} does not exist; pass a Hugging Face model directory or an mm-ds run")
    if plan.is_run:
        final = _final(src)
        try:
            checkpoint.verify(final, checksums=False)
        except checkpoint.CheckpointError as e:
            raise ConfigError(f"SRC {src} is an mm-ds run that has not finished: {e}") from e
        meta = checkpoint.read_meta(final)
        if meta.get("stage") != "pretrain":
            raise ConfigError(f"SRC {src} is a run of stage {meta.get('stage')!r}; extend starts from a pretrained "
                              f"model (a pretrain or imported run)")
        tok = meta.get("tokenizer")
        if not tok or not Path(tok).is_file():
            raise ConfigError(f"SRC {src} records no tokenizer file ({tok}); Step 2's overlap initialisation "
                              f"needs the source pieces: import the model again with its tokenizer")
        cfg = model_config_from_dict(meta["model"])
        try:
            size = check_tokenizer(Path(tok))
        except ValueError as e:
            raise ConfigError(f"SRC {src}: {e}") from e
        if size != cfg.vocab_size:
            raise ConfigError(f"SRC {src}: its tokenizer {tok} has {size} pieces, its embeddings {cfg.vocab_size} "
                              f"rows: the run records another model's tokenizer")
        return cfg, meta.get("system", "bl_base")
    if not (src / "config.json").is_file():
        raise ConfigError(f"SRC {src} is neither a Hugging Face model directory (no config.json) nor an mm-ds "
                          f"run (no {checkpoint.FINAL}/); pass a RoBERTa/XLM-R directory saved with "
                          f"save_pretrained, or a finished mm-ds run")
    try:
        _, cfg, _, _ = inspect_hf(src, plan.tokenizer)
    except InteropError as e:
        raise ConfigError(f"SRC {src}: {e}") from e
    return cfg, "bl_base"  # as import_hf records it


def source_tokenizer(plan: Plan) -> str:
    """The tokenizer file whose ids are the source model's rows: the import's converted one (spm.model or
    tokenizer.json), or an mm-ds SRC run's own. Only this one goes to `prepare`, never SRC's original."""
    return checkpoint.read_meta(_final(plan.primary))["tokenizer"]


def extend_runs(plan: Plan, model: ModelConfig) -> list[StageRun]:
    """MINIPOST's Step 1b (when the system builds a mini-model) and Step 2, as `mm-ds run` launches stages."""
    runs: list[StageRun] = []
    row = plan.row
    parent = plan.primary
    for stage in EXTEND_STAGES:
        if stage == "build_mini" and not row.mini:
            continue
        run = plan.out / stage if stage == "build_mini" else plan.out / "adapt" / plan.lang
        lang = plan.lang if stage == "adapt" else plan.source_lang
        # the paper's mini-model is 4 of 12 layers: a third of SRC's, before any override of the user's
        default = [f"mini.layers={min(max(1, model.num_layers // 3), model.num_layers - 1)}"] \
            if stage == "build_mini" and row.mini == "build" and model.num_layers > 1 else []
        overrides = [f"system={plan.system}", f"lang={lang}", *default, *plan.overrides.get("", []),
                     *plan.overrides.get(stage, []), *row.overrides(stage),
                     f"data.corpus={plan.out / 'data' / lang}", f"parent={parent}"]
        runs.append(StageRun(stage, run, f"{plan.presets}/{stage}", tuple(overrides),
                             f"{stage}/{run.relative_to(plan.out)}"))
        parent = run
    return runs


# ---------------------------------------------------------------- --check

def check(plan: Plan) -> Findings:
    """Every problem knowable before any work: SRC, the texts, OUT and --hf-out, the settings of an earlier
    run into OUT, and each stage run's config, engine config and launcher (as `mm-ds run --check` does)."""
    findings = Findings()
    model = None
    try:
        model, system = source_model(plan)
    except ConfigError as e:
        findings.add("SRC", str(e))
    for flag, specs in (("--text", plan.text), ("--source-text", plan.source_text),
                        ("--heldout", [plan.heldout] if plan.heldout else [])):
        for spec in specs:
            try:
                text_files(spec, flag)
            except ConfigError as e:
                findings.add(flag, str(e))
    if plan.row.mini == "build" and not plan.source_text:
        findings.add("--source-text", f"{plan.row.label}'s Step 1b trains its bridge layers with MLM on "
                     f"source-language text: pass --source-text FILE_OR_DIR ({plan.source_lang} text), or "
                     f"--system bl_base (adapts over the whole source model and needs none)")
    if plan.lang == plan.source_lang:
        findings.add("--lang", f"--lang {plan.lang} is the source language (--source-lang); name the new language")
    if plan.vocab_size is not None and plan.vocab_size <= len(tokens.SPECIAL_IDS):
        findings.add("--vocab-size", f"--vocab-size {plan.vocab_size} leaves no room beyond the "
                     f"{len(tokens.SPECIAL_IDS)} special pieces; pass a larger one, or none for the default")
    for where, path in (("--out", plan.out), ("--hf-out", plan.hf_out)):
        if problem := checkpoint.unwritable(path):
            findings.add(where, problem)
    if plan.hf_out.is_dir() and any(plan.hf_out.iterdir()) and _exported(plan) is None:
        findings.add("--hf-out", f"{plan.hf_out} exists, is not empty and was not written by this extend run "
                     f"({plan.out}); choose another --hf-out or remove it")
    _check_settings(plan, findings)
    bad = [k for k in plan.overrides if k and (k not in EXTEND_STAGES or k == "build_mini" and not plan.row.mini)]
    if bad:
        stages = [k for k in EXTEND_STAGES if k != "build_mini" or plan.row.mini]
        findings.add("overrides", f"{bad[0]}/... names no stage of this plan ({plan.system}: {', '.join(stages)})")
    if model is not None:
        known = {plan.primary.resolve(): RunConfig(stage="pretrain", system=system, model=model)}
        check_stages(extend_runs(plan, model), findings, known)
    return findings


def _check_settings(plan: Plan, findings: Findings) -> None:
    path = plan.out / SETTINGS
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    diff = "; ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in plan.settings().items() if old.get(k) != v)
    if diff:
        findings.add("--out", f"{plan.out} holds an extend run made with other arguments ({diff}); re-run with "
                     f"the same ones to resume it, or choose a new --out")


# ---------------------------------------------------------------- running

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _exported(plan: Plan) -> dict | None:
    """OUT/export.json when it describes --hf-out (None: --hf-out is not this run's)."""
    try:
        done = json.loads((plan.out / EXPORTED).read_text())
    except (OSError, ValueError):
        return None
    return done if done.get("hf_out") == str(plan.hf_out.resolve()) else None


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
    done = _exported(plan)
    metrics = extend_card.heldout_metrics(plan.primary, adapted, heldout, plan.out)  # once: OUT/card.json
    if done is not None and done.get("adapt_manifest_sha256") == want and (plan.hf_out / "config.json").is_file():
        say(f"skip export: {plan.hf_out} holds this Step-2 result")
    else:
        claim = {"hf_out": str(plan.hf_out.resolve()), "adapt_manifest_sha256": None}
        checkpoint.write_json_atomic(plan.out / EXPORTED, claim)  # an export cut short is still ours to replace
        summary = export(plan.primary, plan.hf_out, lang_from=adapted, force=done is not None)
        metas = [checkpoint.read_meta(_final(n.out)) for n in runs]
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

"""`mm-ds extend --check` (mm_ds.pipeline.extend): what extend was asked (`Plan`), what goes in (SRC, the texts),
the stage runs that follow from it, and every problem knowable before any work. `mm-ds extend` runs the same check
first and reads SRC and the texts through the functions here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .. import tokens
from ..config import ConfigError, ModelConfig, RunConfig, model_config_from_dict
from ..data.inputs import chunks, resolve_inputs, split_lines
from ..data.tokenizer import check_tokenizer
from ..interop.hf_import import inspect_hf
from ..interop.spm import InteropError
from ..runtime.checkpointing import checkpoint
from ..stages.resolve import StageRun
from ..systems import system_of
from .check import Findings, check_stages

SETTINGS = "extend.json"
"""OUT/extend.json: the arguments that made OUT; a re-run with other ones would mix two models' stages."""
EXPORTED = "export.json"
"""OUT/export.json: --hf-out is this run's (written before the export) and which Step-2 result it holds (after)."""
EXTEND_STAGES = ("build_mini", "adapt")
"""The training stages extend may run; `STAGE/key=value` overrides name one of them."""


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


def final_of(run: Path) -> Path:
    """A run's `final/`, or `run` itself when it is one."""
    return run / checkpoint.FINAL if (run / checkpoint.FINAL).is_dir() else run


def source_model(plan: Plan) -> tuple[ModelConfig, str]:
    """The source model's config and system, its tokenizer checked as the run will use it (the import's
    conversion included), without loading its weights; errors name SRC."""
    src = plan.src
    if not src.exists():
        raise ConfigError(f"SRC {src} does not exist; pass a Hugging Face model directory or an mm-ds run")
    if plan.is_run:
        final = final_of(src)
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
    return checkpoint.read_meta(final_of(plan.primary))["tokenizer"]


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
    if plan.hf_out.is_dir() and any(plan.hf_out.iterdir()) and exported(plan) is None:
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


def exported(plan: Plan) -> dict | None:
    """OUT/export.json when it describes --hf-out (None: --hf-out is not this run's)."""
    try:
        done = json.loads((plan.out / EXPORTED).read_text())
    except (OSError, ValueError):
        return None
    return done if done.get("hf_out") == str(plan.hf_out.resolve()) else None

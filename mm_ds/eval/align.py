"""The alignment check and the MLM-level measure: do Step-2 embeddings plug into the primary model? No task data.

For every Step-2 checkpoint of every system, on held-out target text, the target-language MLM loss and accuracy of
  - the primary model with that checkpoint's language group swapped in (surgery.swap_embeddings, as Step 4 does
    for the finetuned models; a MINIJOINT primary predicts with its main head, which takes the group's bias, i.e.
    the bias Step 2 learnt for the secondary head): the MLM-level measure of transfer. For BL_BASE and BL_SMALL
    this is the model Step 2 trained;
  - the mini-model as Step 2 trains it (mini-model systems only: MINIJOINT, MINIPOST and their variants);
  - the primary model with the untrained embeddings but the checkpoint's output bias ("bias only"): what learning
    the target's word frequencies alone buys, so that the rest of the gain is the body's,
side by side per Step-2 update, from step 0 (the initialisation, transfer.control_group: the control) to the last
checkpoint. records.mlm_results turns these rows into records for the report's Table 3, Figure 3 and speedups at
the MLM level (report.report.mlm_report). Beside them, `source_rows`: each primary model's and mini-model's MLM on
held-out source-language (English) text next to a unigram predictor's (the training shards' piece frequencies):
has the body learnt more than word frequencies?

Held-out text is never training text: `mm-ds prepare --heldout F` keeps a deterministic slice of each language out of
its training shards (data/corpus.py; OUT/data/<lang>/heldout.txt, which `mm-ds run` prepares for real text); a
generated world writes world/heldout/<lang>.txt from its own stream (world.write_heldout); `--text LANG=FILE`
(recipe key `heldout`) names a file. It is encoded with the checkpoint's own tokenizer into
ALIGN/heldout/<lang>.<sha>/ (mm-ds prepare's format) and packed as in training (data.mlm.MLMBatches) with a fixed
seed; every selected token is replaced by <mask> (no 10% random or kept tokens: a kept token shows the answer),
so every checkpoint sees the same `sequences` sequences and the same masks, and accuracy is prediction from context.

    OUT/align/<system>/<lang>/<step tag>.json   one row per checkpoint, keyed by a fingerprint of its inputs
    OUT/align.jsonl, OUT/report/align.md, OUT/report/align_<lang>.png, OUT/report/mlm/   (align_report.py)
A single adapt run keeps its cache in RUN/align/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..runtime import checkpoint
from ..model import flops, surgery
from ..config import ConfigError, model_config_from_dict
from ..systems import SystemNameError, system_of

INIT = "init"
"""The tag of step 0: the language group Step 2 starts from."""
ROWS_VERSION = 2
"""Part of every row's fingerprint: bump when a row's definition changes (2: all-<mask> targets, bias-only)."""


@dataclass(frozen=True)
class Settings:
    sequences: int = 64
    """Held-out sequences per checkpoint (at most the held-out text's packed blocks)."""
    seed: int = 0
    """Seed of the evaluation masks (the same for every checkpoint)."""
    batch: int = 16


# ---------------------------------------------------------------- one model, one checkpoint

def mlm_metrics(cfg, sd: dict, batches: list[dict], device="cpu", depth: int | None = None) -> dict:
    """Token-weighted MLM loss and accuracy of the main head (`depth`: of the head after that layer, through
    the bottom `depth` layers only) over every masked token of `batches`."""
    import torch

    from ..model.model import RobertaMLM

    model = RobertaMLM(cfg)
    model.load_state_dict(sd, strict=True)
    model.to(device).eval()
    loss = correct = targets = 0.0
    with torch.no_grad():
        for b in batches:
            mask = b["attention_mask"]
            out = model(b["input_ids"].to(device), b["labels"].to(device), None if mask is None else mask.to(device),
                        depth=depth)
            n = int(out["masked_tokens"])
            (hit,) = [k for k in out if k.startswith("correct_")] if depth is not None else ["correct_main"]
            loss += float(out["loss" if depth is not None else "loss_main"]) * n
            correct += int(out[hit])
            targets += n
    return {"loss": loss / targets, "acc": correct / targets, "targets": int(targets)}


def unigram_metrics(corpus_dir: Path, batches: list[dict]) -> dict:
    """MLM loss and accuracy of a unigram predictor on `batches`' targets: every masked position gets the
    training shards' piece frequencies (add-one smoothed, over the non-special pieces), so it always predicts
    the most frequent piece. What a model scores above it, it did not get from word frequencies."""
    from ..data.mlm import N_SPECIAL
    from ..data.shards import TokenCorpus

    corpus = TokenCorpus(corpus_dir)
    counts = np.zeros(corpus.vocab_size, dtype=np.float64)
    for s in range(corpus.num_shards):
        counts += np.bincount(corpus.shard_tokens(s), minlength=corpus.vocab_size)[:corpus.vocab_size]
    counts[:N_SPECIAL] = 0  # special pieces are never targets
    counts[N_SPECIAL:] += 1
    logp = np.log(counts / counts.sum(), where=counts > 0, out=np.full_like(counts, -np.inf))
    labels = np.concatenate([b["labels"].numpy().ravel() for b in batches])
    labels = labels[labels >= 0]
    return {"loss": float(-logp[labels].mean()), "acc": float((labels == counts.argmax()).mean()),
            "targets": int(len(labels))}


def eval_batches(heldout_dir: Path, data_cfg: dict, settings: Settings) -> list[dict]:
    """The fixed evaluation batches: the first `sequences` samples of the held-out corpus, packed as Step 2's
    training batches are (its seq_len and mask rate), with `settings.seed`; every selected token is <mask>."""
    from ..data.mlm import MLMBatches
    from ..data.shards import TokenCorpus

    corpus = TokenCorpus(heldout_dir)
    mlm = MLMBatches(corpus, data_cfg["seq_len"], seed=settings.seed, mask_prob=data_cfg["mask_prob"],
                     random_prob=0.0, keep_prob=0.0, vocab_size=corpus.vocab_size)
    n = min(settings.sequences, mlm.num_blocks())  # a second epoch would repeat blocks
    return [mlm.samples(np.arange(i, min(i + settings.batch, n))) for i in range(0, n, settings.batch)]


@lru_cache(maxsize=1)  # a run's checkpoints share their primary model (runs come one at a time)
def _primary(path: str):
    meta, sd = checkpoint.load_final(path)
    cfg = model_config_from_dict(meta["model"])
    if cfg.secondary_head_layer is not None:  # MINIJOINT: the full model's prediction is its main head's
        cfg, sd = surgery.drop_secondary_head(cfg, sd)
    return meta, cfg, sd


def initial_group(ckpt: Path) -> dict:
    """The language group Step 2 started from (the control), rebuilt from the adapt run's parent."""
    from .transfer import control_group

    meta = checkpoint.read_meta(ckpt)
    return control_group(meta, meta["run_config"]["train"]["seed"])


def row_for(ckpt: Path, batches: list[dict], device="cpu", init: bool = False, init_group: dict | None = None) -> dict:
    """One row: the primary model of `ckpt` with the checkpoint's language group (`init`: with the group Step 2
    started from instead, at step 0), the mini-model (mini-model systems), and the primary model with the initial
    embeddings and the checkpoint's output biases (bias only). `init_group`: that initial group, if known."""
    meta, sd = checkpoint.load_final(ckpt)
    if meta.get("stage") != "adapt":
        raise ConfigError(f"{ckpt} is a {meta.get('stage')!r} checkpoint, not a Step-2 (adapt) one")
    if not meta.get("primary"):
        raise ConfigError(f"{ckpt} records no primary model (meta key primary); it cannot be checked against one")
    cfg = model_config_from_dict(meta["model"])
    start = init_group if init_group is not None else initial_group(ckpt)
    if init:
        cfg, sd = surgery.swap_embeddings(cfg, sd, start)
    group = surgery.language_group(sd)
    _, pcfg, psd = _primary(str(Path(meta["primary"]).resolve()))
    primary = mlm_metrics(*surgery.swap_embeddings(pcfg, psd, group), batches, device)
    bias_only = primary if init else mlm_metrics(*surgery.swap_embeddings(
        pcfg, psd, {k: (start[k] if k == surgery.TOKENS else v) for k, v in group.items()}), batches, device)
    # A multi-depth mini-model (§7) is scored at the depth Step 2 was training at (its first one at step 0).
    phases = meta.get("depth_phases") or [[None]]
    depth = phases[0 if init else -1][0]
    mini = mlm_metrics(cfg, sd, batches, device, depth) if system_of(meta["system"]).mini else None
    step, f = (0, 0.0) if init else (meta["step"], meta["flops"])
    return {"kind": "target", "system": meta.get("system"), "lang": meta.get("lang"), "step": step, "flops": f,
            "v100_days": flops.to_v100_days(f), "sequences": sum(len(b["input_ids"]) for b in batches),
            "targets": primary["targets"], "mini_loss": mini and mini["loss"], "mini_acc": mini and mini["acc"],
            "primary_loss": primary["loss"], "primary_acc": primary["acc"],
            "bias_only_loss": bias_only["loss"], "bias_only_acc": bias_only["acc"],
            "mini_layers": (depth or cfg.num_layers) if mini else None, "primary_layers": pcfg.num_layers}


# ---------------------------------------------------------------- runs, held-out text, cache

def adapt_system(run: Path) -> str | None:
    """The system of an adapt run (None: not an adapt run), from its final/ or newest checkpoint."""
    where = run / checkpoint.FINAL if (run / checkpoint.FINAL / checkpoint.META).is_file() else \
        next(reversed(checkpoint.list_checkpoints(run)), None)
    if where is None:
        return None
    meta = checkpoint.read_meta(where)
    try:
        return system_of(meta.get("system", "")).name if meta.get("stage") == "adapt" else None
    except SystemNameError:
        return None


def adapt_runs(path: Path) -> tuple[list[Path], Path | None]:
    """(the adapt runs, the recipe output they belong to or None) of a recipe output OUT (OUT/adapt/<system>/<lang>/)
    or of one adapt run directory; errors name `path` and what it should be."""
    path = Path(path)
    expected = ("give a recipe output (OUT with adapt/<system>/<lang>/ run directories, as `mm-ds run` writes) "
                "or one Step-2 run directory (with checkpoints/step_*/ written by `mm-ds adapt`)")
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory; {expected}")
    if (path / "adapt").is_dir():
        runs = sorted(r for r in (path / "adapt").glob("*/*") if r.is_dir() and checkpoint.list_checkpoints(r, "curve"))
        runs = [r for r in runs if adapt_system(r)]
        if not runs:
            raise ConfigError(f"{path}/adapt holds no Step-2 run with complete checkpoints; {expected}")
        return runs, path
    if not checkpoint.list_checkpoints(path, "curve"):
        raise ConfigError(f"{path} has neither adapt/ nor complete checkpoints/step_*/; {expected}")
    if adapt_system(path) is None:
        raise ConfigError(f"{path} is not a Step-2 run (its checkpoints are not an adapt stage's); {expected}")
    out = path.parents[2] if path.parent.parent.name == "adapt" and (path.parents[2] / "data").is_dir() else None
    return [path], out


def heldout_text(lang: str, texts: dict[str, str], out: Path | None) -> Path:
    """The held-out text of `lang`: the one given, else the held-out slice of the recipe output's prepared corpus
    (OUT/data/<lang>/, `mm-ds prepare --heldout`), else its generated world's (written on demand)."""
    if lang in texts:
        if not Path(texts[lang]).is_file():
            raise ConfigError(f"held-out text {texts[lang]} for {lang} does not exist")
        return Path(texts[lang])
    sliced = prepared_heldout(out / "data" / lang) if out is not None else None
    if sliced is not None:
        return sliced
    if out is not None and (out / "world" / "world.json").is_file():
        from ..data.world.writer import HELDOUT, write_heldout
        have = out / "world" / HELDOUT / f"{lang}.txt"
        return have if have.is_file() else write_heldout(out / "world", lang)
    raise ConfigError(f"no held-out {lang} text: give --text {lang}=FILE (target text that Step 2 did not train on), "
                      f"prepare {lang} with `mm-ds prepare --heldout FRACTION`, or check a run inside a recipe output "
                      f"with a generated world")


def prepared_heldout(corpus_dir: Path) -> Path | None:
    """The held-out slice a prepared corpus recorded in its meta.json (None: none, or no corpus)."""
    try:
        held = json.loads((corpus_dir / "meta.json").read_text()).get("heldout")
    except (OSError, ValueError):
        return None
    return corpus_dir / held["file"] if held and held["lines"] and (corpus_dir / held["file"]).is_file() else None


HELDOUT_BYTES = 16 << 20
"""Held-out text read per language: its first 16 MiB (whole lines), far more than a check's sequences need; a
held-out slice of a CC-100-sized corpus is gigabytes."""


def heldout_corpus(text: Path, lang: str, tokenizer: str, root: Path) -> Path:
    """The first HELDOUT_BYTES of `text` encoded with `tokenizer` (mm-ds prepare's format) under root/heldout/,
    once per (text, tokenizer)."""
    from ..data.corpus import prepare

    with open(text, "rb") as fh:
        head = fh.read(HELDOUT_BYTES)
        if fh.read(1):  # cut at a line end
            head = head[:head.rfind(b"\n") + 1]
    h = hashlib.sha256(Path(tokenizer).read_bytes())  # contents, not names: a rewritten file is a new corpus
    h.update(head)
    where = root / "heldout" / f"{lang}.{h.hexdigest()[:12]}"
    source = where.with_name(where.name + ".txt")
    if not source.is_file():  # its name is its content's hash: one that is there is complete (written atomically)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.with_suffix(".tmp").write_bytes(head)
        source.with_suffix(".tmp").replace(source)
    try:
        prepare(lang, [str(source)], str(where), spm_model=tokenizer, workers=1, progress=False)
    except ValueError:  # another text, or the tree moved (prepare records absolute paths): it is only a cache
        shutil.rmtree(where, ignore_errors=True)
        prepare(lang, [str(source)], str(where), spm_model=tokenizer, workers=1, progress=False)
    return where


def row_fingerprint(ckpt: Path, primary: str, heldout: Path, settings: Settings, tag: str) -> str:
    """Changes when any input of a row changes: the checkpoint's and the primary model's manifests, the held-out
    corpus (its name is a hash of the text and the tokenizer), the settings. No paths: a moved tree keeps its rows."""
    h = hashlib.sha256(json.dumps([asdict(settings), tag, heldout.name, ROWS_VERSION]).encode())
    for f in (checkpoint.manifest_of(ckpt), checkpoint.manifest_of(primary)):
        h.update(f.read_bytes() if f.is_file() else b"-")
    return h.hexdigest()


def _cached(path: Path, key: str, compute) -> dict:
    """The row saved at `path` under fingerprint `key`, else compute() saved there."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    if saved.get("fingerprint") != key:
        saved = {"fingerprint": key, "row": compute()}
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_json_atomic(path, saved)
    return saved["row"]


def align_run(run: Path, texts: dict[str, str], out: Path | None, settings: Settings = Settings(), device="cpu",
              say=print) -> list[dict]:
    """The rows of one adapt run, step 0 first; each checkpoint's row is computed once (cached under
    OUT/align/<system>/<lang>/ or RUN/align/)."""
    ckpts = checkpoint.list_checkpoints(run, "curve")  # the curve's, not time-based resume checkpoints
    if not ckpts:
        raise ConfigError(f"{run} has no complete Step-2 checkpoint (checkpoints/step_*/ with a manifest); run or "
                          f"resume its adapt stage first")
    meta = checkpoint.read_meta(ckpts[0])
    system, lang = meta["system"], meta["lang"]
    root = out / "align" if out is not None else run / "align"
    results = root / system / lang if out is not None else root
    results.mkdir(parents=True, exist_ok=True)
    heldout = heldout_corpus(heldout_text(lang, texts, out), lang, meta["tokenizer"], root)
    batches = start = None
    rows = []
    for tag, ckpt in [(INIT, ckpts[0])] + [(c.name, c) for c in ckpts]:
        def compute():
            nonlocal batches, start
            batches = batches or eval_batches(heldout, meta["run_config"]["data"], settings)
            start = start or initial_group(ckpts[0])
            return row_for(ckpt, batches, device, init=tag == INIT, init_group=start)
        rows.append(_cached(results / f"{tag}.json", row_fingerprint(ckpt, meta["primary"], heldout, settings, tag),
                            compute))
    r = rows[-1]
    say(f"[mm-ds] align {system} {lang}: {len(rows)} points; at step {r['step']} held-out MLM accuracy of the primary "
        f"with its embeddings {100 * r['primary_acc']:.1f}% (step 0: {100 * rows[0]['primary_acc']:.1f}%)")
    return rows


def source_rows(out: Path, settings: Settings = Settings(), device="cpu", say=print) -> list[dict]:
    """Every primary model's (OUT/pretrain/*) and mini-model's (OUT/build_mini/*) MLM on held-out source-language
    text, beside a unigram predictor's from the source corpus's training shards (OUT/data/<lang>): has the body
    learnt more than word frequencies? [] (and a line saying why) when there is no held-out source text."""
    runs = [(r.name, "primary", r) for r in sorted((out / "pretrain").glob("*"))] + \
        [(r.name, "mini-model", r) for r in sorted((out / "build_mini").glob("*"))]
    runs = [(s, which, r) for s, which, r in runs if (r / checkpoint.FINAL / checkpoint.META).is_file()]
    if not runs:
        return []
    metas = {r: checkpoint.read_meta(r / checkpoint.FINAL) for _, _, r in runs}
    lang = metas[runs[0][2]]["lang"]
    data = next((m["run_config"]["data"] for m in metas.values() if "run_config" in m), None)  # not in extractions
    try:
        if data is None:
            raise ConfigError("no pretraining run records its data settings (run_config)")
        text = heldout_text(lang, {}, out)
    except ConfigError as e:
        say(f"[mm-ds] no source-language ({lang}) MLM rows: {e}")
        return []
    corpus = out / "data" / lang  # the training shards: the unigram predictor's frequencies
    rows, batches = [], {}
    for system, which, run in runs:
        tokenizer = metas[run]["tokenizer"]
        heldout = heldout_corpus(text, lang, tokenizer, out / "align")

        def compute():
            if tokenizer not in batches:
                batches[tokenizer] = eval_batches(heldout, data, settings)
            meta, sd = checkpoint.load_final(run)
            cfg = model_config_from_dict(meta["model"])
            if which == "primary" and cfg.secondary_head_layer is not None:  # its prediction is the main head's
                cfg, sd = surgery.drop_secondary_head(cfg, sd)
            m = mlm_metrics(cfg, sd, batches[tokenizer], device)
            u = unigram_metrics(corpus, batches[tokenizer]) if (corpus / "meta.json").is_file() else \
                {"loss": None, "acc": None}
            return {"kind": "source", "system": system, "model": which, "lang": lang, "layers": cfg.num_layers,
                    "sequences": sum(len(b["input_ids"]) for b in batches[tokenizer]), "targets": m["targets"],
                    "loss": m["loss"], "acc": m["acc"], "unigram_loss": u["loss"], "unigram_acc": u["acc"]}
        rows.append(_cached(out / "align" / "source" / f"{which}.{system}.json",
                            row_fingerprint(run, str(run), heldout, settings, "source"), compute))
    u = rows[0]["unigram_acc"]
    say(f"[mm-ds] align {lang}: held-out MLM accuracy " + ", ".join(f"{r['system']} {r['model']} {100 * r['acc']:.1f}%"
                                                                  for r in rows)
        + ("" if u is None else f"; unigram {100 * u:.1f}%"))
    return rows


def align(path: Path, texts: dict[str, str] | None = None, settings: Settings = Settings(), device="cpu",
          say=print) -> tuple[list[dict], Path | None]:
    """Every row of a recipe output (its source-language rows too) or of one adapt run, and the recipe output
    (None for a lone run)."""
    runs, out = adapt_runs(Path(path))
    rows = []
    for run in runs:
        rows += align_run(run, texts or {}, out, settings, device, say)
    if out is not None:
        rows += source_rows(out, settings, device, say)
    return rows, out


def aligned_runs(recipe, out: Path | None = None) -> list[tuple[str, str]]:
    """The one rule for the (system, target language) Step-2 runs `mm-ds run`'s alignment check scores, for
    `align_recipe`, its spread over ranks (align_spread.py) and `mm-ds plan` (plan_totals.py): with align_sequences,
    every system in each language with held-out text: a file (recipe key heldout), the generated world's, or the
    prepared corpus's slice (prepare_options: real text gets one unless prepare.heldout is 0). With `out` (its data
    prepared), a language whose corpus holds no held-out line (too few lines, or prepared without) is left out."""
    from ..recipe import prepare_options

    sliced = bool(prepare_options(recipe).get("heldout"))
    langs = [lang for lang in recipe.langs if lang in recipe.heldout or recipe.world is not None
             or sliced and (out is None or prepared_heldout(out / "data" / lang) is not None)]
    return [(s, lang) for s in recipe.systems for lang in langs] if recipe.align_sequences else []


def align_recipe(recipe, out: Path, device="cpu", say=print) -> list[Path]:
    """`mm-ds run`'s alignment check and MLM level: `aligned_runs`, the source rows, OUT/align.jsonl, the report."""
    from ..recipe import data_path

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
    from ..report.align_report import write_align
    from ..report.report import mlm_report

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
    p.add_argument("--seed", type=int, default=Settings.seed, help="seed of the evaluation masks (default: %(default)s)")
    p.add_argument("--report", help="directory for align.md, align.csv, align_<lang>.png and mlm/ (default: "
                   "OUT/report, or RUN/align/report for one run)")
    a = p.parse_args(argv)
    if a.sequences < 1:
        raise ConfigError(f"--sequences {a.sequences} must be at least 1")
    import torch

    rows, out = align(Path(a.path), parse_texts(a.text), Settings(a.sequences, a.seed),
                      device="cuda" if torch.cuda.is_available() else "cpu")
    where = out if (Path(a.path) / "adapt").is_dir() else Path(a.path) / "align"  # one run: its own files
    written = write_rows(rows, where, Path(a.report) if a.report else where / "report")
    from ..report.align_report import align_table
    print(align_table(rows))
    print(f"wrote {', '.join(str(w) for w in written)}")
    return 0

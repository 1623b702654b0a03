"""The alignment check and the MLM-level measure: do Step-2 embeddings plug into the primary model? No task data.

For every Step-2 checkpoint of every system, on held-out target text, the target-language MLM loss and accuracy of
  - the primary model with that checkpoint's embeddings swapped in (surgery.swap_embeddings, as Step 4 does for
    the finetuned models), read through its main head with the output bias refit on the target's training text
    (mlm_measure.refit_bias: everything else frozen): the MLM-level measure of transfer, the same for every system
    whichever head Step 2 trained through (MINIJOINT's is the secondary head, whose prior the main head reads
    scrambled: mlm_measure's docstring, docs/results.md 2026-11-27);
  - the same primary with the output bias Step 2 left ("step bias": for a MINIJOINT primary, its secondary head's);
  - the mini-model as Step 2 trains it (mini-model systems only: MINIJOINT, MINIPOST and their variants);
  - the target's unigram predictor (its training shards' piece frequencies) on the same tokens: the baseline row,
    what frequencies alone give;
side by side per Step-2 update, from step 0 (the initialisation, transfer.control_group: the control, scored the
same way) to the last checkpoint. records.mlm_results turns these rows into records for the report's Table 3,
Figure 3 and speedups at the MLM level (report.report.mlm_report). Beside them, `source_rows`: each primary model's
and mini-model's MLM on held-out source-language (English) text next to a unigram predictor's (the training
shards' piece frequencies): has the body learnt more than word frequencies? A MINIJOINT primary's row adds its main
head read with the secondary head's bias, and the cosine between the two heads' mean outputs.

Held-out text is never training text: `mm-ds prepare --heldout F` keeps a deterministic slice of each language out of
its training shards (data/corpus.py; OUT/data/<lang>/heldout.txt, which `mm-ds run` prepares for real text); a
generated world writes world/heldout/<lang>.txt from its own stream (world.write_heldout); `--text LANG=FILE`
(recipe key `heldout`) names a file. It is encoded with the checkpoint's own tokenizer into
ALIGN/heldout/<lang>.<sha>/ (mm-ds prepare's format) and packed as in training (data.mlm.MLMBatches) with a fixed
seed; every selected token is replaced by <mask> (no 10% random or kept tokens: a kept token shows the answer),
so every checkpoint sees the same `sequences` sequences and the same masks, and accuracy is prediction from context.
The refit reads `fit_sequences` sequences of Step 2's own training corpus, masked the same way with another seed.

    OUT/align/<system>/<lang>/<step tag>.json   one row per checkpoint, keyed by a fingerprint of its inputs
    OUT/align.jsonl, OUT/report/align.md, OUT/report/align_<lang>.png, OUT/report/mlm/   (pipeline/alignment.py)
A single adapt run keeps its cache in RUN/align/.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from ..config import ConfigError, model_config_from_dict
from ..runtime.checkpointing import checkpoint
from ..systems import SystemNameError, system_of
from .align_rows import (INIT, ROWS_VERSION, Settings, eval_batches, fit_data, initial_group, mlm_metrics, mlm_model,
                         row_for, training_corpus)
from .heldout import heldout_corpus, heldout_text
from .mlm_measure import head_features, two_heads, unigram_metrics

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


def row_fingerprint(ckpt: Path, primary: str, heldout: Path, settings: Settings, tag: str,
                    corpus: Path | None = None) -> str:
    """Changes when any input of a row changes: the checkpoint's and the primary model's manifests, the held-out
    corpus (its name is a hash of the text and the tokenizer), the training corpus the refit reads (its meta.json),
    the settings. No paths: a moved tree keeps its rows."""
    h = hashlib.sha256(json.dumps([asdict(settings), tag, heldout.name, ROWS_VERSION]).encode())
    extra = [corpus / "meta.json"] if corpus else []
    for f in [checkpoint.manifest_of(ckpt), checkpoint.manifest_of(primary)] + extra:
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
    corpus = training_corpus(meta, out)
    batches = start = fit = None
    rows = []
    for tag, ckpt in [(INIT, ckpts[0])] + [(c.name, c) for c in ckpts]:
        def compute():
            nonlocal batches, start, fit
            batches = batches or eval_batches(heldout, meta["run_config"]["data"], settings)
            start = start or initial_group(ckpts[0])
            fit = fit or fit_data(corpus, meta["run_config"]["data"], settings, batches)
            return row_for(ckpt, batches, device, init=tag == INIT, init_group=start, fit=fit)
        rows.append(_cached(results / f"{tag}.json",
                            row_fingerprint(ckpt, meta["primary"], heldout, settings, tag, corpus), compute))
    r = rows[-1]
    say(f"[mm-ds] align {system} {lang}: {len(rows)} points; at step {r['step']} held-out MLM accuracy of the primary "
        f"with its embeddings {100 * r['primary_acc']:.1f}% (step 0: {100 * rows[0]['primary_acc']:.1f}%; unigram "
        f"{100 * r['unigram_acc']:.1f}%)")
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
            if which == "primary" and cfg.secondary_head_layer is not None:  # its prediction is the main head's,
                model = mlm_model(cfg, sd, device)  # beside it: that head read with the secondary head's bias
                m = two_heads(model, head_features(model, batches[tokenizer], device))
            else:
                m = mlm_metrics(cfg, sd, batches[tokenizer], device)
            u = unigram_metrics(corpus, batches[tokenizer]) if (corpus / "meta.json").is_file() else \
                {"loss": None, "acc": None}
            return m | {"kind": "source", "system": system, "model": which, "lang": lang, "layers": cfg.num_layers,
                        "sequences": sum(len(b["input_ids"]) for b in batches[tokenizer]),
                        "unigram_loss": u["loss"], "unigram_acc": u["acc"]}
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

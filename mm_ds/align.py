"""The alignment check: do embeddings learnt over a mini-model plug into the primary model? No task data needed.

For every Step-2 checkpoint of a mini-model system (MINIJOINT, MINIPOST and their variants), the target-language
MLM loss and accuracy on held-out target text of
  - the mini-model as Step 2 trains it (the checkpoint as it is), and
  - the primary model with that checkpoint's language group swapped in (surgery.swap_embeddings, as Step 4 does
    for the finetuned models; a MINIJOINT primary predicts with its main head, which takes the group's bias),
side by side per Step-2 update, from step 0 (the initialisation, transfer.control_group) to the last checkpoint.
A primary loss that falls with the mini-model's says the embeddings transfer before any finetuning; where it
stops falling is an early-stopping signal.

Held-out text is never training text: a generated world writes world/heldout/<lang>.txt from its own stream
(world.write_heldout; training files stay byte-identical), real data names a file (`--text LANG=FILE`, recipe
key `heldout`). It is encoded with the checkpoint's own tokenizer into ALIGN/heldout/<lang>.<sha>/ (mm-ds
prepare's format), packed and masked as in training (data.mlm.MLMBatches) with a fixed seed: every checkpoint
sees the same `sequences` sequences and the same masks.

    OUT/align/<system>/<lang>/<step tag>.json   one row per checkpoint, keyed by a fingerprint of its inputs
    OUT/align.jsonl, OUT/report/align.md, OUT/report/align_<lang>.png   (align_report.py)
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

from . import checkpoint, flops, surgery
from .config import ConfigError, model_config_from_dict
from .systems import SystemNameError, system_of

INIT = "init"
"""The tag of step 0: the language group Step 2 starts from."""


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

    from .model import RobertaMLM

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


def eval_batches(heldout_dir: Path, data_cfg: dict, settings: Settings) -> list[dict]:
    """The fixed evaluation batches: the first `sequences` samples of the held-out corpus, packed and masked as
    Step 2's training batches are (its seq_len and masking rates), with `settings.seed`."""
    from .data.mlm import MLMBatches
    from .data.shards import TokenCorpus

    corpus = TokenCorpus(heldout_dir)
    mlm = MLMBatches(corpus, data_cfg["seq_len"], seed=settings.seed, mask_prob=data_cfg["mask_prob"],
                     random_prob=data_cfg["random_prob"], keep_prob=data_cfg["keep_prob"], vocab_size=corpus.vocab_size)
    n = min(settings.sequences, mlm.num_blocks())  # a second epoch would repeat blocks
    return [mlm.samples(np.arange(i, min(i + settings.batch, n))) for i in range(0, n, settings.batch)]


@lru_cache(maxsize=1)  # a run's checkpoints share their primary model (runs come one at a time)
def _primary(path: str):
    meta, sd = checkpoint.load_final(path)
    cfg = model_config_from_dict(meta["model"])
    if cfg.secondary_head_layer is not None:  # MINIJOINT: the full model's prediction is its main head's
        cfg, sd = surgery.drop_secondary_head(cfg, sd)
    return meta, cfg, sd


def row_for(ckpt: Path, batches: list[dict], device="cpu", init: bool = False) -> dict:
    """One row: the mini-model of `ckpt` and its primary model with the checkpoint's language group (`init`: with
    the group Step 2 started from instead, at step 0)."""
    meta, sd = checkpoint.load_final(ckpt)
    if meta.get("stage") != "adapt":
        raise ConfigError(f"{ckpt} is a {meta.get('stage')!r} checkpoint, not a Step-2 (adapt) one")
    if not meta.get("primary"):
        raise ConfigError(f"{ckpt} records no primary model (meta key primary); it cannot be checked against one")
    cfg = model_config_from_dict(meta["model"])
    if init:
        from .stages.transfer import control_group
        group = control_group(meta, meta["run_config"]["train"]["seed"])
        cfg, sd = surgery.swap_embeddings(cfg, sd, group)
    else:
        group = surgery.language_group(sd)
    _, pcfg, psd = _primary(str(Path(meta["primary"]).resolve()))
    pcfg, psd = surgery.swap_embeddings(pcfg, psd, group)
    # A multi-depth mini-model (§7) is scored at the depth Step 2 was training at (its first one at step 0).
    phases = meta.get("depth_phases") or [[None]]
    depth = phases[0 if init else -1][0]
    mini, primary = mlm_metrics(cfg, sd, batches, device, depth), mlm_metrics(pcfg, psd, batches, device)
    step, f = (0, 0.0) if init else (meta["step"], meta["flops"])
    return {"system": meta.get("system"), "lang": meta.get("lang"), "step": step, "flops": f,
            "v100_days": flops.to_v100_days(f), "sequences": sum(len(b["input_ids"]) for b in batches),
            "targets": mini["targets"], "mini_loss": mini["loss"], "mini_acc": mini["acc"],
            "primary_loss": primary["loss"], "primary_acc": primary["acc"],
            "mini_layers": depth or cfg.num_layers, "primary_layers": pcfg.num_layers}


# ---------------------------------------------------------------- runs, held-out text, cache

def mini_system(run: Path) -> str | None:
    """The mini-model system of an adapt run (None: not a mini-model system), from its final/ or newest checkpoint."""
    where = run / checkpoint.FINAL if (run / checkpoint.FINAL / checkpoint.META).is_file() else \
        next(reversed(checkpoint.list_checkpoints(run)), None)
    if where is None:
        return None
    meta = checkpoint.read_meta(where)
    try:
        return meta["system"] if meta.get("stage") == "adapt" and system_of(meta.get("system", "")).mini else None
    except SystemNameError:
        return None


def adapt_runs(path: Path) -> tuple[list[Path], Path | None]:
    """(the mini-model systems' adapt runs, the recipe output they belong to or None) of a recipe output
    OUT (OUT/adapt/<system>/<lang>/) or of one adapt run directory; errors name `path` and what it should be."""
    path = Path(path)
    expected = ("give a recipe output (OUT with adapt/<system>/<lang>/ run directories, as `mm-ds run` writes) "
                "or one Step-2 run directory (with checkpoints/step_*/ written by `mm-ds adapt`)")
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory; {expected}")
    if (path / "adapt").is_dir():
        runs = sorted(r for r in (path / "adapt").glob("*/*") if r.is_dir() and checkpoint.list_checkpoints(r))
        minis = [r for r in runs if mini_system(r)]
        if not minis:
            raise ConfigError(f"{path}/adapt holds no Step-2 run of a mini-model system (MINIJOINT, MINIPOST or a "
                              f"variant) with complete checkpoints" + (f" (found {', '.join(str(r) for r in runs)})"
                                                                       if runs else "") + f"; {expected}")
        return minis, path
    if not checkpoint.list_checkpoints(path):
        raise ConfigError(f"{path} has neither adapt/ nor complete checkpoints/step_*/; {expected}")
    system = mini_system(path)
    if system is None:
        raise ConfigError(f"{path} is not a Step-2 run of a mini-model system: the alignment check compares a "
                          f"mini-model with its primary model (BL_BASE and BL_SMALL adapt the primary itself)")
    out = path.parents[2] if path.parent.parent.name == "adapt" and (path.parents[2] / "data").is_dir() else None
    return [path], out


def heldout_text(lang: str, texts: dict[str, str], out: Path | None) -> Path:
    """The held-out text of `lang`: the one given, else the recipe output's generated world's (written on demand)."""
    if lang in texts:
        if not Path(texts[lang]).is_file():
            raise ConfigError(f"held-out text {texts[lang]} for {lang} does not exist")
        return Path(texts[lang])
    if out is not None and (out / "world" / "world.json").is_file():
        from .data.world.writer import HELDOUT, write_heldout
        have = out / "world" / HELDOUT / f"{lang}.txt"
        return have if have.is_file() else write_heldout(out / "world", lang)
    raise ConfigError(f"no held-out {lang} text: give --text {lang}=FILE (target text that Step 2 did not train on), "
                      f"or check a run inside a recipe output with a generated world")


def heldout_corpus(text: Path, lang: str, tokenizer: str, root: Path) -> Path:
    """`text` encoded with `tokenizer` (mm-ds prepare's format) under root/heldout/, once per (text, tokenizer)."""
    from .data.corpus import prepare

    h = hashlib.sha256()
    for f in (tokenizer, text):  # contents, not names: a rewritten file at the same path is a new corpus
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    digest = h.hexdigest()[:12]
    where = root / "heldout" / f"{lang}.{digest}"
    try:
        prepare(lang, [str(text)], str(where), spm_model=tokenizer, workers=1, progress=False)
    except ValueError:  # another text, or the tree moved (prepare records absolute paths): it is only a cache
        shutil.rmtree(where, ignore_errors=True)
        prepare(lang, [str(text)], str(where), spm_model=tokenizer, workers=1, progress=False)
    return where


def fingerprint(ckpt: Path, primary: str, heldout: Path, settings: Settings, tag: str) -> str:
    """Changes when any input of a row changes: the checkpoint's and the primary model's manifests, the held-out
    corpus (its name is a hash of the text and the tokenizer), the settings. No paths: a moved tree keeps its rows."""
    h = hashlib.sha256(json.dumps([asdict(settings), tag, heldout.name]).encode())
    for f in (checkpoint.manifest_of(ckpt), checkpoint.manifest_of(primary)):
        h.update(f.read_bytes() if f.is_file() else b"-")
    return h.hexdigest()


def align_run(run: Path, texts: dict[str, str], out: Path | None, settings: Settings = Settings(), device="cpu",
              say=print) -> list[dict]:
    """The rows of one adapt run, step 0 first; each checkpoint's row is computed once (cached under
    OUT/align/<system>/<lang>/ or RUN/align/)."""
    ckpts = checkpoint.list_checkpoints(run)
    if not ckpts:
        raise ConfigError(f"{run} has no complete Step-2 checkpoint (checkpoints/step_*/ with a manifest); run or "
                          f"resume its adapt stage first")
    meta = checkpoint.read_meta(ckpts[0])
    system, lang = meta["system"], meta["lang"]
    root = out / "align" if out is not None else run / "align"
    results = root / system / lang if out is not None else root
    results.mkdir(parents=True, exist_ok=True)
    heldout = heldout_corpus(heldout_text(lang, texts, out), lang, meta["tokenizer"], root)
    batches, rows = None, []
    for tag, ckpt in [(INIT, ckpts[0])] + [(c.name, c) for c in ckpts]:
        path, key = results / f"{tag}.json", fingerprint(ckpt, meta["primary"], heldout, settings, tag)
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("fingerprint") != key:
            batches = batches or eval_batches(heldout, meta["run_config"]["data"], settings)
            saved = {"fingerprint": key, "row": row_for(ckpt, batches, device, init=tag == INIT)}
            checkpoint.write_json_atomic(path, saved)
        rows.append(saved["row"])
    r = rows[-1]
    say(f"[mm-ds] align {system} {lang}: {len(rows)} points; at step {r['step']} MLM loss mini {r['mini_loss']:.3f}, "
        f"primary with its embeddings {r['primary_loss']:.3f}")
    return rows


def align(path: Path, texts: dict[str, str] | None = None, settings: Settings = Settings(), device="cpu",
          say=print) -> tuple[list[dict], Path | None]:
    """Every row of a recipe output or of one adapt run, and the recipe output (None for a lone run)."""
    runs, out = adapt_runs(Path(path))
    rows = []
    for run in runs:
        rows += align_run(run, texts or {}, out, settings, device, say)
    return rows, out


def align_recipe(recipe, out: Path, device="cpu", say=print) -> list[Path]:
    """`mm-ds run`'s alignment check: every mini-model system and target language with held-out text (the
    recipe's `heldout`, or the generated world's), OUT/align.jsonl and the report's align.* files."""
    from .recipe import data_path

    texts = {lang: str(data_path(recipe, f)) for lang, f in recipe.heldout.items()}
    langs = [lang for lang in recipe.langs if lang in texts or recipe.world is not None]
    if len(langs) < len(recipe.langs):
        say(f"[mm-ds] alignment check skipped for {', '.join(sorted(set(recipe.langs) - set(langs)))}: no held-out "
            f"text (recipe key heldout: LANG: FILE)")
    settings = Settings(sequences=recipe.align_sequences)
    rows = []
    for s in (s for s in recipe.systems if system_of(s).mini):
        for lang in langs:
            rows += align_run(out / "adapt" / s / lang, texts, out, settings, device, say)
    return write_rows(rows, out, out / "report") if rows else []


def write_rows(rows: list[dict], out: Path, report_dir: Path) -> list[Path]:
    """OUT/align.jsonl and the report's table and curves."""
    from .align_report import write_align

    out.mkdir(parents=True, exist_ok=True)
    checkpoint.write_text_atomic(out / "align.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return [out / "align.jsonl", *write_align(rows, report_dir)]


def parse_texts(items: list[str]) -> dict[str, str]:
    texts = {}
    for item in items:
        lang, eq, file = item.partition("=")
        if not eq or not lang or not file:
            raise ConfigError(f"--text {item!r} must look like LANG=FILE, e.g. --text t1=heldout_t1.txt")
        texts[lang] = file
    return texts


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds align", description="the alignment check: target-language MLM loss and "
                                "accuracy of each Step-2 checkpoint's mini-model and of its primary model with "
                                "those embeddings swapped in, on held-out text (no task data)")
    p.add_argument("path", help="a recipe output (OUT of `mm-ds run`) or one Step-2 run directory of a mini-model system")
    p.add_argument("--text", action="append", default=[], metavar="LANG=FILE",
                   help="held-out target text (CC-100 layout) for LANG; default: a generated world's own "
                        "(OUT/world/heldout/LANG.txt, written on demand)")
    p.add_argument("--sequences", type=int, default=Settings.sequences, help="held-out sequences per checkpoint "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=Settings.seed, help="seed of the evaluation masks (default: %(default)s)")
    p.add_argument("--report", help="directory for align.md, align.csv and align_<lang>.png (default: OUT/report, "
                   "or RUN/align/report for one run)")
    a = p.parse_args(argv)
    if a.sequences < 1:
        raise ConfigError(f"--sequences {a.sequences} must be at least 1")
    import torch

    rows, out = align(Path(a.path), parse_texts(a.text), Settings(a.sequences, a.seed),
                      device="cuda" if torch.cuda.is_available() else "cpu")
    where = out if (Path(a.path) / "adapt").is_dir() else Path(a.path) / "align"  # one run: its own files
    written = write_rows(rows, where, Path(a.report) if a.report else where / "report")
    from .align_report import align_table
    print(align_table(rows))
    print(f"wrote {', '.join(str(w) for w in written)}")
    return 0

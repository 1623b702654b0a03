"""Held-out text for the alignment check (mm_ds/eval/align.py): which file holds a language's held-out text (the one
given, the prepared corpus's slice, or a generated world's), and that text encoded once per tokenizer."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..config import ConfigError
from ..data.corpus import prepare
from ..data.world.writer import HELDOUT, write_heldout


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

"""Writes a world to disk: raw text per language and the tasks in their official file formats.

Each part draws from its own seeded stream (`{seed}:{part}`), so resizing one part leaves the others
unchanged, and the same arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .grammar import LEXICON, NAMES, Sampler
from .languages import ENGLISH, Renderer, get_language
from .tasks import NLI_LABELS, PairItem, QAItem, nli_items, pair_texts, paws_items, qa_items, qa_paragraph

FORMAT = "mm-ds-world/1"
DEFAULT_TASK_SIZES = {"nli_train": 5000, "paws_train": 4000, "qa_train": 4000, "dev": 500, "test": 1000}
"""Examples (QA: questions) per split. dev and test exist in every language, train in English only."""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")


def _json(obj, indent: int | None = None) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=indent) + "\n"


# ---------------------------------------------------------------------------------------------- text


def corpus(sampler: Sampler, r: Renderer, rng: random.Random, n: int) -> list[str]:
    """`n` sentences in CC-100 layout: one per line, documents of 3-10 lines separated by a blank line.

    A document reuses a few nouns (its "cast"), so text has some cross-sentence coherence to model.
    """
    lines, done = [], 0
    classes = sorted(sampler.nouns)
    while done < n:
        sampler.cast = {c: [sampler.pick(rng, sampler.nouns[c]) for _ in range(2)] for c in rng.sample(classes, 2)}
        k = min(rng.randint(3, 10), n - done)
        lines += [r.text(sampler.event(rng)) for _ in range(k)]
        lines.append("")
        done += k
    sampler.cast = {}
    return lines


# --------------------------------------------------------------------------------------------- tasks


def _tsv(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    out = ["\t".join(header)]
    for row in rows:
        assert not any("\t" in f or "\n" in f for f in row), row
        out.append("\t".join(row))
    return "\n".join(out) + "\n"


def xnli_tsv(r: Renderer, items: list[PairItem]) -> str:
    """XNLI-1.0 columns (+ pairID, which the official file also has); genre = the asked property."""
    rows = ((r.lang.code, it.label, *pair_texts(r, it), it.genre, it.id) for it in items)
    return _tsv(("language", "gold_label", "sentence1", "sentence2", "genre", "pairID"), rows)


def mnli_jsonl(r: Renderer, items: list[PairItem]) -> str:
    lines = []
    for it in items:
        a, b = pair_texts(r, it)
        lines.append(json.dumps({"gold_label": it.label, "sentence1": a, "sentence2": b, "pairID": it.id,
                                 "genre": it.genre}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def paws_tsv(r: Renderer, items: list[PairItem]) -> str:
    return _tsv(("id", "sentence1", "sentence2", "label"), ((it.id, *pair_texts(r, it), it.label) for it in items))


def squad_json(r: Renderer, items: list[QAItem]) -> str:
    data = [{"title": it.title, "paragraphs": [qa_paragraph(r, it)]} for it in items]
    return _json({"version": "1.1", "data": data})


# --------------------------------------------------------------------------------------------- world


def _task_sizes(task_sizes: dict[str, int] | None, sentences: int, target_sentences: int) -> dict[str, int]:
    """DEFAULT_TASK_SIZES with `task_sizes` over them, every size checked."""
    sizes = dict(DEFAULT_TASK_SIZES)
    unknown = set(task_sizes or {}) - set(sizes)
    if unknown:
        raise ValueError(f"unknown task size key(s) {sorted(unknown)}; known: {', '.join(sizes)}")
    sizes.update(task_sizes or {})
    if any(v < 1 for v in sizes.values()) or sentences < 1 or target_sentences < 1:
        raise ValueError(f"sizes must be >= 1: sentences={sentences}, target_sentences={target_sentences}, "
                         f"task_sizes={sizes}")
    return sizes


class _Files:
    """The world's files under `out`, each listed (relative to it) for world.json as it is written."""

    def __init__(self, out: Path):
        self.out, self.names = out, []

    def put(self, rel: str, text: str) -> None:
        if rel.endswith(".xz"):
            (self.out / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.out / rel).write_bytes(lzma.compress(text.encode("utf-8")))
        else:
            _write(self.out / rel, text)
        self.names.append(rel)


def _write_tasks(files: _Files, sampler: Sampler, rng: Callable[[str], random.Random], sizes: dict[str, int],
                 renderers: dict[str, Renderer]) -> None:
    """Tasks: English train; dev and test rendered in every language from the same items."""
    put = files.put
    en = renderers["en"]
    nli = {s: nli_items(sampler, rng(f"nli:{s}"), sizes["nli_train" if s == "train" else s], f"{s}-")
           for s in ("train", "dev", "test")}
    paws = {s: paws_items(sampler, rng(f"paws:{s}"), sizes["paws_train" if s == "train" else s], f"{s}-")
            for s in ("train", "dev", "test")}
    qa = {s: qa_items(sampler, rng(f"qa:{s}"), sizes["qa_train" if s == "train" else s], f"{s}-")
          for s in ("train", "dev", "test")}
    put("mnli/multinli_1.0_train.jsonl", mnli_jsonl(en, nli["train"]))
    put("paws-x/train.en.tsv", paws_tsv(en, paws["train"]))
    put("squad/train-v1.1.json", squad_json(en, qa["train"]))
    put("squad/dev-v1.1.json", squad_json(en, qa["dev"]))
    for code, r in renderers.items():
        for s in ("dev", "test"):
            put(f"xnli/xnli.{s}.{code}.tsv", xnli_tsv(r, nli[s]))
            put(f"paws-x/{s}.{code}.tsv", paws_tsv(r, paws[s]))
            put(f"mlqa/{s}-context-{code}-question-{code}.json", squad_json(r, qa[s]))
        put(f"xquad/xquad.{code}.json", squad_json(r, qa["test"]))


def _write_text(files: _Files, sampler: Sampler, rng: Callable[[str], random.Random],
                renderers: dict[str, Renderer], sentences: int, target_sentences: int, compress: bool) -> dict:
    """Raw text: each language samples its own sentences (monolingual, not parallel, like CC-100). Returns each
    language's entry of world.json (its sizes and its overlap with English)."""
    en_types = set(renderers["en"].map.values())
    lang_info = {}
    for code, r in renderers.items():
        n = sentences if code == "en" else target_sentences
        lines = corpus(sampler, r, rng(f"text:{code}"), n)
        files.put(f"text/{code}.txt" + (".xz" if compress else ""), "\n".join(lines) + "\n")
        files.put(f"lexicon/{code}.tsv", _tsv(("en", code), sorted(r.map.items())))
        toks = [t for line in lines for t in line.split()]
        types = set(r.map.values())
        lang_info[code] = {
            **r.lang.as_dict(),
            "sentences": n, "tokens": len(toks), "lexicon_types": len(types),
            "shared_types": len(types & en_types),
            "type_overlap": round(len(types & en_types) / len(types), 4),
            "token_overlap": round(sum(t in en_types for t in toks) / max(len(toks), 1), 4),
        }
    return lang_info


def generate_world(out_dir: str | Path, *, seed: int = 0, languages: Sequence[str] = ("t1", "t2"),
                   sentences: int = 80_000, target_sentences: int = 40_000,
                   task_sizes: dict[str, int] | None = None, compress: bool = False) -> dict:
    """Generate the world under `out_dir`; returns the manifest also written to `world.json`.

    sentences: English raw-text sentences (pretraining); target_sentences: per target language (Step 2).
    task_sizes: overrides of DEFAULT_TASK_SIZES. compress: write text/<lang>.txt.xz instead of .txt.
    """
    sizes = _task_sizes(task_sizes, sentences, target_sentences)
    langs = [get_language(c) for c in languages]
    if "en" in languages or len(set(languages)) != len(languages):
        raise ValueError(f"languages lists target languages once each (English is always made): {languages}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(seed)
    rng = lambda part: random.Random(f"{seed}:{part}")  # noqa: E731  one independent stream per part
    renderers = {"en": Renderer(ENGLISH, seed), **{l.code: Renderer(l, seed) for l in langs}}
    files = _Files(out)
    _write_tasks(files, sampler, rng, sizes, renderers)
    lang_info = _write_text(files, sampler, rng, renderers, sentences, target_sentences, compress)

    manifest = {
        "format": FORMAT, "seed": seed, "source": "en", "languages": lang_info,
        "task_sizes": sizes,
        "english": {"noun_class_sizes": {c: len(v) for c, v in LEXICON.nouns.items()},
                    "names": len(NAMES), "transitive_verbs": len(LEXICON.transitive),
                    "intransitive_verbs": len(LEXICON.intransitive), "adjectives": len(LEXICON.adjectives)},
        "tasks": {"xnli": {"labels": list(NLI_LABELS)}, "pawsx": {"labels": ["0", "1"], "1": "the doer is a person"},
                  "squad": {"note": "mlqa/*test* and xquad/* hold the same questions"}},
        "files": sorted(files.names + ["world.json"]),
    }
    _write(out / "world.json", _json(manifest, indent=1))
    return manifest


HELDOUT = "heldout"
"""world/heldout/<lang>.txt: held-out raw text (the alignment check, mm_ds/eval/align.py); not in world.json's files."""


def write_heldout(world_dir: str | Path, lang: str, sentences: int = 2000) -> Path:
    """world/heldout/<lang>.txt: `sentences` new sentences of `lang` (CC-100 layout), minus any line that also
    occurs in text/<lang>.txt, so no held-out line was trained on. Drawn from its own stream
    (`{seed}:heldout:{lang}`) after the world is written: every file of the world stays byte-identical, and
    world.json does not list it (a world made before held-out text existed gets it on demand)."""
    world = Path(world_dir)
    try:
        seed = json.loads((world / "world.json").read_text())["seed"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{world} is not a complete generated world ({world / 'world.json'}: {e}); "
                         f"generate it with `mm-ds world --out {world}`") from None
    text = world / "text" / f"{lang}.txt"
    if text.is_file():
        trained = set(text.read_text(encoding="utf-8").splitlines())
    elif text.with_suffix(".txt.xz").is_file():
        trained = set(lzma.decompress(text.with_suffix(".txt.xz").read_bytes()).decode("utf-8").splitlines())
    else:
        raise ValueError(f"{world} has no text/{lang}.txt(.xz): {lang!r} is not one of its languages")
    lines = corpus(Sampler(seed), Renderer(get_language(lang), seed), random.Random(f"{seed}:heldout:{lang}"),
                   sentences)
    kept = [line for line in lines if not line or line not in trained]
    out = world / HELDOUT / f"{lang}.txt"
    _write(out.with_suffix(".tmp"), "\n".join(kept) + "\n")
    out.with_suffix(".tmp").replace(out)  # whole or absent: its presence means it is complete
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mm-ds world", description="Generate the synthetic multilingual world.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--langs", default="t1,t2", help="comma-separated target presets (t1,t2,t3,t4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sentences", type=int, default=80_000, help="English raw-text sentences")
    p.add_argument("--target-sentences", type=int, default=40_000, help="raw-text sentences per target language")
    for k, v in DEFAULT_TASK_SIZES.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v, help=f"examples (QA: questions), default {v}")
    p.add_argument("--xz", action="store_true", help="write text/<lang>.txt.xz")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        m = generate_world(a.out, seed=a.seed, languages=[c for c in a.langs.split(",") if c],
                           sentences=a.sentences, target_sentences=a.target_sentences, compress=a.xz,
                           task_sizes={k: getattr(a, k) for k in DEFAULT_TASK_SIZES})
    except ValueError as e:
        p.error(str(e))
    for code, info in m["languages"].items():
        print(f"{code}: {info['sentences']} sentences, {info['lexicon_types']} word types, "
              f"token overlap with en {info['token_overlap']:.1%}")
    print(f"wrote {len(m['files'])} files to {a.out} in {time.perf_counter() - t0:.1f} s")
    return 0

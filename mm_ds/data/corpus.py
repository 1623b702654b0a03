"""`mm-ds prepare`: stream raw text, train a SentencePiece unigram model, encode into token shards.

Inputs (`inputs=`, read by mm_ds.data.inputs), any mix of:
  * file paths or glob patterns of UTF-8 text, optionally `.gz`, `.xz` or `.bz2` compressed, in CC-100
    layout: one paragraph/sentence per line, a blank line between documents. Every input file also starts a
    new document.
  * `hf:NAME[:CONFIG][:SPLIT][:COLUMN]` - a Hugging Face `datasets` source, streamed (needs network);
    SPLIT defaults to `train`, COLUMN to `text`, empty fields take the default (`hf:cc100::train:text`).
  * `hf-disk:PATH[:SPLIT][:COLUMN]` - a dataset saved with `Dataset.save_to_disk` (offline; what the tests
    use). Each row of a `datasets` source is one document; newlines inside a row separate its lines.

Steps, all streaming (the corpus is never held in memory):
  1. Sample: one pass draws a deterministic reservoir sample of `sample_sentences` non-blank lines
     (vectorised Algorithm R, seeded by `seed`), skipped when `spm_model=` reuses a model (a SentencePiece
     model, or the tokenizer.json `mm-ds import` wrote for a source model without one: mm_ds.data.tokenizer).
  2. Train SentencePiece on the sample (mm_ds.data.tokenizer): unigram (as XLM-R), nmt_nfkc normalisation, ids fixed by
     mm_ds.tokens (<s>=0 <pad>=1 </s>=2 <unk>=3, user-defined <mask>=4) so special ids line up across
     languages. The vocabulary size is an upper bound (hard_vocab_limit=False): a corpus too small to
     reach it gets the largest vocabulary SentencePiece can build, with a warning; meta.json records the
     real size, and models take their vocab_size from the tokenizer.
  3. Encode: ~1 MiB chunks of whole lines on `workers` threads, each chunk one batched SentencePiece call
     that releases the GIL and returns int32 buffers (`tokenizer.encoder`: no Python int per id), two
     chunks per worker in flight; this thread splits the next chunks into lines, turns finished ones into
     numpy arrays and appends them to shards of about `shard_tokens` tokens (cut at line boundaries). One
     process: a pool of processes did the same work with ~30% more CPU time (pickling, a parent competing
     with its workers for the cores), and Python int lists of ids kept the threads from scaling. The code of
     this step: mm_ds.data.encode.

Every non-blank line becomes its ids followed by EOS; a line that encodes to no token (empty, whitespace)
is blank, i.e. a document boundary. Lines that are not text (invalid UTF-8, control bytes such as NUL) are
skipped and counted (`skipped_lines` in meta.json); an input that is mostly such lines (a binary) is refused,
naming it, and nothing is written. `datasets` sources are streamed twice (sample, then encode).

Held-out slice (`heldout=` a fraction, 0: none): a line is held out when a hash of its text (blake2b of the
stripped UTF-8 bytes, `is_heldout`) falls below that fraction of the hash range. Held-out lines go to
`heldout.txt` (in corpus order) instead of the shards, and the SentencePiece sample skips them, so no training
step and no tokenizer sees them; the rule depends on a line's text only (the same text anywhere in the corpus is
held out everywhere; chunking and workers change nothing). meta.json records it under `heldout`; the alignment
check (mm_ds/eval/align.py) reads it as the language's held-out text.

Everything is written into `<out_dir>.partial/` and renamed to `out_dir` at the end, meta.json last, so
an interrupted run never leaves a directory that looks complete. Re-running with the same settings
returns the existing corpus; different settings into the same directory are refused. The on-disk format
is documented in mm_ds.data.shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mm_ds import tokens
from mm_ds.data.blocks import cache_file, write_cache
from mm_ds.data.encode import ShardWriter, encoded_chunks
from mm_ds.data.inputs import InputSource, not_text_error, resolve_inputs, total_bytes
from mm_ds.data.shards import FORMAT_VERSION, META_FILE, SPM_MODEL_FILE, SPM_VOCAB_FILE, TokenCorpus, shard_dtype
from mm_ds.data.tokenizer import (MODEL_TYPES, check_spm, check_tokenizer, decoder, is_tokenizer_json, reservoir_sample,
                                  train_spm)

TOKENIZER_JSON = "tokenizer.json"  # a reused Hugging Face tokenizer's name in the corpus (spm_model: its file)


# ----------------------------------------------------------------------------------------------- held out

HELDOUT_FILE = "heldout.txt"
HELDOUT_RULE = "blake2b-64 (person mm-ds-heldout) of the line's stripped UTF-8 bytes < fraction x 2^64"


def is_heldout(line: bytes, fraction: float) -> bool:
    """Whether a line (raw bytes, surrounding whitespace ignored) belongs to the held-out slice; blank lines never."""
    text = line.strip()
    if not text or fraction <= 0:
        return False
    digest = hashlib.blake2b(text, digest_size=8, person=b"mm-ds-heldout").digest()
    return int.from_bytes(digest, "big") < fraction * 2 ** 64


def _held_out(settings: dict) -> Callable[[bytes], bool] | None:
    """The held-out rule at the fraction `settings` asks for, on raw lines; None where no line is held out."""
    fraction = settings.get("heldout", 0.0)
    return (lambda line: is_heldout(line, fraction)) if fraction else None


# ----------------------------------------------------------------------------------------------- prepare

def _check_out_dir(out: Path, settings: dict) -> dict | None:
    """The existing meta when `out` already holds this exact corpus; None when `out` is free to use."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory; choose another --out")
    if (out / META_FILE).is_file():
        try:
            existing = json.loads((out / META_FILE).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--out {out} holds an unreadable {META_FILE} ({e}); delete {out} or choose "
                             "another --out") from e
        if existing.get("settings") == settings and existing.get("format_version") == FORMAT_VERSION:
            return existing
        if existing.get("settings") == settings:
            raise ValueError(f"--out {out} holds this corpus in format_version="
                             f"{existing.get('format_version')!r}, this code writes {FORMAT_VERSION}; delete "
                             f"{out} and re-run prepare")
        old = existing.get("settings") or {}
        diff = "; ".join(f"{k}: {old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v)
        raise ValueError(f"--out {out} already holds a different prepared corpus ({diff}); choose another "
                         f"--out or delete {out}")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty but holds no prepared corpus ({META_FILE} "
                         "missing); choose an empty or new --out directory")
    return None


def prepare(lang: str, inputs: list[str], out_dir: str, *, vocab_size: int = 50000,
            character_coverage: float = 0.9998, sample_sentences: int = 2_000_000,
            workers: int | None = None, shard_tokens: int = 100_000_000, seed: int = 0,
            model_type: str = "unigram",
            spm_model: str | None = None, progress: bool = True, heldout: float = 0.0,
            seq_lens: tuple[int, ...] = ()) -> dict:
    """Prepare the `lang` corpus from `inputs` into `out_dir`; returns its meta.json content.

    With `spm_model=` the given SentencePiece model is copied and used (its own size wins over
    `vocab_size`); otherwise one of `vocab_size` pieces (fewer, with a warning, where the corpus cannot
    support that many) is trained on a sample. `heldout`: the fraction of lines kept out of training
    (`is_heldout`), written to heldout.txt. `seq_lens`: pack the corpus into MLM blocks of these lengths and
    write their caches (mm_ds/data/blocks.py), also into a corpus prepared before, so that no training stage
    packs them at its start."""
    _check_arguments(lang, shard_tokens, character_coverage, sample_sentences, model_type, seq_lens, heldout,
                     vocab_size, spm_model)
    if spm_model is not None:
        if not os.path.isfile(spm_model):
            raise FileNotFoundError(f"tokenizer {spm_model} does not exist: prepare reuses this file (spm_model) "
                                    f"instead of training one; name an existing SentencePiece model or tokenizer.json")
        spm_model = os.path.abspath(spm_model)
        vocab_size = check_tokenizer(Path(spm_model))
    dtype = shard_dtype(vocab_size)  # raises before any work when no shard dtype can hold the ids
    sources = resolve_inputs(inputs)
    workers = max(1, workers if workers is not None else len(os.sched_getaffinity(0)))
    out = Path(os.path.abspath(out_dir))
    settings = {"lang": lang, "inputs": [s.describe() for s in sources], "vocab_size": vocab_size,
                "character_coverage": character_coverage, "sample_sentences": sample_sentences,
                "seed": seed, "spm_model": spm_model, "shard_tokens": shard_tokens, "model_type": model_type}
    if heldout:  # only when asked: a corpus prepared before held-out slices existed keeps its settings
        settings["heldout"] = heldout
    existing = _check_out_dir(out, settings)
    if existing is not None:
        _log(progress, f"{out} already holds this corpus ({existing['num_tokens']} tokens)")
        _pack_blocks(out, seq_lens, progress)
        return existing

    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)  # left by an interrupted run with no way to resume it
    tmp.mkdir(parents=True)
    try:
        meta = _prepare_into(tmp, lang, sources, settings, dtype, vocab_size, character_coverage,
                             sample_sentences, workers, shard_tokens, seed, spm_model, progress)
        if out.is_dir():
            out.rmdir()  # checked empty above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _pack_blocks(out, seq_lens, progress)
    return meta


def _check_arguments(lang: str, shard_tokens: int, character_coverage: float, sample_sentences: int,
                     model_type: str, seq_lens: tuple[int, ...], heldout: float, vocab_size: int,
                     spm_model: str | None) -> None:
    """`prepare`'s arguments checked before any work, in order, each error naming its flag."""
    if not lang or "/" in lang:
        raise ValueError(f"--lang {lang!r} must be a language code such as 'de'")
    if shard_tokens < 1:
        raise ValueError(f"--shard-tokens must be positive, got {shard_tokens}")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(f"--character-coverage must be in (0, 1], got {character_coverage}")
    if sample_sentences < 1:
        raise ValueError(f"--sample-sentences must be positive, got {sample_sentences}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"--model-type {model_type!r}: choose one of {', '.join(MODEL_TYPES)}")
    if any(n < 2 for n in seq_lens):
        raise ValueError(f"--seq-len {' '.join(map(str, seq_lens))}: a block needs at least 2 tokens (<s> and one)")
    if not 0.0 <= heldout < 1.0:
        raise ValueError(f"--heldout {heldout} must be a fraction of the lines in [0, 1), e.g. 0.01 (0: none)")
    if spm_model is None and vocab_size <= len(tokens.SPECIAL_IDS):
        raise ValueError(f"--vocab-size {vocab_size} leaves no room beyond the {len(tokens.SPECIAL_IDS)} "
                         "special tokens; pass a larger --vocab-size")


def _pack_blocks(out: Path, seq_lens: tuple[int, ...], progress: bool) -> None:
    corpus = TokenCorpus(out) if seq_lens else None
    for seq_len in seq_lens:
        _log(progress, f"packing MLM blocks of {seq_len} tokens ({cache_file(corpus, seq_len).name})")
        write_cache(corpus, seq_len)


def _prepare_into(tmp: Path, lang: str, sources: list[InputSource], settings: dict, dtype: np.dtype,
                  vocab_size: int, character_coverage: float, sample_sentences: int, workers: int,
                  shard_tokens: int, seed: int, spm_model: str | None, progress: bool) -> dict:
    """Steps 1-3 into `tmp`: the tokenizer (reused, or trained on a sample), the shards, meta.json last."""
    if spm_model is not None:
        model_path, sampled = _reuse_tokenizer(tmp, spm_model), 0
    else:
        model_path, sampled, reached = _train_tokenizer(tmp, sources, settings, vocab_size, character_coverage,
                                                        sample_sentences, workers, seed, progress)
        if reached < vocab_size:
            print(f"warning: the {lang} corpus supports only {reached} of the {vocab_size} pieces asked for "
                  "(--vocab-size); using the smaller vocabulary, recorded in meta.json", file=sys.stderr)
            vocab_size, dtype = reached, shard_dtype(reached)
    shards, skipped, held = _encode_shards(tmp, lang, sources, settings, model_path, dtype, workers, shard_tokens,
                                           progress)
    num_lines = sum(s["num_lines"] for s in shards)
    if num_lines == 0:
        raise ValueError(f"inputs {settings['inputs']} contain no non-blank UTF-8 line; nothing to prepare")
    if skipped:
        print(f"warning: skipped {skipped} input lines that are not UTF-8 text (undecodable, or with control "
              f"bytes such as NUL)", file=sys.stderr)
    meta = {
        "format_version": FORMAT_VERSION, "lang": lang, "vocab_size": vocab_size, "dtype": dtype.name,
        "num_lines": num_lines, "num_tokens": sum(s["num_tokens"] for s in shards),
        "num_documents": sum(s["num_documents"] for s in shards), "skipped_lines": skipped,
        "inputs": settings["inputs"], "spm_model": model_path.name, "spm_model_source": spm_model,
        "sample_sentences_used": sampled, "special_ids": dict(zip(tokens.SPECIAL_PIECES, tokens.SPECIAL_IDS)),
        "settings": settings, "shards": shards,
    }
    if "heldout" in settings:
        meta["heldout"] = {"file": HELDOUT_FILE, "fraction": settings["heldout"], "lines": held, "rule": HELDOUT_RULE}
    tmp_meta = tmp / (META_FILE + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp_meta, tmp / META_FILE)
    _log(progress, f"prepared {lang}: {meta['num_lines']} lines, {meta['num_tokens']} tokens, "
                   f"{meta['num_documents']} documents in {len(shards)} shard(s)")
    return meta


def _reuse_tokenizer(tmp: Path, spm_model: str) -> Path:
    """Step 1 with `spm_model=`: the given tokenizer (and its .vocab beside it) copied into the corpus."""
    model_path = tmp / SPM_MODEL_FILE
    if is_tokenizer_json(spm_model):  # named as what it is: TokenCorpus finds it through meta.json
        model_path = tmp / TOKENIZER_JSON
    shutil.copyfile(spm_model, model_path)
    vocab_src = Path(spm_model).with_suffix(".vocab")
    if vocab_src.is_file():
        shutil.copyfile(vocab_src, tmp / SPM_VOCAB_FILE)
    return model_path


def _train_tokenizer(tmp: Path, sources: list[InputSource], settings: dict, vocab_size: int,
                     character_coverage: float, sample_sentences: int, workers: int, seed: int,
                     progress: bool) -> tuple[Path, int, int]:
    """Steps 1-2: SentencePiece trained on a sample of the lines (never a held-out one); returns (its model, the
    lines sampled, the vocabulary it reached)."""
    model_path = tmp / SPM_MODEL_FILE
    sample, seen = reservoir_sample(sources, sample_sentences, seed, progress, exclude=_held_out(settings))
    if not sample:
        raise ValueError(f"inputs {settings['inputs']} contain no non-blank UTF-8 line; nothing to "
                         "prepare, check --input")
    _log(progress, f"training SentencePiece ({vocab_size} pieces) on {len(sample)} of {seen} lines")
    train_spm(sample, tmp / "spm", vocab_size, character_coverage, workers, seed, settings["model_type"])
    return model_path, len(sample), check_spm(model_path)


def _encode_shards(tmp: Path, lang: str, sources: list[InputSource], settings: dict, model_path: Path,
                   dtype: np.dtype, workers: int, shard_tokens: int, progress: bool) -> tuple[list[dict], int, int]:
    """Step 3: every line into shards in `tmp` (a held-out one into heldout.txt instead); returns (the shards, the
    lines skipped as not text, the lines held out). An input that turns out not to be text is refused."""
    writer = ShardWriter(tmp, dtype, shard_tokens)
    skipped, new_doc, held = 0, True, 0
    text, not_text = [0] * len(sources), [0] * len(sources)  # non-blank lines per input
    total = total_bytes(sources)
    held_path = tmp / HELDOUT_FILE if "heldout" in settings else os.devnull
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"encode {lang}", disable=not progress,
              file=sys.stderr) as bar, open(held_path, "w", encoding="utf-8") as held_out:
        for r, first, i in encoded_chunks(sources, str(model_path), dtype, workers, _held_out(settings)):
            text[i] += len(r.lengths) + len(r.heldout)
            not_text[i] += r.skipped
            held_out.writelines(line + "\n" for line in r.heldout)
            held += len(r.heldout)
            # A document opens at each input's first line and after blank lines, also across chunks.
            new_doc = new_doc or first
            doc_starts = r.doc_starts
            if len(r.lengths):
                if new_doc and (len(doc_starts) == 0 or doc_starts[0] != 0):
                    doc_starts = np.concatenate([[0], doc_starts])
                new_doc = r.trailing_blank
            else:
                new_doc = new_doc or r.trailing_blank
            writer.add(r.ids, r.lengths, doc_starts)
            skipped += r.skipped
            bar.update(r.source_bytes)
    shards = writer.finish()
    for src, good, bad in zip(sources, text, not_text):  # a file whose head was text, then not
        if error := not_text_error(src.describe(), good + bad, bad, "in the whole file"):
            raise error
    return shards, skipped, held


def _log(enabled: bool, msg: str) -> None:
    if enabled:
        print(msg, file=sys.stderr)


# ----------------------------------------------------------------------------------------------- decode

def decode_shard_lines(corpus_dir: str | Path, start: int = 0, stop: int | None = None, *,
                       doc_breaks: bool = True, batch_lines: int = 4096) -> Iterator[str]:
    """Decode lines [start, stop) back to text; with `doc_breaks`, yield '' before each line that begins
    a document (except the first line yielded), reproducing the CC-100 layout of the inputs."""
    corpus = TokenCorpus(corpus_dir)
    decode = decoder(corpus.spm_model)
    stop = corpus.num_lines if stop is None else min(stop, corpus.num_lines)
    doc_start = np.zeros(corpus.num_lines, dtype=bool)
    doc_start[corpus.document_starts()] = True
    for lo in range(start, stop, batch_lines):
        hi = min(lo + batch_lines, stop)
        texts = decode([corpus.line(i)[:-1].tolist() for i in range(lo, hi)])  # drop the EOS
        for i, text in zip(range(lo, hi), texts):
            if doc_breaks and doc_start[i] and i != start:
                yield ""
            yield text

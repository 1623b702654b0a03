"""`mm-ds prepare`: stream raw text, train a SentencePiece unigram model, encode into token shards.

Inputs (`inputs=`), any mix of:
  * file paths or glob patterns of UTF-8 text, optionally `.gz`, `.xz` or `.bz2` compressed, in CC-100
    layout: one paragraph/sentence per line, a blank line between documents. Every input file also starts a
    new document.
  * `hf:NAME[:CONFIG][:SPLIT][:COLUMN]` - a Hugging Face `datasets` source, streamed (needs network);
    SPLIT defaults to `train`, COLUMN to `text`, empty fields take the default (`hf:cc100::train:text`).
  * `hf-disk:PATH[:SPLIT][:COLUMN]` - a dataset saved with `Dataset.save_to_disk` (offline; what the tests
    use). Each row of a `datasets` source is one document; newlines inside a row separate its lines.

Steps, all streaming (the corpus is never held in memory):
  1. Sample: one pass draws a deterministic reservoir sample of `sample_sentences` non-blank lines
     (vectorised Algorithm R, seeded by `seed`), skipped when `spm_model=` reuses a model.
  2. Train SentencePiece on the sample: unigram (as XLM-R), nmt_nfkc normalisation, ids fixed by
     mm_ds.tokens (<s>=0 <pad>=1 </s>=2 <unk>=3, user-defined <mask>=4) so special ids line up across
     languages. The vocabulary size is an upper bound (hard_vocab_limit=False): a corpus too small to
     reach it gets the largest vocabulary SentencePiece can build, with a warning; meta.json records the
     real size, and models take their vocab_size from the tokenizer.
  3. Encode: a process pool over ~1 MiB chunks of whole lines; each worker loads the model once and
     encodes a chunk with one batched `encode` call; the parent only reads, dispatches and appends numpy
     arrays to shards of about `shard_tokens` tokens (cut at line boundaries).

Every non-blank line becomes its ids followed by EOS; a line that encodes to no token (empty, whitespace)
is blank, i.e. a document boundary. Lines that are not valid UTF-8 are skipped and counted
(`skipped_lines` in meta.json). `datasets` sources are streamed twice (sample, then encode).

Everything is written into `<out_dir>.partial/` and renamed to `out_dir` at the end, meta.json last, so
an interrupted run never leaves a directory that looks complete. Re-running with the same settings
returns the existing corpus; different settings into the same directory are refused. The on-disk format
is documented in mm_ds.data.shards.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import json
import lzma
import multiprocessing as mp
import os
import shutil
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from mm_ds import tokens
from mm_ds.data.shards import (FORMAT_VERSION, META_FILE, SPM_MODEL_FILE, SPM_VOCAB_FILE, TokenCorpus,
                               shard_dtype, shard_files)

CHUNK_BYTES = 1 << 20  # per worker task: large enough to amortise IPC, small enough to keep 2 cores busy
MAX_SAMPLE_LINE_BYTES = 8192  # also SentencePiece's max_sentence_length: longer lines are not sampled
_DECOMPRESSORS = {".gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"), ".xz": lzma.LZMAFile,
                  ".bz2": bz2.BZ2File}  # each wraps an open binary file, so progress can follow raw.tell()


# ----------------------------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class _Source:
    """One resolved input: a local file, or a `datasets` spec (kind 'hf' / 'hf-disk')."""
    kind: str  # "file" | "hf" | "hf-disk"
    path: str  # file path, dataset name or dataset directory
    config: str | None = None
    split: str = "train"
    column: str = "text"

    def describe(self) -> str:
        if self.kind == "file":
            return self.path
        return f"{self.kind}:{self.path}:{self.config or ''}:{self.split}:{self.column}"

    def size(self) -> int:
        return os.path.getsize(self.path) if self.kind == "file" else 0

def _resolve_inputs(inputs: list[str]) -> list[_Source]:
    """Expand globs and parse dataset specs; fail on anything missing or empty before work starts."""
    if not inputs:
        raise ValueError("no inputs given; pass --input with text files, globs or hf:NAME specs")
    sources: list[_Source] = []
    for spec in inputs:
        if spec.startswith("hf:"):
            name, config, split, column = (spec[3:].split(":") + ["", "", ""])[:4]
            if not name:
                raise ValueError(f"input {spec!r}: expected hf:NAME[:CONFIG][:SPLIT][:COLUMN]")
            sources.append(_Source("hf", name, config or None, split or "train", column or "text"))
        elif spec.startswith("hf-disk:"):
            path, split, column = (spec[8:].split(":") + ["", ""])[:3]
            if not os.path.isdir(path):
                raise FileNotFoundError(f"input {spec!r}: {path} is not a directory saved with "
                                        "datasets' save_to_disk")
            sources.append(_Source("hf-disk", path, None, split or "train", column or "text"))
        else:
            paths = sorted(glob.glob(os.path.expanduser(spec))) if glob.has_magic(spec) else [spec]
            if not paths:
                raise FileNotFoundError(f"input pattern {spec!r} matches no file; check --input")
            for p in paths:
                if not os.path.isfile(p):
                    raise FileNotFoundError(f"input file {p} does not exist; check --input")
                if os.path.getsize(p) == 0:
                    raise ValueError(f"input file {p} is empty; remove it from --input")
                sources.append(_Source("file", os.path.abspath(p)))
    return sources


def _file_chunks(path: str, chunk_bytes: int) -> Iterator[tuple[bytes, bool, int]]:
    """(block of whole lines, starts a new input, compressed bytes consumed) for one file."""
    opener = _DECOMPRESSORS.get(Path(path).suffix)
    with open(path, "rb") as raw:
        stream = opener(raw) if opener else raw
        first, pos = True, 0
        try:
            while block := stream.read(chunk_bytes):
                if not block.endswith(b"\n"):
                    block += stream.readline()  # never cut a line between two chunks
                new_pos = raw.tell()
                yield block, first, new_pos - pos
                first, pos = False, new_pos
        except (EOFError, OSError, lzma.LZMAError) as e:
            raise ValueError(f"input file {path} cannot be read/decompressed ({e}); "
                             "fix or remove it from --input") from e


def _dataset_rows(src: _Source) -> Iterator[str]:
    import datasets  # only needed for hf inputs; keeps `mm-ds prepare` on files import-light

    if src.kind == "hf-disk":
        ds = datasets.load_from_disk(src.path)
        if isinstance(ds, datasets.DatasetDict):
            if src.split not in ds:
                raise ValueError(f"{src.describe()}: split {src.split!r} not in {list(ds)}")
            ds = ds[src.split]
    else:
        try:
            ds = datasets.load_dataset(src.path, src.config, split=src.split, streaming=True)
        except Exception as e:  # datasets raises many types (network, missing config, bad split)
            raise ValueError(f"input {src.describe()}: cannot load it ({type(e).__name__}: {e}); hf: inputs "
                             "need network access, or save the dataset and pass hf-disk:PATH") from e
    columns = ds.column_names
    if columns is not None and src.column not in columns:
        raise ValueError(f"{src.describe()}: no column {src.column!r} (columns: {columns}); "
                         "name it as the last field of the spec")
    for row in ds:
        yield row[src.column] or ""


def _dataset_chunks(src: _Source, chunk_bytes: int) -> Iterator[tuple[bytes, bool, int]]:
    """Rows become documents in CC-100 layout (row lines, then a blank line), batched into blocks."""
    parts: list[bytes] = []
    size, first = 0, True
    for text in _dataset_rows(src):
        data = text.strip("\n").encode("utf-8", "surrogatepass") + b"\n\n"
        parts.append(data)
        size += len(data)
        if size >= chunk_bytes:
            yield b"".join(parts), first, size
            parts, size, first = [], 0, False
    if parts:
        yield b"".join(parts), first, size


def _total_bytes(sources: list[_Source]) -> int | None:
    """Progress-bar total: input file bytes (compressed, as read); unknown with `datasets` sources."""
    return sum(s.size() for s in sources) if all(s.kind == "file" for s in sources) else None


def _chunks(sources: list[_Source], chunk_bytes: int) -> Iterator[tuple[bytes, bool, int]]:
    for src in sources:
        yield from (_file_chunks(src.path, chunk_bytes) if src.kind == "file"
                    else _dataset_chunks(src, chunk_bytes))


def _split_lines(block: bytes) -> tuple[list[str], int]:
    """Lines of a block, unstripped; undecodable lines are dropped and counted."""
    if block.endswith(b"\n"):
        block = block[:-1]  # the final newline terminates the last line, it does not open a blank one
    try:
        return block.decode("utf-8").split("\n"), 0
    except UnicodeDecodeError:
        lines, bad = [], 0
        for raw in block.split(b"\n"):
            try:
                lines.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad += 1
        return lines, bad


# ----------------------------------------------------------------------------------------------- sample

def _sample_sentences(sources: list[_Source], k: int, seed: int, progress: bool) -> tuple[list[str], int]:
    """Deterministic reservoir sample (Algorithm R, vectorised per chunk) of non-blank lines.

    Returns (sample in corpus order of acceptance, number of non-blank lines seen)."""
    rng = np.random.default_rng([seed, 0x5A3])
    reservoir: list[bytes] = []
    seen = 0
    total = _total_bytes(sources)
    with tqdm(total=total, unit="B", unit_scale=True, desc="sample", disable=not progress,
              file=sys.stderr) as bar:
        for block, _, consumed in _chunks(sources, CHUNK_BYTES):
            lines = [ln for ln in block.split(b"\n") if ln.strip() and len(ln) <= MAX_SAMPLE_LINE_BYTES]
            fill = min(max(k - len(reservoir), 0), len(lines))
            reservoir.extend(lines[:fill])
            rest = len(lines) - fill
            if rest:
                t = np.arange(seen + fill + 1, seen + len(lines) + 1, dtype=np.float64)
                j = (rng.random(rest) * t).astype(np.int64)  # uniform in [0, t): replace slot j if j < k
                for idx in np.flatnonzero(j < k):
                    reservoir[j[idx]] = lines[fill + idx]
            seen += len(lines)
            bar.update(consumed)
    sample = []
    for line in reservoir:
        try:
            sample.append(line.decode("utf-8").strip())
        except UnicodeDecodeError:
            pass  # counted during encoding, where every line is looked at
    return sample, seen


MODEL_TYPES = ("unigram", "bpe")


def _train_spm(sample: list[str], prefix: Path, vocab_size: int, character_coverage: float,
               threads: int, seed: int, model_type: str = "unigram") -> None:
    # The sample is already bounded and random: SentencePiece must use all of it, in order.
    kwargs = dict(
        model_prefix=str(prefix), model_type=model_type, vocab_size=vocab_size,
        character_coverage=character_coverage, bos_id=tokens.BOS, pad_id=tokens.PAD, eos_id=tokens.EOS,
        unk_id=tokens.UNK, bos_piece="<s>", pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        user_defined_symbols=["<mask>"], input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=MAX_SAMPLE_LINE_BYTES, num_threads=threads, hard_vocab_limit=False,
        minloglevel=2)
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sample), **kwargs)
    except RuntimeError as e:
        raise ValueError(f"SentencePiece training on {len(sample)} sampled lines failed ({e}); check "
                         "--vocab-size and --character-coverage") from e


def _check_spm(path: Path) -> int:
    """Vocabulary size of a model whose special ids match mm_ds.tokens; a clear error otherwise."""
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as e:
        raise ValueError(f"SentencePiece model {path} is unreadable ({e}); pass a valid --spm-model") from e
    got = {"<s>": sp.bos_id(), "<pad>": sp.pad_id(), "</s>": sp.eos_id(), "<unk>": sp.unk_id(),
           "<mask>": sp.piece_to_id("<mask>")}
    want = dict(zip(tokens.SPECIAL_PIECES, tokens.SPECIAL_IDS))
    if got != want:
        raise ValueError(f"SentencePiece model {path} has special ids {got}, this project needs {want} "
                         "(train with bos_id=0 pad_id=1 eos_id=2 unk_id=3 user_defined_symbols=<mask>), "
                         "or omit --spm-model to let prepare train one")
    return sp.get_piece_size()


# ----------------------------------------------------------------------------------------------- encode

@dataclass
class _Encoded:
    ids: np.ndarray  # all lines' ids, each followed by EOS, shard dtype
    lengths: np.ndarray  # int64 tokens per line, EOS included
    doc_starts: np.ndarray  # int64 chunk-local line indices preceded by a blank line in this chunk
    trailing_blank: bool  # the chunk ends with a blank line: the next chunk's first line opens a document
    skipped: int
    source_bytes: int = 0  # compressed bytes consumed, for the progress bar (set by the parent)


class _Encoder:
    """Turns a block of raw lines into shard arrays; one per worker process (loads the model once)."""

    def __init__(self, model_path: str, dtype: str):
        self.sp = spm.SentencePieceProcessor(model_file=model_path)
        self.dtype = np.dtype(dtype)

    def __call__(self, block: bytes) -> _Encoded:
        lines, skipped = _split_lines(block)
        # One batched call; one thread per process, the pool provides the parallelism. SentencePiece
        # strips surrounding whitespace, so a line is blank exactly when it encodes to no token.
        ids = self.sp.encode(lines, out_type=int, num_threads=1)
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        blank = lens == 0
        flat = np.fromiter(chain.from_iterable(ids), dtype=self.dtype, count=int(lens.sum()))
        content = ~blank
        lens = lens[content] + 1
        out = np.empty(int(lens.sum()), dtype=self.dtype)
        is_eos = np.zeros(len(out), dtype=bool)
        is_eos[np.cumsum(lens) - 1] = True
        out[is_eos] = tokens.EOS
        out[~is_eos] = flat
        # Content lines right after a blank line open a document (numbered among content lines).
        opens = content & np.concatenate([[False], blank[:-1]])
        doc_starts = (np.cumsum(content) - 1)[opens]
        return _Encoded(out, lens, doc_starts.astype(np.int64), bool(len(blank) and blank[-1]), skipped)


_WORKER: _Encoder | None = None


def _init_worker(model_path: str, dtype: str) -> None:
    global _WORKER
    _WORKER = _Encoder(model_path, dtype)


def _encode_in_worker(block: bytes) -> _Encoded:
    assert _WORKER is not None
    return _WORKER(block)


def _encoded_chunks(sources: list[_Source], model_path: str, dtype: np.dtype,
                    workers: int) -> Iterator[tuple[_Encoded, bool]]:
    """(encoded chunk, starts a new input) in corpus order, using `workers` processes."""
    if workers <= 1:
        enc = _Encoder(model_path, dtype.str)
        for block, first, consumed in _chunks(sources, CHUNK_BYTES):
            r = enc(block)
            r.source_bytes = consumed
            yield r, first
        return
    # Bounded in-flight window: Pool.imap would read the whole input ahead into memory.
    # fork: workers only run sentencepiece/numpy, and unlike spawn it works from scripts without a
    # `__main__` guard; spawn where fork does not exist.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(model_path, dtype.str)) as pool:
        pending: deque = deque()
        for block, first, consumed in _chunks(sources, CHUNK_BYTES):
            pending.append((pool.apply_async(_encode_in_worker, (block,)), first, consumed))
            if len(pending) >= 3 * workers:
                yield _collect(pending.popleft())
        while pending:
            yield _collect(pending.popleft())


def _collect(item: tuple) -> tuple[_Encoded, bool]:
    result, first, consumed = item
    r = result.get()
    r.source_bytes = consumed
    return r, first


class _ShardWriter:
    """Appends encoded lines to shard files of about `shard_tokens` tokens, cut at line boundaries."""

    def __init__(self, out_dir: Path, dtype: np.dtype, shard_tokens: int):
        self.dir, self.dtype, self.shard_tokens = out_dir, dtype, shard_tokens
        self.shards: list[dict] = []
        self._file = None

    def _open(self) -> None:
        self._name = f"shard_{len(self.shards):05d}"
        self._file = open(shard_files(self.dir, self._name)[0], "wb")
        self._lens: list[np.ndarray] = []
        self._docs: list[np.ndarray] = []
        self._lines = self._tokens = 0

    def _close(self) -> None:
        if self._file is None:
            return
        self._file.close()
        _, idx_path, docs_path = shard_files(self.dir, self._name)
        offsets = np.concatenate([[0], np.cumsum(np.concatenate(self._lens))]).astype(np.int64)
        docs = np.concatenate(self._docs).astype(np.int64)
        np.save(idx_path, offsets)
        np.save(docs_path, docs)
        self.shards.append({"name": self._name, "num_lines": self._lines, "num_tokens": self._tokens,
                            "num_documents": len(docs)})
        self._file = None

    def add(self, ids: np.ndarray, lens: np.ndarray, doc_starts: np.ndarray) -> None:
        """Append lines (`ids` = their concatenated tokens); `doc_starts` are indices into `lens`."""
        ends = np.cumsum(lens)
        line = tok = 0
        while line < len(lens):
            if self._file is None:
                self._open()
            room = self.shard_tokens - self._tokens
            n = int(np.searchsorted(ends[line:] - tok, room, side="right"))
            if n == 0 and self._lines == 0:
                n = 1  # a single line longer than a shard still goes into one shard
            if n == 0:
                self._close()
                continue
            stop_tok = int(ends[line + n - 1])
            ids[tok:stop_tok].tofile(self._file)
            self._lens.append(lens[line:line + n])
            d = doc_starts[(doc_starts >= line) & (doc_starts < line + n)]
            self._docs.append(d - line + self._lines)
            self._lines += n
            self._tokens += stop_tok - tok
            line, tok = line + n, stop_tok

    def finish(self) -> list[dict]:
        self._close()
        return self.shards


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
            spm_model: str | None = None, progress: bool = True) -> dict:
    """Prepare the `lang` corpus from `inputs` into `out_dir`; returns its meta.json content.

    With `spm_model=` the given SentencePiece model is copied and used (its own size wins over
    `vocab_size`); otherwise one of `vocab_size` pieces (fewer, with a warning, where the corpus cannot
    support that many) is trained on a sample."""
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
    if spm_model is None and vocab_size <= len(tokens.SPECIAL_IDS):
        raise ValueError(f"--vocab-size {vocab_size} leaves no room beyond the {len(tokens.SPECIAL_IDS)} "
                         "special tokens; pass a larger --vocab-size")
    if spm_model is not None:
        if not os.path.isfile(spm_model):
            raise FileNotFoundError(f"--spm-model {spm_model} does not exist")
        spm_model = os.path.abspath(spm_model)
        vocab_size = _check_spm(Path(spm_model))
    dtype = shard_dtype(vocab_size)  # raises before any work when no shard dtype can hold the ids
    sources = _resolve_inputs(inputs)
    workers = max(1, workers if workers is not None else len(os.sched_getaffinity(0)))
    out = Path(os.path.abspath(out_dir))
    settings = {"lang": lang, "inputs": [s.describe() for s in sources], "vocab_size": vocab_size,
                "character_coverage": character_coverage, "sample_sentences": sample_sentences,
                "seed": seed, "spm_model": spm_model, "shard_tokens": shard_tokens, "model_type": model_type}
    existing = _check_out_dir(out, settings)
    if existing is not None:
        _log(progress, f"{out} already holds this corpus ({existing['num_tokens']} tokens); nothing to do")
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
    return meta


def _prepare_into(tmp: Path, lang: str, sources: list[_Source], settings: dict, dtype: np.dtype,
                  vocab_size: int, character_coverage: float, sample_sentences: int, workers: int,
                  shard_tokens: int, seed: int, spm_model: str | None, progress: bool) -> dict:
    model_path = tmp / SPM_MODEL_FILE
    sampled = 0
    if spm_model is not None:
        shutil.copyfile(spm_model, model_path)
        vocab_src = Path(spm_model).with_suffix(".vocab")
        if vocab_src.is_file():
            shutil.copyfile(vocab_src, tmp / SPM_VOCAB_FILE)
    else:
        sample, seen = _sample_sentences(sources, sample_sentences, seed, progress)
        if not sample:
            raise ValueError(f"inputs {settings['inputs']} contain no non-blank UTF-8 line; nothing to "
                             "prepare, check --input")
        _log(progress, f"training SentencePiece ({vocab_size} pieces) on {len(sample)} of {seen} lines")
        _train_spm(sample, tmp / "spm", vocab_size, character_coverage, workers, seed, settings["model_type"])
        sampled = len(sample)
        del sample
        reached = _check_spm(model_path)
        if reached < vocab_size:
            print(f"warning: the {lang} corpus supports only {reached} of the {vocab_size} pieces asked for "
                  "(--vocab-size); using the smaller vocabulary, recorded in meta.json", file=sys.stderr)
            vocab_size, dtype = reached, shard_dtype(reached)

    writer = _ShardWriter(tmp, dtype, shard_tokens)
    skipped, new_doc = 0, True
    total = _total_bytes(sources)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"encode {lang}", disable=not progress,
              file=sys.stderr) as bar:
        for r, first in _encoded_chunks(sources, str(model_path), dtype, workers):
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
    num_lines = sum(s["num_lines"] for s in shards)
    if num_lines == 0:
        raise ValueError(f"inputs {settings['inputs']} contain no non-blank UTF-8 line; nothing to prepare")
    if skipped:
        print(f"warning: skipped {skipped} undecodable (non-UTF-8) input lines", file=sys.stderr)
    meta = {
        "format_version": FORMAT_VERSION, "lang": lang, "vocab_size": vocab_size, "dtype": dtype.name,
        "num_lines": num_lines, "num_tokens": sum(s["num_tokens"] for s in shards),
        "num_documents": sum(s["num_documents"] for s in shards), "skipped_lines": skipped,
        "inputs": settings["inputs"], "spm_model": SPM_MODEL_FILE, "spm_model_source": spm_model,
        "sample_sentences_used": sampled, "special_ids": dict(zip(tokens.SPECIAL_PIECES, tokens.SPECIAL_IDS)),
        "settings": settings, "shards": shards,
    }
    tmp_meta = tmp / (META_FILE + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp_meta, tmp / META_FILE)
    _log(progress, f"prepared {lang}: {meta['num_lines']} lines, {meta['num_tokens']} tokens, "
                   f"{meta['num_documents']} documents in {len(shards)} shard(s)")
    return meta


def _log(enabled: bool, msg: str) -> None:
    if enabled:
        print(msg, file=sys.stderr)


# ----------------------------------------------------------------------------------------------- decode

def decode_shard_lines(corpus_dir: str | Path, start: int = 0, stop: int | None = None, *,
                       doc_breaks: bool = True, batch_lines: int = 4096) -> Iterator[str]:
    """Decode lines [start, stop) back to text; with `doc_breaks`, yield '' before each line that begins
    a document (except the first line yielded), reproducing the CC-100 layout of the inputs."""
    corpus = TokenCorpus(corpus_dir)
    sp = spm.SentencePieceProcessor(model_file=str(corpus.spm_model))
    stop = corpus.num_lines if stop is None else min(stop, corpus.num_lines)
    doc_start = np.zeros(corpus.num_lines, dtype=bool)
    doc_start[corpus.document_starts()] = True
    for lo in range(start, stop, batch_lines):
        hi = min(lo + batch_lines, stop)
        texts = sp.decode([corpus.line(i)[:-1].tolist() for i in range(lo, hi)])  # drop the EOS
        for i, text in zip(range(lo, hi), texts):
            if doc_breaks and doc_start[i] and i != start:
                yield ""
            yield text

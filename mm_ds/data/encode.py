"""Step 3 of `mm-ds prepare` (mm_ds.data.corpus): raw lines -> token shards.

~1 MiB chunks of whole lines are encoded on `workers` threads, each chunk one batched SentencePiece call that
releases the GIL and returns int32 buffers; this thread splits the next chunks into lines and turns finished ones
into numpy arrays (`ChunkEncoder`), which `ShardWriter` appends to shard files (the format: mm_ds.data.shards).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mm_ds import tokens
from mm_ds.data.inputs import InputSource, chunks, split_lines
from mm_ds.data.shards import shard_files
from mm_ds.data.tokenizer import Encoded, encoder


@dataclass
class EncodedChunk:
    ids: np.ndarray  # all lines' ids, each followed by EOS, shard dtype
    lengths: np.ndarray  # int64 tokens per line, EOS included
    doc_starts: np.ndarray  # int64 chunk-local line indices preceded by a blank line in this chunk
    trailing_blank: bool  # the chunk ends with a blank line: the next chunk's first line opens a document
    skipped: int
    heldout: list[str]  # the chunk's held-out lines, stripped, in order
    source_bytes: int = 0  # compressed bytes consumed, for the progress bar (set by `encoded_chunks`)


class ChunkEncoder:
    """Turns a block of raw lines into shard arrays: `split` (Python), `encode` (the tokenizer, GIL released),
    `arrays` (numpy)."""

    def __init__(self, model_path: str, dtype: str, held_out: Callable[[bytes], bool] | None = None):
        self.encode = encoder(model_path)  # one thread: `encoded_chunks` runs one call per worker thread
        self.dtype = np.dtype(dtype)
        self.held_out = held_out  # whether a raw line is held out (mm_ds.data.corpus.is_heldout); None: none are

    def __call__(self, block: bytes) -> EncodedChunk:
        lines, skipped, held = self.split(block)
        return self.arrays(self.encode(lines), skipped, held)

    def split(self, block: bytes) -> tuple[list[str], int, list[str]]:
        """(lines to encode, lines skipped as not text, held-out lines stripped)."""
        lines, skipped = split_lines(block)
        held = []
        if self.held_out is not None:  # taken out before encoding: a held-out line after a blank one leaves
            keep = []                    # the next line opening the document, as it would have
            for line in lines:
                raw = line.encode("utf-8")
                (held if self.held_out(raw) else keep).append(line)
            lines, held = keep, [line.strip() for line in held]
        return lines, skipped, held

    def arrays(self, encoded: Encoded, skipped: int, held: list[str]) -> EncodedChunk:
        """The encoded lines as shard arrays. Surrounding whitespace was dropped by the tokenizer, so a line is
        blank exactly when it encoded to no token."""
        flat, lens = encoded
        blank = lens == 0
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
        return EncodedChunk(out, lens, doc_starts.astype(np.int64), bool(len(blank) and blank[-1]), skipped, held)


def _source_chunks(sources: list[InputSource]) -> Iterator[tuple[bytes, bool, int, int]]:
    """`chunks`, each with the index of the input it comes from."""
    for i, src in enumerate(sources):
        for block, first, consumed in chunks([src]):
            yield block, first, consumed, i


def encoded_chunks(sources: list[InputSource], model_path: str, dtype: np.dtype, workers: int,
                   held_out: Callable[[bytes], bool] | None = None) -> Iterator[tuple[EncodedChunk, bool, int]]:
    """(encoded chunk, starts a new input, index of that input) in corpus order, encoding on `workers` threads."""
    enc = ChunkEncoder(model_path, dtype.str, held_out)
    if workers <= 1:
        for block, first, consumed, i in _source_chunks(sources):
            r = enc(block)
            r.source_bytes = consumed
            yield r, first, i
        return
    # Each worker thread encodes whole chunks (GIL released) while this one splits the next chunks into
    # lines, turns finished ones into arrays and the caller writes them; 2 chunks per worker in flight.
    with ThreadPoolExecutor(workers, thread_name_prefix="mm-ds-encode") as pool:
        pending: deque = deque()
        for block, first, consumed, i in _source_chunks(sources):
            lines, skipped, held = enc.split(block)
            pending.append((pool.submit(enc.encode, lines), skipped, held, first, consumed, i))
            if len(pending) >= 2 * workers:
                yield _collect(enc, pending.popleft())
        while pending:
            yield _collect(enc, pending.popleft())


def _collect(enc: ChunkEncoder, item: tuple) -> tuple[EncodedChunk, bool, int]:
    encoded, skipped, held, first, consumed, i = item
    r = enc.arrays(encoded.result(), skipped, held)
    r.source_bytes = consumed
    return r, first, i


class ShardWriter:
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

"""Reading a prepared corpus: memory-mapped token shards plus their line and document index.

On-disk format (format_version 1), written by `mm_ds.data.corpus.prepare`:

    <corpus_dir>/
      meta.json              written last; its presence means the corpus is complete (see below)
      spm.model, spm.vocab   the SentencePiece tokenizer (special ids as in mm_ds.tokens)
      shard_00000.bin        token ids of consecutive lines, raw little-endian `dtype` (uint16 when the
                             vocabulary fits, else uint32); every line is its ids followed by EOS
      shard_00000.idx.npy    int64 (num_lines + 1,): token offset of each line start, then the total
      shard_00000.docs.npy   int64: shard-local indices of lines that begin a document (blank line or new
                             input before them); a shard whose first line continues a document from the
                             previous shard does not list 0
      blocks_v1_s512.npy     packed MLM block spans per sequence length (mm_ds.data.blocks), memory-mapped

meta.json keys: format_version, lang, vocab_size, dtype, num_lines, num_tokens, num_documents,
skipped_lines (undecodable input lines), inputs, spm_model (file name inside the corpus dir),
spm_model_source (the reused model, or null when prepare trained one), sample_sentences_used, settings
(the prepare arguments, used to refuse overwriting a different corpus), shards (name, num_lines,
num_tokens, num_documents per shard, in order).

Lines are numbered globally in shard order; documents are recovered from the docs arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPM_MODEL_FILE = "spm.model"
SPM_VOCAB_FILE = "spm.vocab"


def shard_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every id of a `vocab_size` vocabulary."""
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    if vocab_size <= np.iinfo(np.uint32).max + 1:
        return np.dtype(np.uint32)
    raise ValueError(f"vocab_size={vocab_size} does not fit the largest shard dtype (uint32); "
                     "pass a smaller --vocab-size")


def shard_files(corpus_dir: Path, name: str) -> tuple[Path, Path, Path]:
    """(tokens .bin, line offsets .idx.npy, document starts .docs.npy) of shard `name`."""
    return corpus_dir / f"{name}.bin", corpus_dir / f"{name}.idx.npy", corpus_dir / f"{name}.docs.npy"


def read_meta(corpus_dir: str | Path) -> dict:
    """meta.json of a complete corpus, checked for format version; clear errors otherwise."""
    corpus_dir = Path(corpus_dir)
    path = corpus_dir / META_FILE
    if not path.is_file():
        hint = " (an interrupted prepare left it incomplete)" if corpus_dir.is_dir() else ""
        raise FileNotFoundError(f"{corpus_dir} is not a prepared corpus: {path} is missing{hint}; "
                                f"run `mm-ds prepare --out {corpus_dir} ...` first")
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is unreadable ({e}); delete {corpus_dir} and re-run `mm-ds prepare`") from e
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version={version!r}, this code reads {FORMAT_VERSION}; "
                         f"re-run `mm-ds prepare` into a fresh --out directory")
    missing = [k for k in ("lang", "vocab_size", "dtype", "num_lines", "num_tokens", "shards", "spm_model")
               if k not in meta]
    if missing:
        raise ValueError(f"{path} lacks keys {missing}; the corpus is corrupt, re-run `mm-ds prepare`")
    return meta


class TokenCorpus:
    """All shards of a prepared corpus, memory-mapped (tokens, line offsets, document starts: a rank holds none of
    them in its own memory); lines are indexed globally in shard order."""

    def __init__(self, corpus_dir: str | Path):
        self.dir = Path(corpus_dir)
        self.meta = read_meta(self.dir)
        self.lang: str = self.meta["lang"]
        self.vocab_size: int = int(self.meta["vocab_size"])
        self.dtype = np.dtype(self.meta["dtype"])
        self.spm_model = self.dir / self.meta["spm_model"]
        if not self.spm_model.is_file():
            raise FileNotFoundError(f"{self.spm_model} is missing from corpus {self.dir}; "
                                    "re-run `mm-ds prepare`")
        self._tokens: list[np.memmap] = []
        self._offsets: list[np.ndarray] = []  # per shard, int64 (n_lines + 1,)
        self._docs: list[np.ndarray] = []
        for entry in self.meta["shards"]:
            self._open_shard(entry)
        # Global line / token numbering: shard s holds lines [line_base[s], line_base[s+1]).
        self.line_base = np.cumsum([0] + [len(o) - 1 for o in self._offsets]).astype(np.int64)
        self.token_base = np.cumsum([0] + [int(o[-1]) for o in self._offsets]).astype(np.int64)
        if self.line_base[-1] != self.meta["num_lines"] or self.token_base[-1] != self.meta["num_tokens"]:
            raise ValueError(f"{self.dir}: shards hold {self.line_base[-1]} lines / {self.token_base[-1]} "
                             f"tokens but meta.json says {self.meta['num_lines']} / {self.meta['num_tokens']}; "
                             "the corpus is corrupt, re-run `mm-ds prepare`")

    def _open_shard(self, entry: dict) -> None:
        bin_path, idx_path, docs_path = shard_files(self.dir, entry["name"])
        for p in (bin_path, idx_path, docs_path):
            if not p.is_file():
                raise FileNotFoundError(f"corpus shard file {p} is missing; the corpus is incomplete, "
                                        "re-run `mm-ds prepare`")
        expected = entry["num_tokens"] * self.dtype.itemsize
        if bin_path.stat().st_size != expected:
            raise ValueError(f"{bin_path} has {bin_path.stat().st_size} bytes, meta.json implies {expected}; "
                             "the corpus is corrupt or was modified, re-run `mm-ds prepare`")
        offsets = np.load(idx_path, mmap_mode="r")
        if len(offsets) != entry["num_lines"] + 1 or offsets[0] != 0 or offsets[-1] != entry["num_tokens"]:
            raise ValueError(f"{idx_path} does not match meta.json ({entry}); re-run `mm-ds prepare`")
        self._tokens.append(np.memmap(bin_path, dtype=self.dtype, mode="r"))
        self._offsets.append(np.asarray(offsets))
        self._docs.append(np.load(docs_path, mmap_mode="r"))

    @property
    def num_lines(self) -> int:
        return int(self.line_base[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_base[-1])

    @property
    def num_shards(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return self.num_lines

    def line(self, i: int) -> np.ndarray:
        """Token ids of global line `i`, trailing EOS included (a read-only view into the memmap)."""
        if not 0 <= i < self.num_lines:
            raise IndexError(f"line {i} out of range for a corpus of {self.num_lines} lines")
        s = int(np.searchsorted(self.line_base, i, side="right") - 1)
        o = self._offsets[s]
        j = i - int(self.line_base[s])
        return self._tokens[s][o[j]:o[j + 1]]

    def shard_offsets(self, s: int) -> np.ndarray:
        """Shard-local token offsets of the lines of shard `s` (num_lines + 1,)."""
        return self._offsets[s]

    def shard_tokens(self, s: int) -> np.memmap:
        return self._tokens[s]

    def span(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) in global token positions; the span must lie inside one shard."""
        s = int(np.searchsorted(self.token_base, start, side="right") - 1)
        base = int(self.token_base[s])
        if stop > self.token_base[s + 1]:
            raise IndexError(f"token span [{start}, {stop}) crosses the end of shard {s}")
        return self._tokens[s][start - base:stop - base]

    def line_lengths(self) -> np.ndarray:
        """Tokens per line (EOS included) for every line, int64 (num_lines,)."""
        return np.concatenate([np.diff(o) for o in self._offsets]) if self._offsets else np.zeros(0, np.int64)

    def document_starts(self) -> np.ndarray:
        """Global indices of the lines that begin a document, ascending; the first is 0."""
        parts = [d + b for d, b in zip(self._docs, self.line_base[:-1])]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    @property
    def num_documents(self) -> int:
        return int(sum(len(d) for d in self._docs))

"""RoBERTa FULL-SENTENCES packing of a prepared corpus into MLM blocks, and the blocks' cache file.

Packing. A block is `<s>` followed by whole consecutive lines (each already ending in `</s>`) while they
fit in `seq_len`; blocks may cross document boundaries (as RoBERTa's FULL-SENTENCES) but not shards. A
line longer than `seq_len - 1` is cut into `seq_len - 1`-token pieces (the last one shorter by one token
if the tail would otherwise be its EOS alone), and its tail starts the next block. The rest of a block is PAD
(mm_ds.data.mlm draws and masks the blocks).

The cache. A corpus's block spans for one `seq_len` live in its directory as `blocks_v{PACKING_VERSION}_s{seq_len}.npy`
(int64 (num_blocks, 2): global token [start, stop), BOS excluded): 16 bytes per block, ~1.9 GB for CC-100 English
at seq_len 512 (docs/multinode.md, "Data start-up").
    written  once per corpus and length, by `write_cache`: `mm-ds prepare --seq-len`, else a stage's rank 0 while
             the other ranks wait (mm_ds/stages/common.py `pack_blocks`). Into a temporary file named for its writer
             (host, pid, random suffix: pids repeat across containers and hosts), created exclusively and renamed
             into place, so writers on several hosts of a shared filesystem never write into one file and a reader
             sees a whole file or none. Temporary files an interrupted writer left are ignored, and the next writer
             removes them once they are `STALE_TMP_S` old (a live writer writes its file within seconds).
    read     memory-mapped (`block_spans`) and checked cheaply (shape, first and last span): a rank touches only the
             pages of the blocks it draws, and the ranks of a node share one copy in the page cache. The full check
             (contiguous spans covering the corpus) is the writer's, which reads the whole file.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from pathlib import Path

import numpy as np

from mm_ds.data.shards import TokenCorpus

PACKING_VERSION = 1  # part of the cache file name: bump when pack_shard changes its output
STALE_TMP_S = 3600  # a writer's temporary file untouched this long belongs to a writer that died
_CHECK_ROWS = 1 << 20  # spans compared per step of the full check (16 MiB): no whole-file temporaries


def pack_shard(offsets: np.ndarray, seq_len: int) -> np.ndarray:
    """Shard-local [start, stop) token spans of FULL-SENTENCES blocks for line offsets `offsets`.

    Greedy: a block takes every next line that still fits in `seq_len - 1` tokens (one slot is <s>)."""
    cap = seq_len - 1
    o = np.asarray(offsets, dtype=np.int64)
    n = len(o) - 1
    if n <= 0:
        return np.zeros((0, 2), dtype=np.int64)
    # furthest[i]: last line boundary reachable from boundary i within one block (vectorised, once).
    furthest = (np.searchsorted(o, o + cap, side="right") - 1).tolist()
    ol = o.tolist()
    spans: list[tuple[int, int]] = []
    i = 0
    while i < n:  # one iteration per block: cheap list indexing, no per-token work
        j = furthest[i]
        if j > i:
            spans.append((ol[i], ol[j]))
            i = j
            continue
        # Line i alone exceeds the block: cut full pieces, then let its tail open the next block. The
        # tail keeps at least one token besides EOS, so that no block is left with nothing to mask.
        p, end = ol[i], ol[i + 1]
        while end - p > cap:
            step = cap - 1 if end - p == cap + 1 and cap > 1 else cap
            spans.append((p, p + step))
            p += step
        j = int(np.searchsorted(o, p + cap, side="right") - 1)
        spans.append((p, ol[j]))
        i = j
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def cache_file(corpus: TokenCorpus, seq_len: int) -> Path:
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len} leaves no room after <s>; use seq_len >= 2")
    return corpus.dir / f"blocks_v{PACKING_VERSION}_s{seq_len}.npy"


def block_spans(corpus: TokenCorpus, seq_len: int) -> np.ndarray:
    """Global token spans (num_blocks, 2) of all blocks, memory-mapped from the cache. Without one (a world of one,
    tests, a corpus whose stage start did not pack it) the corpus is packed here and the cache written; a directory
    that cannot be written leaves the spans in memory."""
    path = cache_file(corpus, seq_len)
    spans = _open(path, corpus.num_tokens)
    return spans if spans is not None else _pack_into(path, corpus, seq_len)


def write_cache(corpus: TokenCorpus, seq_len: int) -> None:
    """The one writer of a launch (or `mm-ds prepare`): pack and publish the cache unless a whole one is there (the
    full check reads it once)."""
    path = cache_file(corpus, seq_len)
    spans = _open(path, corpus.num_tokens)
    if spans is not None and _contiguous(spans):
        return
    if spans is not None:
        print(f"warning: {path} does not match the corpus; recomputing it", file=sys.stderr)
    del spans
    _pack_into(path, corpus, seq_len)


def _open(path: Path, num_tokens: int) -> np.ndarray | None:
    """The cache memory-mapped, when it is there and its shape, first and last spans fit the corpus; else None."""
    try:
        spans = np.load(path, mmap_mode="r")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # a file that is not a whole .npy (written by hand, truncated by a full disk)
        spans = None
    if (spans is not None and spans.dtype == np.int64 and spans.ndim == 2 and spans.shape[1] == 2 and len(spans) > 0
            and spans[0, 0] == 0 and spans[-1, 1] == num_tokens):
        return spans
    print(f"warning: {path} does not match the corpus; recomputing it", file=sys.stderr)
    return None


def _contiguous(spans: np.ndarray) -> bool:
    """Each span starts where the previous one stopped (with `_open`'s check: they cover the corpus exactly)."""
    for lo in range(0, len(spans) - 1, _CHECK_ROWS):
        part = spans[lo:lo + _CHECK_ROWS + 1]
        if not (part[1:, 0] == part[:-1, 1]).all():
            return False
    return True


def _pack_into(path: Path, corpus: TokenCorpus, seq_len: int) -> np.ndarray:
    """Pack the corpus and publish the cache; the spans, memory-mapped from it (in memory when it cannot be
    written: a read-only corpus still works, each process packing it)."""
    parts = [pack_shard(corpus.shard_offsets(s), seq_len) + corpus.token_base[s] for s in range(corpus.num_shards)]
    try:
        _publish(path, parts)
    except OSError as e:
        print(f"warning: cannot cache packed blocks in {corpus.dir} ({e}); every process packs them",
              file=sys.stderr)
        return np.concatenate(parts)
    del parts
    return np.load(path, mmap_mode="r")


def _publish(path: Path, parts: list[np.ndarray]) -> None:
    """Write `parts` (stacked) as the .npy `path`: into this writer's own temporary file, then one rename."""
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "xb") as f:  # exclusive: never another writer's file
        try:
            header = {"descr": np.dtype(np.int64).str, "fortran_order": False,
                      "shape": (sum(len(p) for p in parts), 2)}
            np.lib.format.write_array_header_1_0(f, header)
            for p in parts:  # shard by shard: no second copy of the whole array
                f.write(np.ascontiguousarray(p, dtype=np.int64).data)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # still there only when the rename failed
    _remove_stale(path)


def _remove_stale(path: Path) -> None:
    """Temporary files of `path` whose writer died (untouched for `STALE_TMP_S`); a live one is left alone."""
    for old in path.parent.glob(f"{path.name}.*.tmp"):
        try:
            if time.time() - old.stat().st_mtime > STALE_TMP_S:
                old.unlink()
        except OSError:
            continue  # another writer removed it first, or it is not ours to remove

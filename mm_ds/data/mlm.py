"""MLM pretraining batches: RoBERTa FULL-SENTENCES packing, deterministic order, dynamic masking.

Packing. A block is `<s>` followed by whole consecutive lines (each already ending in `</s>`) while they
fit in `seq_len`; blocks may cross document boundaries (as RoBERTa's FULL-SENTENCES) but not shards. A
line longer than `seq_len - 1` is cut into `seq_len - 1`-token pieces (the last one shorter by one token
if the tail would otherwise be its EOS alone), and its tail starts the next block.
The rest of a block is PAD. Block spans are computed once per `seq_len` and cached in the corpus
directory as `blocks_v1_s{seq_len}.npy` (int64 (num_blocks, 2): global token [start, stop), BOS excluded;
v = PACKING_VERSION).

Order. Sample ids are global (mm_ds.data.order: a step's samples are the same whatever the world size);
sample g is block permutation_e[g % num_blocks] of epoch e = g // num_blocks, the permutation seeded by (seed, e).

Masking. Redrawn every time a block is drawn, from a counter-based hash of (seed, g, position), so a
sample's masks depend on nothing else (rank, batch layout, what was drawn before). Of the non-special
tokens of a block, round(mask_prob * n) are selected (randomised rounding, at least one); of those,
`random_prob` become a random non-special token of the corpus vocabulary, `keep_prob` stay unchanged and
the rest become <mask>.
Special tokens (ids 0..4, mm_ds.tokens) and padding are never selected. A batch also carries the flat
indices of its masked positions, padded to a length fixed by its shape (`masked_positions`), so that the model
finds them without a device-to-host read.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from mm_ds import tokens
from mm_ds.data.order import sample_ids
from mm_ds.data.shards import TokenCorpus

N_SPECIAL = len(tokens.SPECIAL_IDS)
assert tuple(tokens.SPECIAL_IDS) == tuple(range(N_SPECIAL)), "masking assumes special ids 0..N_SPECIAL-1"

PACKING_VERSION = 1  # part of the cache file name: bump when pack_shard changes its output
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAMS = 4  # independent random values per position: selection, 80/10/10 choice, random token, spare


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array: a counter-based RNG, vectorised and stateless."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(h: np.ndarray) -> np.ndarray:
    """uint64 hash -> float64 in [0, 1) from its top 53 bits."""
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# ----------------------------------------------------------------------------------------------- packing

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


def _covers(spans: np.ndarray | None, num_tokens: int) -> bool:
    """Cheap cache check: contiguous spans that cover exactly the corpus tokens."""
    return (spans is not None and spans.ndim == 2 and spans.shape[1] == 2 and len(spans) > 0
            and spans[0, 0] == 0 and spans[-1, 1] == num_tokens and bool((spans[1:, 0] == spans[:-1, 1]).all()))


def block_spans(corpus: TokenCorpus, seq_len: int) -> np.ndarray:
    """Global token spans (num_blocks, 2) of all blocks, read from or written to the corpus cache."""
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len} leaves no room after <s>; use seq_len >= 2")
    path = corpus.dir / f"blocks_v{PACKING_VERSION}_s{seq_len}.npy"
    if path.is_file():
        try:
            spans = np.load(path)
        except (OSError, ValueError):
            spans = None
        if _covers(spans, corpus.num_tokens):
            return spans
        print(f"warning: {path} does not match the corpus; recomputing it", file=sys.stderr)
    spans = np.concatenate([pack_shard(corpus.shard_offsets(s), seq_len) + corpus.token_base[s]
                            for s in range(corpus.num_shards)])
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:  # atomic, so concurrent ranks never read a half-written cache
        with open(tmp, "wb") as f:
            np.save(f, spans)
        os.replace(tmp, path)
    except OSError as e:  # a read-only corpus still works, it just pays the packing each time
        print(f"warning: cannot cache packed blocks in {corpus.dir} ({e})", file=sys.stderr)
        tmp.unlink(missing_ok=True)
    return spans


# ----------------------------------------------------------------------------------------------- batches

class MLMBatches:
    """Deterministic MLM batches over a `TokenCorpus`; see the module docstring for order and masking."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, *, seed: int, mask_prob: float = 0.15,
                 random_prob: float = 0.1, keep_prob: float = 0.1, vocab_size: int):
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"mask_prob={mask_prob} must be in (0, 1)")
        if random_prob < 0 or keep_prob < 0 or random_prob + keep_prob > 1.0:
            raise ValueError(f"random_prob={random_prob} and keep_prob={keep_prob} must be >= 0 and sum "
                             "to at most 1")
        if vocab_size < corpus.vocab_size:
            raise ValueError(f"model vocab_size={vocab_size} is smaller than the corpus vocabulary "
                             f"({corpus.vocab_size}, {corpus.dir}); set the model's vocab_size to at least "
                             f"{corpus.vocab_size}")
        self.corpus, self.seq_len, self.seed = corpus, seq_len, seed
        self.mask_prob, self.random_prob, self.keep_prob = mask_prob, random_prob, keep_prob
        self.vocab_size = vocab_size
        self.spans = block_spans(corpus, seq_len)
        if len(self.spans) == 0:
            raise ValueError(f"corpus {corpus.dir} has no tokens to pack")
        # Blocks never cross shards: map each to its shard once, fetch with plain slices.
        self._shard = (np.searchsorted(corpus.token_base, self.spans[:, 0], side="right") - 1).astype(np.int64)
        self._perms: dict[int, np.ndarray] = {}
        self._seed_key = _mix64(np.array([seed % 2**64], dtype=np.uint64) + _GOLDEN)[0]

    def num_blocks(self) -> int:
        return len(self.spans)

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.arange(self.num_blocks(), dtype=np.int64 if self.num_blocks() >= 2**31 else np.int32)
            np.random.default_rng([self.seed, epoch]).shuffle(perm)
            if len(self._perms) >= 2:  # a batch spans at most two epochs; keep memory to two permutations
                self._perms.pop(min(self._perms))
            self._perms[epoch] = perm
        return perm

    def batch(self, step: int, micro_step: int, rank: int, world_size: int, micro_batch: int,
              grad_accum: int = 1) -> dict:
        """The micro batch `micro_step` of optimizer step `step` for `rank`."""
        return self.samples(sample_ids(step, micro_step, rank, world_size, micro_batch, grad_accum))

    def blocks_of(self, g: np.ndarray) -> np.ndarray:
        """Block index of each global sample id."""
        g = np.asarray(g, dtype=np.int64)
        epoch, pos = np.divmod(g, self.num_blocks())
        out = np.empty(len(g), dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self._permutation(int(e))[pos[sel]]
        return out

    def samples(self, g: np.ndarray) -> dict:
        """Masked batch for global sample ids `g` (B,)."""
        g = np.asarray(g, dtype=np.int64)
        blocks = self.blocks_of(g)
        B, T = len(g), self.seq_len
        ids = np.full((B, T), tokens.PAD, dtype=np.int64)
        ids[:, 0] = tokens.BOS
        for row, b in enumerate(blocks):  # B slices from memmaps; the per-token work is vectorised
            s = self._shard[b]
            base = int(self.corpus.token_base[s])
            start, stop = int(self.spans[b, 0]) - base, int(self.spans[b, 1]) - base
            ids[row, 1:1 + stop - start] = self.corpus.shard_tokens(s)[start:stop]
        input_ids, labels = self._mask(ids, g)
        pad = ids == tokens.PAD
        return {"input_ids": torch.from_numpy(input_ids), "labels": torch.from_numpy(labels),
                "attention_mask": torch.from_numpy(~pad) if pad.any() else None,
                "masked_positions": torch.from_numpy(self.masked_positions(labels))}

    def max_masked(self) -> int:
        """Most positions `_mask` selects in one block: floor(mask_prob x candidates + u) with u < 1, and at
        most seq_len - 1 candidates (never <s>)."""
        return min(int(self.mask_prob * (self.seq_len - 1)) + 1, self.seq_len - 1)

    def masked_positions(self, labels: np.ndarray) -> np.ndarray:
        """Flat indices of the masked positions of `labels` (B, T), ascending, padded to B x `max_masked()`
        with index 0 (row 0's <s>, whose label is ignored): one length for every batch of this shape, so the
        model selects them without asking the device (`RobertaMLM.forward`)."""
        found = np.flatnonzero(labels.reshape(-1) != tokens.IGNORE_INDEX)
        out = np.zeros(labels.shape[0] * self.max_masked(), dtype=np.int64)
        out[:len(found)] = found
        return out

    def _mask(self, ids: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        B, T = ids.shape
        row_key = _mix64(self._seed_key ^ _mix64(g.astype(np.uint64) + _GOLDEN))  # (B,)
        counter = (np.arange(T, dtype=np.uint64) * np.uint64(_STREAMS) + np.uint64(1)) * _GOLDEN  # (T,)
        h = [_mix64(row_key[:, None] + counter[None, :] + np.uint64(k)) for k in range(3)]  # 3 x (B, T)
        candidate = ids >= N_SPECIAL  # never specials (incl. BOS/EOS/UNK/MASK) nor PAD
        n_cand = candidate.sum(axis=1)
        # Probabilistic rounding keeps the expected rate exact for short blocks; at least one target.
        u_row = _uniform(_mix64(row_key ^ np.uint64(0xD1B54A32D192ED03)))
        n_sel = np.minimum(np.maximum(np.floor(self.mask_prob * n_cand + u_row), 1), n_cand).astype(np.int64)
        # Select the n_sel candidates with the smallest hash priority.
        prio = np.where(candidate, _uniform(h[0]), 2.0)
        order = np.argsort(prio, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(np.arange(T), (B, T)), axis=1)
        selected = rank < n_sel[:, None]
        labels = np.where(selected, ids, tokens.IGNORE_INDEX)
        u = _uniform(h[1])
        to_mask = selected & (u < 1.0 - self.random_prob - self.keep_prob)
        to_random = selected & ~to_mask & (u < 1.0 - self.keep_prob)
        lo, hi = N_SPECIAL, self.corpus.vocab_size  # random replacements are real, non-special pieces
        random_ids = (h[2] % np.uint64(hi - lo)).astype(np.int64) + lo
        input_ids = np.where(to_mask, tokens.MASK, np.where(to_random, random_ids, ids))
        return input_ids, labels

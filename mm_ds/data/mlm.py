"""MLM pretraining batches: RoBERTa FULL-SENTENCES packing, deterministic order, dynamic masking.

Packing (mm_ds.data.blocks): RoBERTa FULL-SENTENCES blocks of whole lines, their spans memory-mapped from a cache
file in the corpus directory that one process writes (`mm-ds prepare --seq-len`, or a stage's rank 0).

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

import numpy as np
import torch

from mm_ds import tokens
from mm_ds.data.blocks import block_spans
from mm_ds.data.order import sample_ids
from mm_ds.data.shards import TokenCorpus

N_SPECIAL = len(tokens.SPECIAL_IDS)
assert tuple(tokens.SPECIAL_IDS) == tuple(range(N_SPECIAL)), "masking assumes special ids 0..N_SPECIAL-1"

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
        self.spans = block_spans(corpus, seq_len)  # memory-mapped: each rank touches the blocks it draws
        if len(self.spans) == 0:
            raise ValueError(f"corpus {corpus.dir} has no tokens to pack")
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
        # Draws move forward: an epoch before this batch's is over, its permutation (4 bytes a block) dropped.
        for done in [e for e in self._perms if len(g) and e < epoch.min()]:
            del self._perms[done]
        return out

    def samples(self, g: np.ndarray) -> dict:
        """Masked batch for global sample ids `g` (B,)."""
        g = np.asarray(g, dtype=np.int64)
        blocks = self.blocks_of(g)
        B, T = len(g), self.seq_len
        ids = np.full((B, T), tokens.PAD, dtype=np.int64)
        ids[:, 0] = tokens.BOS
        spans = np.asarray(self.spans[blocks])  # (B, 2): these rows of the memmap only
        shards = np.searchsorted(self.corpus.token_base, spans[:, 0], side="right") - 1  # blocks never cross shards
        for row, (s, (start, stop)) in enumerate(zip(shards.tolist(), spans.tolist())):  # B slices from memmaps
            base = int(self.corpus.token_base[s])
            ids[row, 1:1 + stop - start] = self.corpus.shard_tokens(s)[start - base:stop - base]
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

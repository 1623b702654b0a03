"""The MLM-level measure, scored the same way for every system: a primary model's main head read with an output
bias refit on the target's training text, beside the target's unigram predictor.

Why a refit. Step 2 trains a language group (token embeddings E' and an output bias) through one MLM head: the
primary's main head for BL_BASE and BL_SMALL, the mini-model's head for MINIPOST (a copy of the main head) and for
MINIJOINT (the secondary head: its own dense, LayerNorm and bias). At CPU scale Step 2 learns mostly the target's
piece frequencies, and with Adam over a few hundred updates much of that prior goes into E', along the mean output
direction of the head it trained through. Read through another head (MINIJOINT's primary predicts with its main
head) that prior is scrambled, and a primary can score below its own untrained embeddings for no reason but the
head. Refitting the main head's output bias on the target's training text, with everything else frozen, takes out
whatever per-piece constant the embeddings and the head's mean output add up to, for every system and for the
control alike (docs/results.md, 2026-11-27: the measurement that decided it).

The refit is the maximum-likelihood output bias for fixed features, matched to the target's piece frequencies:
minimise mean_t logsumexp(z_t E'^T + b) - sum_v p_v b_v over the masked positions t of `fit` training sequences
(z_t: the main head's transform of the top layer's state), p: the training shards' add-one smoothed piece
frequencies (the unigram predictor's). It is convex in b with a unique optimum (up to a constant), so it does not
depend on where it starts (Step 2's bias or none), and each update b += log p - log q (q: the model's mean predicted
distribution) is generalised iterative scaling, which never lowers the likelihood (every target has exactly one
bias feature). Special pieces are never targets: their bias is -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.mlm import N_SPECIAL, MLMBatches
from ..data.shards import TokenCorpus
from ..tokens import IGNORE_INDEX

FIT_TOLERANCE = 1e-3
"""The refit stops when the model's mean predicted distribution is this close to the piece frequencies (L1)."""
FIT_MAX_STEPS = 300


@dataclass(frozen=True)
class Fit:
    """What a Step-2 run's rows share: the training sequences the bias refit reads, the training corpus's piece
    log-frequencies it matches (`piece_logp`), and the unigram predictor on the held-out tokens."""
    batches: list
    logp: np.ndarray
    unigram: dict


def masked_batches(corpus_dir: Path, data_cfg: dict, sequences: int, seed: int, batch: int) -> list[dict]:
    """The first `sequences` samples of a prepared corpus (no second epoch), packed as Step 2's training batches
    are (its seq_len and mask rate) with `seed`, `batch` at a time; every selected token is <mask>."""
    corpus = TokenCorpus(corpus_dir)
    mlm = MLMBatches(corpus, data_cfg["seq_len"], seed=seed, mask_prob=data_cfg["mask_prob"],
                     random_prob=0.0, keep_prob=0.0, vocab_size=corpus.vocab_size)
    n = min(sequences, mlm.num_blocks())  # a second epoch would repeat blocks
    return [mlm.samples(np.arange(i, min(i + batch, n))) for i in range(0, n, batch)]


def piece_logp(corpus_dir: Path) -> np.ndarray:
    """log p of every piece in a prepared corpus's training shards (add-one smoothed over the non-special pieces,
    -inf for the special ones, which are never targets): the unigram predictor, and what a refit bias matches."""
    corpus = TokenCorpus(corpus_dir)
    counts = np.zeros(corpus.vocab_size, dtype=np.float64)
    for s in range(corpus.num_shards):
        counts += np.bincount(corpus.shard_tokens(s), minlength=corpus.vocab_size)[:corpus.vocab_size]
    counts[:N_SPECIAL] = 0  # special pieces are never targets
    counts[N_SPECIAL:] += 1
    return np.log(counts / counts.sum(), where=counts > 0, out=np.full_like(counts, -np.inf))


def unigram_metrics(corpus_dir: Path, batches: list[dict]) -> dict:
    """MLM loss and accuracy of a unigram predictor on `batches`' targets: every masked position gets the
    training shards' piece frequencies (`piece_logp`), so it always predicts the most frequent piece. What a model
    scores above it, it did not get from word frequencies."""
    logp = piece_logp(corpus_dir)
    labels = np.concatenate([b["labels"].numpy().ravel() for b in batches])
    labels = labels[labels >= 0]
    return {"loss": float(-logp[labels].mean()), "acc": float((labels == logp.argmax()).mean()),
            "targets": int(len(labels))}


def _transform(head, x: torch.Tensor) -> torch.Tensor:
    """An MLM head's transform (dense, GELU, LayerNorm): its logits are this times the embeddings, plus its bias."""
    return head.norm(F.gelu(head.dense(x)))


def head_features(model, batches: list[dict], device="cpu") -> dict[str, torch.Tensor]:
    """At every masked position of `batches`, for an MLM `model` (eval mode, on `device`): the top layer's state
    `top` (M, h), the main head's transform of it `z` (M, h; its logits are z E^T + bias), the `labels` (M,), and
    for a model with a secondary head (MINIJOINT) that head's transform of its layer's state, `z_secondary`."""
    depths = model.cfg.secondary_depths[:1]
    top, sec, labels = [], [], []
    with torch.no_grad():
        for b in batches:
            mask = b["attention_mask"]
            hidden, tapped = model.encode(b["input_ids"].to(device), None if mask is None else mask.to(device),
                                          taps=depths)
            sel = b["labels"].to(device).ne(IGNORE_INDEX)
            top.append(hidden[sel])
            sec += [tapped[n][sel] for n in depths]
            labels.append(b["labels"].to(device)[sel])
        top_ = torch.cat(top)
        out = {"top": top_, "z": _transform(model.head, top_), "labels": torch.cat(labels)}
        return out | ({"z_secondary": _transform(model.secondary_head, torch.cat(sec))} if depths else {})


def two_heads(model, feats: dict) -> dict:
    """A model with a secondary head (MINIJOINT), on `feats` (head_features): its main head read with its own
    output bias and with the secondary head's, and the cosine between the two heads' mean outputs (their
    transforms' means over the masked positions). Each head carries the language's piece frequencies partly along
    its mean output: where the two means point apart, a prior learnt through one head reads scrambled through
    the other."""
    emb = model.embed.tokens.weight.detach()
    own = main_head_metrics(feats, emb, model.head.bias.detach())
    crossed = main_head_metrics(feats, emb, model.secondary_head.bias.detach())
    cos = F.cosine_similarity(feats["z"].mean(0), feats["z_secondary"].mean(0), dim=0)
    return {"loss": own["loss"], "acc": own["acc"], "targets": own["targets"], "secondary_bias_loss": crossed["loss"],
            "secondary_bias_acc": crossed["acc"], "head_cosine": float(cos)}


def scores(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """Token-mean MLM loss and accuracy of `logits` (M, V) against `labels` (M,)."""
    return {"loss": float(F.cross_entropy(logits.float(), labels)),
            "acc": float((logits.argmax(-1) == labels).float().mean()), "targets": int(len(labels))}


def refit_bias(z: torch.Tensor, emb: torch.Tensor, logp: torch.Tensor, tolerance: float = FIT_TOLERANCE,
               max_steps: int = FIT_MAX_STEPS) -> tuple[torch.Tensor, dict]:
    """The output bias b (V,) that maximises the likelihood of a head whose logits are z E^T + b, z (M, h) the
    head's transform at M training contexts, E = `emb` (V, h), with the targets' piece frequencies exp(`logp`) (V,):
    generalised iterative scaling until the mean predicted distribution q is within `tolerance` of them (L1).
    Also returns {"steps", "l1"}: how many updates it took and how far q still is (the row keeps both)."""
    base = (z.float() @ emb.float().T)  # (M, V): what the contexts and the embeddings say, before any bias
    valid = torch.isfinite(logp)
    p = logp.exp()
    b = torch.where(valid, torch.zeros_like(logp), torch.full_like(logp, -math.inf))
    steps, l1 = 0, math.inf
    while True:
        logits = base + b
        logq = torch.logsumexp(logits - torch.logsumexp(logits, 1, keepdim=True), 0) - math.log(len(z))  # (V,)
        l1 = float((logq.exp() - p)[valid].abs().sum())
        if l1 <= tolerance or steps == max_steps:
            return b, {"steps": steps, "l1": l1}
        b = torch.where(valid, b + (logp - logq), b)
        steps += 1


def main_head_metrics(feats: dict, emb: torch.Tensor, bias: torch.Tensor) -> dict:
    """The main head's MLM loss and accuracy on `feats` (head_features) with embeddings `emb` and output `bias`."""
    return scores(feats["z"] @ emb.T + bias, feats["labels"])

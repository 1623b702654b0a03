"""The paper's analytic training FLOPs (appendix A.1), V100-days and MFU.

Symbols follow the paper: h hidden size, V vocabulary size, l layers, s sequence length, p mask probability,
B global batch (sequences), U updates, l_t trainable layers. Everything is plain numbers, so the training loop,
`mm-ds flops` (mm_ds/pipeline/costs.py) and the report can use it without building a model.

Like the paper (after Narayanan et al. 2021) we count matrix multiplies only: no biases, activations, softmax,
layer norms, optimizer step or embedding lookups, and no activation recomputation.
"""
from __future__ import annotations

EXA = 1e18
V100_FLOPS_PER_S = 30e12  # the paper's assumed sustained V100 throughput (§3)
V100_DAY_FLOPS = V100_FLOPS_PER_S * 86_400  # = 2.592 EFLOPs, the paper's "1 V100 day"


# --- Building blocks of the derivation (per sequence, forward pass) -----------------------------------------

def flop_layer(s: float, h: float) -> float:
    """One transformer layer: Q,K,V,O projections 8sh², QKᵀ and ·V 4hs², FFN h→4h→h 16sh²."""
    return 24 * s * h**2 + 4 * h * s**2


def flop_outproj(s: float, h: float, V: float) -> float:
    """The MLM head's output projection h→V over all s positions (tied to the input embeddings)."""
    return 2 * s * h * V


def flop_lm(s: float, h: float, V: float, p: float) -> float:
    """The MLM head (dense h→h + output projection), applied to the masked fraction p of positions only."""
    return p * (2 * s * h**2 + flop_outproj(s, h, V))


def forward_flops(s: float, h: float, V: float, l: float, p: float) -> float:
    """(A2) One forward pass of an l-layer RoBERTa MLM on one sequence."""
    return l * flop_layer(s, h) + flop_lm(s, h, V, p)


# --- Whole-stage costs: U updates of B sequences ----------------------------------------------------------------

def pretrain_flops(h, V, l, s, p, B, U) -> float:
    """(A1) Full pretraining: backward = 2× forward, so 3·UB·(l·FLOP_layer + FLOP_lm)
    = 72UBslh²(1 + s/6h + p/12l + pV/12hl)."""
    return 3 * U * B * forward_flops(s, h, V, l, p)


def pretrain_secondary_flops(h, V, l, s, p, B, U, heads: int = 1) -> float:
    """MINIJOINT Step 1: A1 plus the secondary MLM head (at layer N) forward and backward, 3·UB·FLOP_lm.
    Its cost does not depend on N: the head's input is always (s, h). Multi-depth (§7): one such term per
    secondary head (`heads`)."""
    return pretrain_flops(h, V, l, s, p, B, U) + heads * 3 * U * B * flop_lm(s, h, V, p)


def adapt_flops(h, V, l, s, p, B, U) -> float:
    """(A3) Step 2, new embeddings over a frozen body: forward + ∂/∂activations through everything (2×),
    plus ∂/∂weights of the trainable tied output projection on masked positions (p·FLOP_outproj)
    = 48UBslh²(1 + s/6h + p/12l + pV/8hl)."""
    return U * B * (2 * l * flop_layer(s, h) + 2 * flop_lm(s, h, V, p) + p * flop_outproj(s, h, V))


def build_mini_flops(h, V, l, s, p, B, U, l_t) -> float:
    """(A4) MINIPOST Step 1b: l = all layers of the mini-model (N frozen + l_t new). Forward through l layers,
    ∂/∂activations of the frozen head (2·FLOP_lm), and both gradients of the trainable layers except the lowest
    one, which passes no error down: (2·l_t − 1)·FLOP_layer."""
    if not 0 < l_t <= l:
        raise ValueError(f"build_mini needs 0 < trainable_layers <= layers, got trainable_layers={l_t}, layers={l}")
    return U * B * ((l + 2 * l_t - 1) * flop_layer(s, h) + 2 * flop_lm(s, h, V, p))


def finetune_flops(h, l, s, B, U) -> float:
    """Step 3, full finetuning: 3× the forward of l layers, no MLM head (the task head is negligible).
    An extension: the paper counts Step 2 only and gives no formula for this."""
    return 3 * U * B * l * flop_layer(s, h)


FORMULAS = ("pretrain", "pretrain_secondary", "build_mini", "adapt", "finetune")
"""The cost formulas; each system's row in mm_ds/systems.py says which of its stages uses which."""


def stage_flops_per_step(formula: str, *, hidden: int, vocab: int, layers: int, seq_len: int, mask_prob: float,
                         global_batch: int, trainable_layers: int | None = None, secondary_heads: int = 1) -> float:
    """FLOPs of one optimizer update of a stage; the training loop divides by step time for achieved FLOP/s.
    `secondary_heads`: pretrain_secondary's secondary MLM heads (multi-depth MINIJOINT has several)."""
    h, V, l, s, p, B = hidden, vocab, layers, seq_len, mask_prob, global_batch
    if formula == "pretrain":
        return pretrain_flops(h, V, l, s, p, B, 1)
    if formula == "pretrain_secondary":
        return pretrain_secondary_flops(h, V, l, s, p, B, 1, secondary_heads)
    if formula == "adapt":
        return adapt_flops(h, V, l, s, p, B, 1)
    if formula == "build_mini":
        if trainable_layers is None:
            raise ValueError("formula 'build_mini' needs trainable_layers (the new layers on top of the frozen N)")
        return build_mini_flops(h, V, l, s, p, B, 1, trainable_layers)
    if formula == "finetune":
        return finetune_flops(h, l, s, B, 1)
    raise ValueError(f"unknown FLOPs formula {formula!r}; expected one of {', '.join(FORMULAS)}")


def to_v100_days(flops: float) -> float:
    return flops / V100_DAY_FLOPS


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved analytic FLOP/s over the hardware peak (e.g. 312e12 for A100 bf16)."""
    if peak_flops_per_s <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {peak_flops_per_s}")
    return achieved_flops_per_s / peak_flops_per_s

"""One readable RoBERTa MLM (paper §2, §3): post-LayerNorm encoder, tied embeddings, and optional
secondary MLM heads after layer N (MINIJOINT; several for the multi-depth variant of §7).

State-dict keys read like the architecture:
    embed.tokens.weight            (V, h)   language-specific, tied to every head's output projection
    embed.positions.weight         (P+2, h) RoBERTa offsets positions past the pad id
    embed.norm.{weight,bias}
    layers.{i}.attn.qkv.{weight,bias}   (3h, h) fused q/k/v projection
    layers.{i}.attn.out.{weight,bias}
    layers.{i}.attn_norm, layers.{i}.ffn.fc1, layers.{i}.ffn.fc2, layers.{i}.ffn_norm
    head.dense, head.norm, head.bias       (bias: V, language-specific)
    secondary_head.dense, secondary_head.norm, secondary_head.bias   (MINIJOINT only: the head after layer N)
    secondary_heads.{N}.dense, .norm, .bias   (multi-depth MINIJOINT: each further head, after layer N)

`param_shapes(cfg)` lists these keys and shapes without building the model; `param_count(cfg, select)` is
the one parameter count (surgery's checks, `mm-ds plan`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..tokens import IGNORE_INDEX, PAD

# The language-specific group (paper §2.1): swapped per language in Steps 2 and 4; everything else is body.
LANGUAGE_PARAMS = ("embed.tokens.weight", "head.bias", "secondary_head.bias")


def is_language_param(name: str) -> bool:
    """LANGUAGE_PARAMS, and the output bias of every further head of a multi-depth model."""
    parts = name.split(".")
    return name in LANGUAGE_PARAMS or (len(parts) == 3 and parts[0] == "secondary_heads" and parts[2] == "bias")


# ---------------------------------------------------------------- dropout

# CPU dropout masks come from 64-bit words of the default generator cut into four 16-bit draws: on CPU,
# `bernoulli_` draws one 32-bit number per element serially and cost ~10% of a base-shape training step.
# The drop probability is therefore p rounded to a multiple of 2^-16 (0.1 -> 0.100006) and the kept
# values are scaled by exactly 1 / (1 - that probability), so the expectation is still the input's.
# Masks stay a pure function of the torch seed (resume is exact). GPUs keep the native fused kernels, and so does a
# compiled model (train.compile): dynamo cannot trace the in-place draw, and inductor fuses its own mask into the
# kernel around it (mm_ds/runtime/training/compiled.py).

def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout(x, p, training), with the cheaper mask above on CPU when not compiled."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, True)
    n_drop = round(p * 65536)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-2 ** 63, None)
    draws = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform on [-32768, 32767]
    # A float mask (0 or the scale): CPU kernels on bool masks are several times slower than a multiply.
    keep = draws.ge(n_drop - 32768).to(x.dtype).mul_(65536 / (65536 - n_drop))
    return x * keep  # autograd saves `keep` only


class Dropout(nn.Module):
    """nn.Dropout through `dropout` (no parameters: state-dict keys are unaffected)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _attention_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                            p: float) -> torch.Tensor:
    """SDPA's math, for CPU training: with dropout, SDPA leaves its fused CPU kernel for a generic path
    that also pays for `bernoulli_` and a fully-masked-row guard. Rows always keep <s>, so none is fully
    masked here."""
    scores = torch.matmul(q * (1.0 / math.sqrt(q.size(-1))), k.transpose(-1, -2))  # (B, nh, T, T)
    if key_mask is not None:  # an additive (B, 1, 1, T) bias: cheaper than masked_fill over (B, nh, T, T)
        scores = scores + torch.zeros(key_mask.shape, dtype=scores.dtype).masked_fill_(~key_mask, float("-inf"))
    return torch.matmul(dropout(torch.softmax(scores, dim=-1), p, True), v)  # (B, nh, T, hs)


# ---------------------------------------------------------------- the model

class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=PAD)
        self.positions = nn.Embedding(cfg.max_positions + PAD + 1, cfg.hidden_size, padding_idx=PAD)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # RoBERTa numbers real tokens PAD+1, PAD+2, ... and gives padding the pad position.
        not_pad = input_ids.ne(PAD).int()
        pos = torch.cumsum(not_pad, dim=1) * not_pad + PAD  # (B, T)
        x = self.tokens(input_ids) + self.positions(pos)  # (B, T, h)
        return self.drop(self.norm(x))


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None, seq_len: int) -> torch.Tensor:
        h = x.size(-1)  # x: (B*T, h), the rows of `seq_len`-token sequences
        qkv = self.qkv(x).view(-1, seq_len, 3, self.num_heads, h // self.num_heads)  # (B, T, 3, nh, hs)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, nh, T, hs) each
        p = self.dropout if self.training else 0.0
        if p > 0.0 and x.device.type == "cpu":
            y = _attention_with_dropout(q, k, v, key_mask, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(-1, h))  # (B*T, h)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_size)
        self.fc2 = nn.Linear(cfg.ffn_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    """Post-LayerNorm transformer block, as in BERT/RoBERTa, over flat rows (B*T, h): `nn.Linear` on a 2-D input
    is one addmm; on (B, T, h) it adds a view before and after, and their two backward nodes, to each of the
    layer's four projections (host work per op on a GPU; the arithmetic is the same)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None, seq_len: int) -> torch.Tensor:
        x = self.attn_norm(x + self.drop(self.attn(x, key_mask, seq_len)))  # (B*T, h)
        return self.ffn_norm(x + self.drop(self.ffn(x)))


class MLMHead(nn.Module):
    """dense + GELU + LayerNorm + output projection (the token embeddings, passed in) + output bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(F.gelu(self.dense(x))), embedding, self.bias)  # (..., V)


class Encoder(nn.Module):
    """Embeddings and transformer layers: the body shared by the MLM and the downstream models."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size is unset: resolve it from the tokenizer before building the model")
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))

    def init_weights(self) -> None:
        """N(0, 0.02) for weights (RoBERTa/BERT), zero biases, unit LayerNorms, zero padding rows."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=self.cfg.init_std)
                if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                    with torch.no_grad():
                        m.weight[m.padding_idx].zero_()
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, MLMHead):
                nn.init.zeros_(m.bias)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               taps: tuple[int, ...] = (), depth: int | None = None) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Hidden states (B, T, h) after layer `depth` (None: the last), and the outputs of the layers in
        `taps` (1-based) up to it. Layers above `depth` are not run."""
        # SDPA's boolean mask: True = attend. None keeps the fused no-mask kernels for packed batches.
        key_mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        B, T = input_ids.shape
        x = self.embed(input_ids).view(B * T, -1)  # flat rows through the layers (see Layer)
        tapped = {}
        for i, layer in enumerate(self.layers[:depth], start=1):
            x = layer(x, key_mask, T)
            if i in taps:
                tapped[i] = x.view(B, T, -1)
        return x.view(B, T, -1), tapped

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


class RobertaMLM(Encoder):
    """RoBERTa MLM with optional secondary heads after layers `secondary_head_layer` (MINIJOINT)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.head = MLMHead(cfg)
        depths = cfg.secondary_depths
        self.secondary_head = MLMHead(cfg) if depths else None
        # Further heads of a multi-depth model, keyed by their layer; the first keeps the single-head name.
        self.secondary_heads = nn.ModuleDict({str(n): MLMHead(cfg) for n in depths[1:]}) if depths[1:] else None
        self.init_weights()

    def head_depths(self) -> dict[str, int]:
        """Log name of each head -> the layer it reads: `main`, then `secondary` (one secondary head) or
        `secondary@N` per head (multi-depth)."""
        depths = self.cfg.secondary_depths
        return {"main": self.cfg.num_layers} | (
            {"secondary": depths[0]} if len(depths) == 1 else {f"secondary@{n}": n for n in depths})

    def heads(self) -> dict[str, MLMHead]:
        depths = self.cfg.secondary_depths
        modules = [self.head] + ([self.secondary_head] if depths else [])
        modules += [self.secondary_heads[str(n)] for n in depths[1:]]
        return dict(zip(self.head_depths(), modules))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, depth: int | None = None,
                masked_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """With labels: only masked positions go through the head(s) (the paper's FLOPs model; a 50k-row
        projection over every position would cost more than several layers). MINIJOINT's loss: the main head's
        times model.main_head_weight (0.5, the paper's), the secondary heads' mean times the rest. Without
        labels: full (B, T, V) logits per head, for evaluation and tests.
        `depth=N`: only the bottom N layers and the head after layer N run (a multi-depth mini-model's
        Step 2 at depth N); its loss is the loss. `masked_positions` (M,): flat indices of the masked
        positions, as the training batches carry them (mm_ds/data/mlm.py): a fixed length per batch shape,
        padded with positions whose label is ignored, so that training never asks the device which
        positions are masked (`nonzero` waits for the device and gives a new shape every batch)."""
        depths = self.head_depths()
        if depth is not None:
            names = [k for k, n in depths.items() if n == depth][:1]  # the main head when the depths coincide
            if not names:
                raise ValueError(f"depth={depth}: this model has heads after layers "
                                 f"{sorted(set(depths.values()))} only")
            depths = {names[0]: depth}
        final, tapped = self.encode(input_ids, attention_mask, taps=tuple(depths.values()), depth=depth)
        hidden = {k: final if k == "main" or n == depth else tapped[n] for k, n in depths.items()}
        emb = self.embed.tokens.weight
        heads = {k: h for k, h in self.heads().items() if k in depths}
        if labels is None:
            return {f"logits_{k}": head(hidden[k], emb) for k, head in heads.items()}
        flat_labels = labels.reshape(-1)
        idx = masked_positions
        if idx is None:  # evaluation and tests: find them (a host sync on a GPU)
            idx = flat_labels.ne(IGNORE_INDEX).nonzero().squeeze(1)
        targets = flat_labels.index_select(0, idx)  # (M,): IGNORE_INDEX at padding
        out: dict[str, torch.Tensor] = {"masked_tokens": targets.ne(IGNORE_INDEX).sum()}
        losses = []
        for k, head in heads.items():
            sel = hidden[k].reshape(-1, hidden[k].size(-1)).index_select(0, idx)  # (M, h)
            logits = head(sel, emb)  # (M, V)
            loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)
            out[f"loss_{k}"] = loss
            out[f"correct_{k}"] = (logits.argmax(-1) == targets).sum()
            losses.append(loss)
        out["loss"] = losses[0] if len(losses) == 1 else (  # losses[0] is the main head's (head_depths' order)
            self.cfg.main_head_weight * losses[0] + (1 - self.cfg.main_head_weight) * torch.stack(losses[1:]).mean())
        return out


# ---------------------------------------------------------------- shapes and parameter counts

def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Parameter suffixes of one transformer layer (`layers.{i}.<suffix>`), in module order."""
    h, f = cfg.hidden_size, cfg.ffn_size
    return {
        "attn.qkv.weight": (3 * h, h), "attn.qkv.bias": (3 * h,),
        "attn.out.weight": (h, h), "attn.out.bias": (h,),
        "attn_norm.weight": (h,), "attn_norm.bias": (h,),
        "ffn.fc1.weight": (f, h), "ffn.fc1.bias": (f,),
        "ffn.fc2.weight": (h, f), "ffn.fc2.bias": (h,),
        "ffn_norm.weight": (h,), "ffn_norm.bias": (h,),
    }


def _head_shapes(prefix: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h = cfg.hidden_size  # the output projection is the token embeddings (tied): not counted again
    return {f"{prefix}.dense.weight": (h, h), f"{prefix}.dense.bias": (h,),
            f"{prefix}.norm.weight": (h,), f"{prefix}.norm.bias": (h,), f"{prefix}.bias": (cfg.vocab_size,)}


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every key of `RobertaMLM(cfg).state_dict()` and its shape, computed without building the model."""
    if cfg.vocab_size is None:
        raise ValueError("model.vocab_size is unset: resolve it from the tokenizer first")
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {
        "embed.tokens.weight": (cfg.vocab_size, h),
        "embed.positions.weight": (cfg.max_positions + PAD + 1, h),
        "embed.norm.weight": (h,), "embed.norm.bias": (h,),
    }
    for i in range(cfg.num_layers):
        out |= {f"layers.{i}.{k}": s for k, s in layer_shapes(cfg).items()}
    out |= _head_shapes("head", cfg)
    for i, n in enumerate(cfg.secondary_depths):
        out |= _head_shapes("secondary_head" if i == 0 else f"secondary_heads.{n}", cfg)
    return out


def param_count(cfg: ModelConfig, select=None) -> int:
    """Parameters of `RobertaMLM(cfg)` (= its `num_params()`), or of the keys `select(key)` accepts, e.g.
    `lambda k: k in LANGUAGE_PARAMS` (the language group) or `lambda k: not k.startswith("head.")` (the body
    a downstream model keeps). Needs no model and no memory: plans count the paper's shapes with it."""
    return sum(math.prod(s) for k, s in param_shapes(cfg).items() if select is None or select(k))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only; biases, LayerNorms and 1-D params are exempt. Frozen params are left out:
    frozen before deepspeed.initialize, they get no optimizer state and no gradients."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or ".norm" in name or "_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def set_trainable(model: nn.Module, trainable) -> tuple[int, int]:
    """Freeze every parameter whose name `trainable(name)` rejects. Returns (trainable, total) counts."""
    n_train = n_total = 0
    for name, p in model.named_parameters():
        p.requires_grad_(bool(trainable(name)))
        n_total += p.numel()
        n_train += p.numel() if p.requires_grad else 0
    if n_train == 0:
        raise ValueError("no parameter is trainable in this stage; check the stage's trainable set")
    return n_train, n_total


"""Model surgery: pure functions on `(ModelConfig, state_dict)` (paper §2).

Nothing here reads or writes files, builds an engine or touches a process group; every function returns a
new config and a new dict and never mutates its inputs. Every tensor in a returned dict is a fresh clone, so
training a model loaded from the result can never write into the source (and vice versa).

Each function checks key sets, shapes and hidden sizes first and raises `SurgeryError` naming the key,
the expected and the actual shape, or the config field that does not match.

    extract_minijoint        MINIJOINT: bottom N layers + the secondary head, promoted to the only head; multi-depth:
                             bottom max(N) layers + every secondary head, the deepest promoted to `head`
    drop_secondary_head      MINIJOINT's primary model with its main head only (what the full model predicts with)
    build_minipost           MINIPOST:  bottom N layers + 2 fresh bridge layers + the original MLM head
    minipost_trainable       the bridge layers, the only parameters trained in MINIPOST's Step 1b
    init_target_embeddings   a new language's embeddings: overlapping pieces copied, the rest N(0, 0.02)
    language_group           the language-specific tensors of a state dict (model.LANGUAGE_PARAMS)
    swap_embeddings          put a language group into any model of the same hidden size
    check_vocab              a language group against a tokenizer's size
    check_compatible         a mini-model against the primary model it should belong to
    check_state_dict         a state dict against the keys and shapes of its config (model.param_shapes)

The Hugging Face key maps, pure functions of the same kind, are mm_ds.interop.hf.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import torch

from ..config import ModelConfig
from ..tokens import PAD, SPECIAL_IDS
from .model import LANGUAGE_PARAMS, is_language_param, layer_shapes, param_shapes

StateDict = Mapping[str, torch.Tensor]

TOKENS = "embed.tokens.weight"


def is_head_bias(name: str) -> bool:
    """An MLM head's output bias (`head.bias`, `secondary_head.bias`, `secondary_heads.N.bias`)."""
    return is_language_param(name) and name != TOKENS


class SurgeryError(ValueError):
    """A state dict or config that does not fit the surgery asked for; the message says what differs."""


# ---------------------------------------------------------------- key and shape checks

def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_state_dict(cfg: ModelConfig, sd: StateDict, what: str = "state dict") -> None:
    """Raise SurgeryError unless `sd` has exactly the keys and shapes of `RobertaMLM(cfg)`."""
    if cfg.vocab_size is None:
        raise SurgeryError("model.vocab_size is unset: resolve it from the tokenizer before surgery")
    want = param_shapes(cfg)
    missing = [k for k in want if k not in sd]
    extra = sorted(k for k in sd if k not in want)
    if missing or extra:
        hint = ""
        if any(k.startswith(("secondary_head.", "secondary_heads.")) for k in missing + extra):
            hint = (f" (model.secondary_head_layer={cfg.secondary_head_layer} decides which secondary_head.* and "
                    f"secondary_heads.N.* exist)")
        elif any(k.startswith("layers.") for k in missing + extra):
            hint = f" (model.num_layers={cfg.num_layers})"
        raise SurgeryError(f"{what} does not match its config{hint}: "
                           f"missing {few_keys(missing)}; unexpected {few_keys(extra)}")
    for k, s in want.items():
        if _shape(sd[k]) != s:
            raise SurgeryError(f"{what}: {k} has shape {_shape(sd[k])}, expected {s} from its config "
                               f"(vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}, "
                               f"ffn_size={cfg.ffn_size}, max_positions={cfg.max_positions})")


def few_keys(keys: list[str], n: int = 6) -> str:
    if not keys:
        return "none"
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


# ---------------------------------------------------------------- MINIJOINT (§2.2)

def extract_minijoint(cfg: ModelConfig, sd: StateDict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """MINIJOINT's mini-model: embeddings, the bottom N = cfg.secondary_head_layer layers, and the
    secondary head renamed `secondary_head.*` -> `head.*` (its only head). Its logits equal the source's
    `logits_secondary`.

    Multi-depth (secondary_head_layer=[N1, ..., Nk]): the bottom Nk layers and every secondary head; the
    head after Nk becomes `head.*`, the shallower ones keep their names and depths, so the mini-model's
    `forward(depth=Ni)` equals the source's `logits_secondary@Ni`: one model holds the k mini-models."""
    depths = cfg.secondary_depths
    if not depths:
        raise SurgeryError("extract_minijoint needs a model with a secondary head (MINIJOINT), but "
                           "model.secondary_head_layer is None; for a single-head model use build_minipost")
    check_state_dict(cfg, sd, "model with a secondary head")
    n = depths[-1]
    mini_cfg = dataclasses.replace(cfg, num_layers=n, secondary_head_layer=list(depths[:-1]) or None)  # [N] -> N
    deepest = "secondary_head." if len(depths) == 1 else f"secondary_heads.{n}."
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k.startswith("embed."):
            out[k] = _clone(v)
        elif k.startswith("layers.") and int(k.split(".")[1]) < n:
            out[k] = _clone(v)
        elif k.startswith(deepest):
            out["head." + k[len(deepest):]] = _clone(v)
        elif k.startswith(("secondary_head.", "secondary_heads.")):
            out[k] = _clone(v)
    check_state_dict(mini_cfg, out, "extracted mini-model")
    return mini_cfg, out


def drop_secondary_head(cfg: ModelConfig, sd: StateDict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A model with a secondary head as a single-head one: every layer and the main head, without
    `secondary_head.*` (and a multi-depth model's `secondary_heads.*`).
    A mini-model's language group then fits it (its one output bias becomes the main head's)."""
    if cfg.secondary_head_layer is None:
        raise SurgeryError("drop_secondary_head needs a model with a secondary head (MINIJOINT), but "
                           "model.secondary_head_layer is None")
    check_state_dict(cfg, sd, "model with a secondary head")
    out_cfg = dataclasses.replace(cfg, secondary_head_layer=None)
    out = {k: _clone(v) for k, v in sd.items() if not k.startswith(("secondary_head.", "secondary_heads."))}
    check_state_dict(out_cfg, out, "model without its secondary head")
    return out_cfg, out


# ---------------------------------------------------------------- MINIPOST (§2.2)

def init_layer(cfg: ModelConfig, generator: torch.Generator,
               dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """One fresh layer as `Encoder.init_weights` makes it: N(0, init_std) matrices, zero biases, unit
    LayerNorms. Draws happen in `layer_shapes` order, so the result depends only on the generator state."""
    out = {}
    for k, s in layer_shapes(cfg).items():
        if k.endswith("_norm.weight"):
            out[k] = torch.ones(s, dtype=dtype)
        elif k.endswith(".bias"):
            out[k] = torch.zeros(s, dtype=dtype)
        else:
            out[k] = torch.empty(s, dtype=torch.float32).normal_(0.0, cfg.init_std, generator=generator).to(dtype)
    return out


def build_minipost(cfg: ModelConfig, sd: StateDict, n_layers: int = 4, new_layers: int = 2,
                   seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """MINIPOST's mini-model (Step 1b): embeddings, the bottom `n_layers` layers, `new_layers` freshly
    initialised bridge layers (deterministic from `seed`), then the original MLM head. Train only the bridge
    layers afterwards (`minipost_trainable`)."""
    if cfg.secondary_head_layer is not None:
        raise SurgeryError(f"build_minipost needs a single-head model, but model.secondary_head_layer="
                           f"{cfg.secondary_head_layer}; for a model with a secondary head use extract_minijoint")
    if not 1 <= n_layers <= cfg.num_layers:
        raise SurgeryError(f"n_layers={n_layers} must be between 1 and the source model.num_layers="
                           f"{cfg.num_layers}")
    if new_layers < 1:
        raise SurgeryError(f"new_layers={new_layers} must be at least 1 (the paper adds 2)")
    check_state_dict(cfg, sd, "source model")
    mini_cfg = dataclasses.replace(cfg, num_layers=n_layers + new_layers)
    out: dict[str, torch.Tensor] = {k: _clone(v) for k, v in sd.items() if k.startswith("embed.")}
    for i in range(n_layers):
        out |= {f"layers.{i}.{k}": _clone(sd[f"layers.{i}.{k}"]) for k in layer_shapes(cfg)}
    g = torch.Generator().manual_seed(seed)
    dtype = sd["layers.0.attn.qkv.weight"].dtype
    for i in range(n_layers, n_layers + new_layers):
        out |= {f"layers.{i}.{k}": v for k, v in init_layer(cfg, g, dtype).items()}
    out |= {k: _clone(v) for k, v in sd.items() if k.startswith("head.")}
    check_state_dict(mini_cfg, out, "MINIPOST mini-model")
    return mini_cfg, out


def minipost_trainable(mini_cfg: ModelConfig, n_layers: int) -> Callable[[str], bool]:
    """Selects the bridge layers `layers.{n_layers}` .. `layers.{num_layers-1}` by parameter name (for
    `model.set_trainable`); everything else stays frozen."""
    if not 0 <= n_layers < mini_cfg.num_layers:
        raise SurgeryError(f"n_layers={n_layers} leaves no bridge layer in a mini-model with "
                           f"model.num_layers={mini_cfg.num_layers}")
    prefixes = tuple(f"layers.{i}." for i in range(n_layers, mini_cfg.num_layers))

    def trainable(name: str) -> bool:
        return name.startswith(prefixes)

    trainable.prefixes = prefixes  # type: ignore[attr-defined]  # for logs
    return trainable


# ---------------------------------------------------------------- language-specific group (§2.1)

def language_group(sd: StateDict) -> dict[str, torch.Tensor]:
    """The language-specific tensors (token embeddings and the MLM heads' output biases), cloned."""
    if TOKENS not in sd:
        raise SurgeryError(f"state dict has no {TOKENS}; keys start with {few_keys(sorted(sd), 4)}")
    return {k: _clone(v) for k, v in sd.items() if is_language_param(k)}


def _check_group(lang_sd: StateDict) -> tuple[int, int]:
    """(vocab, hidden) of a language group, after checking its keys and that its shapes agree."""
    extra = sorted(k for k in lang_sd if not is_language_param(k))
    if extra:
        raise SurgeryError(f"language group has non-language keys {few_keys(extra)}; it may only hold "
                           f"{', '.join(LANGUAGE_PARAMS)}, secondary_heads.N.bias (language_group(sd) takes them)")
    if TOKENS not in lang_sd:
        raise SurgeryError(f"language group has no {TOKENS}")
    emb = lang_sd[TOKENS]
    if emb.dim() != 2:
        raise SurgeryError(f"language group: {TOKENS} has shape {_shape(emb)}, expected (vocab, hidden)")
    V, h = emb.shape
    for k in filter(is_head_bias, lang_sd):
        if _shape(lang_sd[k]) != (V,):
            raise SurgeryError(f"language group: {k} has shape {_shape(lang_sd[k])}, expected ({V},) to match "
                               f"{TOKENS} {_shape(emb)}")
    return V, h


def check_vocab(lang_sd: StateDict, tokenizer_size: int) -> None:
    """Raise unless the language group has one row per piece of a tokenizer with `tokenizer_size` pieces."""
    V, _ = _check_group(lang_sd)
    if V != tokenizer_size:
        raise SurgeryError(f"language group has vocab {V} ({TOKENS} {_shape(lang_sd[TOKENS])}) but the "
                           f"tokenizer has {tokenizer_size} pieces: the embeddings belong to another "
                           f"SentencePiece model")


def swap_embeddings(cfg: ModelConfig, sd: StateDict,
                    lang_sd: StateDict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Put a language's token embeddings and output biases into a model of the same hidden size: a primary
    or mini MLM, or a downstream model (any state dict with `embed.tokens.weight`). The new config's
    vocab_size is the group's. Every MLM head the target has (`head.bias`, `secondary_head.bias`, ...) must get a bias
    from the group; a bias in the group for a head the target lacks (a downstream model, a mini-model) is
    ignored, so one group serves every model of the system. Positions, the embedding LayerNorm and all
    other tensors are body: copied unchanged."""
    V, h = _check_group(lang_sd)
    if TOKENS not in sd:
        raise SurgeryError(f"target model has no {TOKENS}; keys start with {few_keys(sorted(sd), 4)}")
    if h != cfg.hidden_size:
        raise SurgeryError(f"language group has hidden size {h} ({TOKENS} {_shape(lang_sd[TOKENS])}) but the "
                           f"target model has model.hidden_size={cfg.hidden_size}")
    want = (cfg.vocab_size, cfg.hidden_size)
    if _shape(sd[TOKENS]) != want:
        raise SurgeryError(f"target model: {TOKENS} has shape {_shape(sd[TOKENS])}, expected {want} from its "
                           f"config (model.vocab_size, model.hidden_size)")
    missing = [k for k in sd if is_head_bias(k) and k not in lang_sd]
    if missing:
        raise SurgeryError(f"target model has MLM head bias(es) {', '.join(missing)} but the language group "
                           f"has none; take the group from an MLM with the same heads")
    for k in filter(is_head_bias, sd):
        if _shape(sd[k]) != (cfg.vocab_size,):
            raise SurgeryError(f"target model: {k} has shape {_shape(sd[k])}, expected ({cfg.vocab_size},) "
                               f"from model.vocab_size")
    out = {k: _clone(v) for k, v in sd.items()}
    for k in filter(is_language_param, sd):
        out[k] = _clone(lang_sd[k])
    return dataclasses.replace(cfg, vocab_size=V), out


# ---------------------------------------------------------------- target-language initialisation (footnote 1)

def init_target_embeddings(src_cfg: ModelConfig, src_sd: StateDict, src_vocab: list[str],
                           tgt_vocab: list[str],
                           seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor], dict]:
    """A new language's group (paper footnote 1, after Pfeiffer et al. 2021). Vocabularies are piece strings
    in id order (`sp.id_to_piece(i)`). Rows of pieces present in both vocabularies, and the special ids 0-4
    (shared by every tokenizer), are copied from the source token embeddings; the others are drawn from
    N(0, init_std) with a local generator seeded by `seed`; the pad row is zero.

    Output biases (`head.bias`, and `secondary_head.bias` when the source has a secondary head): copied for the same
    rows, zero for the others. The bias is the head's log-prior of a piece; a shared piece keeps it, a new
    piece gets the value a fresh MLM head starts from (`Encoder.init_weights` zeros it).

    Report: `vocab_size`, `specials` (5), `overlap` (non-special target pieces found in the source),
    `share` (overlap / non-special target pieces), `copied` (rows copied, specials included), `random`."""
    check_state_dict(src_cfg, src_sd, "source model")
    if len(src_vocab) != src_cfg.vocab_size:
        raise SurgeryError(f"src_vocab has {len(src_vocab)} pieces but the source model has "
                           f"model.vocab_size={src_cfg.vocab_size}: pass the source model's own tokenizer")
    n_special = len(SPECIAL_IDS)
    if len(tgt_vocab) <= n_special:
        raise SurgeryError(f"tgt_vocab has {len(tgt_vocab)} pieces; it needs more than the {n_special} "
                           f"special ones")
    src_ids: dict[str, int] = {}
    for i, piece in enumerate(src_vocab[n_special:], start=n_special):
        src_ids.setdefault(piece, i)

    # Target row t takes source row src_of[t]; specials map to themselves.
    tgt_rows, src_rows = list(range(n_special)), list(range(n_special))
    for t, piece in enumerate(tgt_vocab[n_special:], start=n_special):
        s = src_ids.get(piece)
        if s is not None:
            tgt_rows.append(t)
            src_rows.append(s)
    tgt_idx, src_idx = torch.tensor(tgt_rows), torch.tensor(src_rows)

    src_emb = src_sd[TOKENS]
    V, h = len(tgt_vocab), src_cfg.hidden_size
    g = torch.Generator().manual_seed(seed)
    # Draw the whole table first, so a row's random value depends on the seed only, not on the overlap.
    emb = torch.empty(V, h, dtype=torch.float32).normal_(0.0, src_cfg.init_std, generator=g).to(src_emb.dtype)
    emb[tgt_idx] = src_emb.detach()[src_idx]
    emb[PAD] = 0
    lang = {TOKENS: emb}
    for k in filter(is_head_bias, src_sd):
        b = torch.zeros(V, dtype=src_sd[k].dtype)
        b[tgt_idx] = src_sd[k].detach()[src_idx]
        lang[k] = b
    overlap = len(tgt_rows) - n_special
    report = {"vocab_size": V, "specials": n_special, "overlap": overlap,
              "share": overlap / (V - n_special), "copied": len(tgt_rows), "random": V - len(tgt_rows)}
    return dataclasses.replace(src_cfg, vocab_size=V), lang, report


# ---------------------------------------------------------------- mini-model <-> primary model

def check_compatible(primary_cfg: ModelConfig, primary_sd: StateDict, mini_cfg: ModelConfig,
                     mini_sd: StateDict, shared_layers: int | None = None) -> None:
    """Raise unless the mini-model belongs to the primary model: same layer geometry, and its embedding
    body (positions, embedding LayerNorm) and its bottom `shared_layers` layers bitwise equal to the
    primary's. `shared_layers` defaults to all of the mini-model's layers (MINIJOINT); for a MINIPOST
    mini-model pass N (its top layers are the bridge). Token embeddings and heads are not compared:
    they are language-specific or the mini-model's own."""
    for f in ("hidden_size", "num_heads", "ffn_size", "max_positions"):
        a, b = getattr(primary_cfg, f), getattr(mini_cfg, f)
        if a != b:
            raise SurgeryError(f"mini-model does not belong to this primary model: model.{f}={b} in the "
                               f"mini-model, {a} in the primary model")
    n = mini_cfg.num_layers if shared_layers is None else shared_layers
    if not 1 <= n <= min(mini_cfg.num_layers, primary_cfg.num_layers):
        raise SurgeryError(f"shared_layers={n} must be between 1 and min(mini model.num_layers="
                           f"{mini_cfg.num_layers}, primary model.num_layers={primary_cfg.num_layers})")
    check_state_dict(primary_cfg, primary_sd, "primary model")
    check_state_dict(mini_cfg, mini_sd, "mini-model")
    keys = ["embed.positions.weight", "embed.norm.weight", "embed.norm.bias"]
    keys += [f"layers.{i}.{k}" for i in range(n) for k in layer_shapes(mini_cfg)]
    for k in keys:
        a, b = primary_sd[k], mini_sd[k]
        if a.dtype != b.dtype or not torch.equal(a, b):
            diff = (a.float() - b.float()).abs().max().item()
            hint = ""
            if k.startswith("layers.") and shared_layers is None:
                hint = " (for a MINIPOST mini-model pass shared_layers=N: its top layers are new)"
            raise SurgeryError(f"mini-model does not belong to this primary model: {k} differs "
                               f"(dtype {b.dtype} vs {a.dtype}, max abs diff {diff:.3g}){hint}")

"""Model surgery: pure functions on `(ModelConfig, state_dict)` (paper §2).

Nothing here reads or writes files, builds an engine or touches a process group; every function returns a
new config and a new dict and never mutates its inputs. Every tensor in a returned dict is a fresh clone, so
training a model loaded from the result can never write into the source (and vice versa).

Each function checks key sets, shapes and hidden sizes first and raises `SurgeryError` naming the key,
the expected and the actual shape, or the config field that does not match.

    extract_minijoint        MINIJOINT: bottom N layers + the second head, promoted to the only head
    build_minipost           MINIPOST:  bottom N layers + 2 fresh bridge layers + the original MLM head
    minipost_trainable       the bridge layers, the only parameters trained in MINIPOST's Step 1b
    init_target_embeddings   a new language's embeddings: overlapping pieces copied, the rest N(0, 0.02)
    language_group           the language-specific tensors of a state dict (model.LANGUAGE_PARAMS)
    swap_embeddings          put a language group into any model of the same hidden size
    check_vocab              a language group against a tokenizer's size
    check_compatible         a mini-model against the primary model it should belong to
    to_hf_roberta, from_hf_roberta, hf_config   HF `RobertaForMaskedLM` key map (one table: HF_KEYS;
                             task heads: HF_TASK_KEYS, used by mm_ds.interop)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import torch

from .config import ModelConfig
from .model import LANGUAGE_PARAMS
from .tokens import PAD, SPECIAL_IDS

StateDict = Mapping[str, torch.Tensor]

TOKENS = "embed.tokens.weight"
HEAD_BIASES = ("head.bias", "aux_head.bias")  # the output biases in LANGUAGE_PARAMS, one per MLM head


class SurgeryError(ValueError):
    """A state dict or config that does not fit the surgery asked for; the message says what differs."""


# ---------------------------------------------------------------- expected keys and shapes

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
    h = cfg.hidden_size
    return {f"{prefix}.dense.weight": (h, h), f"{prefix}.dense.bias": (h,),
            f"{prefix}.norm.weight": (h,), f"{prefix}.norm.bias": (h,), f"{prefix}.bias": (cfg.vocab_size,)}


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every key of `RobertaMLM(cfg).state_dict()` and its shape, computed without building the model."""
    if cfg.vocab_size is None:
        raise SurgeryError("model.vocab_size is unset: resolve it from the tokenizer before surgery")
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {
        TOKENS: (cfg.vocab_size, h),
        "embed.positions.weight": (cfg.max_positions + PAD + 1, h),
        "embed.norm.weight": (h,), "embed.norm.bias": (h,),
    }
    for i in range(cfg.num_layers):
        out |= {f"layers.{i}.{k}": s for k, s in layer_shapes(cfg).items()}
    out |= _head_shapes("head", cfg)
    if cfg.aux_head_layer is not None:
        out |= _head_shapes("aux_head", cfg)
    return out


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_state_dict(cfg: ModelConfig, sd: StateDict, what: str = "state dict") -> None:
    """Raise SurgeryError unless `sd` has exactly the keys and shapes of `RobertaMLM(cfg)`."""
    want = expected_shapes(cfg)
    missing = [k for k in want if k not in sd]
    extra = sorted(k for k in sd if k not in want)
    if missing or extra:
        hint = ""
        if any(k.startswith("aux_head.") for k in missing + extra):
            hint = f" (model.aux_head_layer={cfg.aux_head_layer} decides whether aux_head.* exists)"
        elif any(k.startswith("layers.") for k in missing + extra):
            hint = f" (model.num_layers={cfg.num_layers})"
        raise SurgeryError(f"{what} does not match its config{hint}: "
                           f"missing {_few(missing)}; unexpected {_few(extra)}")
    for k, s in want.items():
        if _shape(sd[k]) != s:
            raise SurgeryError(f"{what}: {k} has shape {_shape(sd[k])}, expected {s} from its config "
                               f"(vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}, "
                               f"ffn_size={cfg.ffn_size}, max_positions={cfg.max_positions})")


def _few(keys: list[str], n: int = 6) -> str:
    if not keys:
        return "none"
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


# ---------------------------------------------------------------- MINIJOINT (§2.2)

def extract_minijoint(cfg: ModelConfig, sd: StateDict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The mini-model of a dual-head model: embeddings, the bottom N = cfg.aux_head_layer layers, and the
    second head renamed `aux_head.*` -> `head.*` (its only head). Its logits equal the source's `logits_aux`."""
    n = cfg.aux_head_layer
    if n is None:
        raise SurgeryError("extract_minijoint needs a dual-head (MINIJOINT) model, but model.aux_head_layer "
                           "is None; for a single-head model use build_minipost")
    check_state_dict(cfg, sd, "dual-head model")
    mini_cfg = dataclasses.replace(cfg, num_layers=n, aux_head_layer=None)
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k.startswith("embed."):
            out[k] = _clone(v)
        elif k.startswith("layers.") and int(k.split(".")[1]) < n:
            out[k] = _clone(v)
        elif k.startswith("aux_head."):
            out["head." + k[len("aux_head."):]] = _clone(v)
    check_state_dict(mini_cfg, out, "extracted mini-model")
    return mini_cfg, out


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
    if cfg.aux_head_layer is not None:
        raise SurgeryError(f"build_minipost needs a single-head model, but model.aux_head_layer="
                           f"{cfg.aux_head_layer}; for a dual-head model use extract_minijoint")
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
        raise SurgeryError(f"state dict has no {TOKENS}; keys start with {_few(sorted(sd), 4)}")
    return {k: _clone(sd[k]) for k in LANGUAGE_PARAMS if k in sd}


def _check_group(lang_sd: StateDict) -> tuple[int, int]:
    """(vocab, hidden) of a language group, after checking its keys and that its shapes agree."""
    extra = sorted(k for k in lang_sd if k not in LANGUAGE_PARAMS)
    if extra:
        raise SurgeryError(f"language group has non-language keys {_few(extra)}; it may only hold "
                           f"{', '.join(LANGUAGE_PARAMS)} (use language_group(sd) to take them)")
    if TOKENS not in lang_sd:
        raise SurgeryError(f"language group has no {TOKENS}")
    emb = lang_sd[TOKENS]
    if emb.dim() != 2:
        raise SurgeryError(f"language group: {TOKENS} has shape {_shape(emb)}, expected (vocab, hidden)")
    V, h = emb.shape
    for k in HEAD_BIASES:
        if k in lang_sd and _shape(lang_sd[k]) != (V,):
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
    vocab_size is the group's. Every MLM head the target has (`head.bias`, `aux_head.bias`) must get a bias
    from the group; a bias in the group for a head the target lacks (a downstream model, a mini-model) is
    ignored, so one group serves every model of the system. Positions, the embedding LayerNorm and all
    other tensors are body: copied unchanged."""
    V, h = _check_group(lang_sd)
    if TOKENS not in sd:
        raise SurgeryError(f"target model has no {TOKENS}; keys start with {_few(sorted(sd), 4)}")
    if h != cfg.hidden_size:
        raise SurgeryError(f"language group has hidden size {h} ({TOKENS} {_shape(lang_sd[TOKENS])}) but the "
                           f"target model has model.hidden_size={cfg.hidden_size}")
    want = (cfg.vocab_size, cfg.hidden_size)
    if _shape(sd[TOKENS]) != want:
        raise SurgeryError(f"target model: {TOKENS} has shape {_shape(sd[TOKENS])}, expected {want} from its "
                           f"config (model.vocab_size, model.hidden_size)")
    missing = [k for k in HEAD_BIASES if k in sd and k not in lang_sd]
    if missing:
        raise SurgeryError(f"target model has MLM head bias(es) {', '.join(missing)} but the language group "
                           f"has none; take the group from an MLM with the same heads")
    for k in HEAD_BIASES:
        if k in sd and _shape(sd[k]) != (cfg.vocab_size,):
            raise SurgeryError(f"target model: {k} has shape {_shape(sd[k])}, expected ({cfg.vocab_size},) "
                               f"from model.vocab_size")
    out = {k: _clone(v) for k, v in sd.items()}
    for k in (TOKENS, *HEAD_BIASES):
        if k in sd:
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

    Output biases (`head.bias`, and `aux_head.bias` when the source has a second head): copied for the same
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
    for k in HEAD_BIASES:
        if k in src_sd:
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


# ---------------------------------------------------------------- HF RobertaForMaskedLM key map

# The one table between our keys and HF `RobertaForMaskedLM`'s. A tuple on the HF side is concatenated
# along dim 0 (our fused q/k/v; the rows of each part are head-major in both). "{i}" is a layer index.
HF_KEYS: tuple[tuple[str, str | tuple[str, ...]], ...] = (
    ("embed.tokens.weight", "roberta.embeddings.word_embeddings.weight"),
    ("embed.positions.weight", "roberta.embeddings.position_embeddings.weight"),  # + token type row: see below
    ("embed.norm.weight", "roberta.embeddings.LayerNorm.weight"),
    ("embed.norm.bias", "roberta.embeddings.LayerNorm.bias"),
    ("layers.{i}.attn.qkv.weight", tuple(f"roberta.encoder.layer.{{i}}.attention.self.{p}.weight"
                                         for p in ("query", "key", "value"))),
    ("layers.{i}.attn.qkv.bias", tuple(f"roberta.encoder.layer.{{i}}.attention.self.{p}.bias"
                                       for p in ("query", "key", "value"))),
    ("layers.{i}.attn.out.weight", "roberta.encoder.layer.{i}.attention.output.dense.weight"),
    ("layers.{i}.attn.out.bias", "roberta.encoder.layer.{i}.attention.output.dense.bias"),
    ("layers.{i}.attn_norm.weight", "roberta.encoder.layer.{i}.attention.output.LayerNorm.weight"),
    ("layers.{i}.attn_norm.bias", "roberta.encoder.layer.{i}.attention.output.LayerNorm.bias"),
    ("layers.{i}.ffn.fc1.weight", "roberta.encoder.layer.{i}.intermediate.dense.weight"),
    ("layers.{i}.ffn.fc1.bias", "roberta.encoder.layer.{i}.intermediate.dense.bias"),
    ("layers.{i}.ffn.fc2.weight", "roberta.encoder.layer.{i}.output.dense.weight"),
    ("layers.{i}.ffn.fc2.bias", "roberta.encoder.layer.{i}.output.dense.bias"),
    ("layers.{i}.ffn_norm.weight", "roberta.encoder.layer.{i}.output.LayerNorm.weight"),
    ("layers.{i}.ffn_norm.bias", "roberta.encoder.layer.{i}.output.LayerNorm.bias"),
    ("head.dense.weight", "lm_head.dense.weight"),
    ("head.dense.bias", "lm_head.dense.bias"),
    ("head.norm.weight", "lm_head.layer_norm.weight"),
    ("head.norm.bias", "lm_head.layer_norm.bias"),
    ("head.bias", "lm_head.bias"),
)
# Downstream heads (mm_ds.heads, `task_head.*`) <-> HF RobertaForSequenceClassification / ...ForQuestionAnswering,
# by task kind (mm_ds.data.tasks); their body is HF_KEYS without the MLM head rows.
HF_TASK_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "pair_classification": (("task_head.dense.weight", "classifier.dense.weight"),
                            ("task_head.dense.bias", "classifier.dense.bias"),
                            ("task_head.out_proj.weight", "classifier.out_proj.weight"),
                            ("task_head.out_proj.bias", "classifier.out_proj.bias")),
    "extractive_qa": (("task_head.qa_outputs.weight", "qa_outputs.weight"),
                      ("task_head.qa_outputs.bias", "qa_outputs.bias")),
}
# HF keeps tied copies of the output projection: written on export, checked equal on import.
HF_TIED = {"lm_head.decoder.weight": "embed.tokens.weight", "lm_head.decoder.bias": "head.bias"}
# RoBERTa's single token-type row is added to every token: folded into our positions (import), zeros (export).
HF_TOKEN_TYPE = "roberta.embeddings.token_type_embeddings.weight"
# Present in some HF state dicts, unused by an MLM: ignored on import.
HF_IGNORED_PREFIXES = ("roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids", "roberta.pooler.")


def _hf_rows(cfg: ModelConfig):
    for ours, hf in HF_KEYS:
        if "{i}" in ours:
            for i in range(cfg.num_layers):
                yield ours.format(i=i), (tuple(x.format(i=i) for x in hf) if isinstance(hf, tuple)
                                         else hf.format(i=i))
        else:
            yield ours, hf


def hf_config(cfg: ModelConfig) -> dict:
    """`RobertaConfig(**hf_config(cfg))` describes the model `to_hf_roberta` exports."""
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.ffn_size, "hidden_act": "gelu",
            "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
            "max_position_embeddings": cfg.max_positions + PAD + 1, "type_vocab_size": 1,
            "initializer_range": cfg.init_std, "layer_norm_eps": cfg.layer_norm_eps,
            "pad_token_id": PAD, "bos_token_id": SPECIAL_IDS[0], "eos_token_id": SPECIAL_IDS[2],
            "tie_word_embeddings": True, "model_type": "roberta"}


def to_hf_roberta(cfg: ModelConfig, sd: StateDict, drop_aux_head: bool = False) -> dict[str, torch.Tensor]:
    """Our MLM as an HF `RobertaForMaskedLM` state dict (config: `hf_config(cfg)`). The token-type table is
    one row of zeros (our positions already hold anything folded in on import). HF has no second head:
    a MINIJOINT model needs `drop_aux_head=True` (or `extract_minijoint` first)."""
    check_state_dict(cfg, sd, "model")
    if cfg.aux_head_layer is not None and not drop_aux_head:
        raise SurgeryError(f"model.aux_head_layer={cfg.aux_head_layer}: HF RobertaForMaskedLM has no second "
                           f"head; pass drop_aux_head=True to export the main head only")
    out: dict[str, torch.Tensor] = {}
    for ours, hf in _hf_rows(cfg):
        t = sd[ours]
        if isinstance(hf, tuple):
            for name, part in zip(hf, t.chunk(len(hf), dim=0)):
                out[name] = _clone(part)
        else:
            out[hf] = _clone(t)
    for hf, ours in HF_TIED.items():
        out[hf] = _clone(sd[ours])
    out[HF_TOKEN_TYPE] = torch.zeros(1, cfg.hidden_size, dtype=sd[TOKENS].dtype)
    return out


def from_hf_roberta(hf_cfg: Mapping, hf_sd: StateDict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """An HF `RobertaForMaskedLM` (config as a dict, e.g. `config.to_dict()`, and state dict) as our
    (ModelConfig, state dict). The single token-type row is added to every row of our position table:
    HF adds it to every token, so the forward pass is the same up to float rounding. Needs pad_token_id=1,
    hidden_act=gelu, absolute positions, type_vocab_size=1 and tied output embeddings."""
    def need(key, ok, want):
        if key in hf_cfg and not ok(hf_cfg[key]):
            raise SurgeryError(f"HF config {key}={hf_cfg[key]!r} is not supported: our model needs {key}={want}")

    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings"):
        if key not in hf_cfg:
            raise SurgeryError(f"HF config has no {key}")
    need("pad_token_id", lambda v: v == PAD, PAD)
    need("hidden_act", lambda v: v == "gelu", "'gelu'")
    need("position_embedding_type", lambda v: v == "absolute", "'absolute'")
    need("type_vocab_size", lambda v: v == 1, 1)
    need("tie_word_embeddings", lambda v: v is True, True)
    need("is_decoder", lambda v: v is False, False)
    if hf_cfg["max_position_embeddings"] <= PAD + 1:
        raise SurgeryError(f"HF config max_position_embeddings={hf_cfg['max_position_embeddings']} leaves no "
                           f"position for a token (RoBERTa offsets positions by pad_token_id+1={PAD + 1})")
    cfg = ModelConfig(vocab_size=hf_cfg["vocab_size"], hidden_size=hf_cfg["hidden_size"],
                      num_layers=hf_cfg["num_hidden_layers"], num_heads=hf_cfg["num_attention_heads"],
                      ffn_size=hf_cfg["intermediate_size"],
                      max_positions=hf_cfg["max_position_embeddings"] - PAD - 1,
                      dropout=hf_cfg.get("hidden_dropout_prob", ModelConfig.dropout),
                      layer_norm_eps=hf_cfg.get("layer_norm_eps", ModelConfig.layer_norm_eps),
                      init_std=hf_cfg.get("initializer_range", ModelConfig.init_std))
    try:
        cfg.check()
    except ValueError as e:
        raise SurgeryError(f"HF config does not give a valid model: {e}") from e

    rows = list(_hf_rows(cfg))
    known = {n for _, hf in rows for n in (hf if isinstance(hf, tuple) else (hf,))} | set(HF_TIED) | {HF_TOKEN_TYPE}
    present = {k for k in hf_sd if not k.startswith(HF_IGNORED_PREFIXES)}
    missing = sorted(known - present - set(HF_TIED))
    extra = sorted(present - known)
    if missing or extra:
        raise SurgeryError(f"HF state dict does not match RobertaForMaskedLM with num_hidden_layers="
                           f"{cfg.num_layers}: missing {_few(missing)}; unexpected {_few(extra)}")
    want = expected_shapes(cfg)
    for ours, hf in rows:
        for n in (hf if isinstance(hf, tuple) else (hf,)):
            s = want[ours] if not isinstance(hf, tuple) else (want[ours][0] // len(hf), *want[ours][1:])
            if _shape(hf_sd[n]) != s:
                raise SurgeryError(f"HF {n} has shape {_shape(hf_sd[n])}, expected {s} from the HF config "
                                   f"(vocab_size, hidden_size, intermediate_size, max_position_embeddings)")
    sd: dict[str, torch.Tensor] = {}
    for ours, hf in rows:
        if isinstance(hf, tuple):
            sd[ours] = torch.cat([hf_sd[n].detach() for n in hf], dim=0)
        else:
            sd[ours] = _clone(hf_sd[hf])
    tt = hf_sd[HF_TOKEN_TYPE]
    if _shape(tt) != (1, cfg.hidden_size):
        raise SurgeryError(f"HF {HF_TOKEN_TYPE} has shape {_shape(tt)}, expected (1, {cfg.hidden_size})")
    sd["embed.positions.weight"] = sd["embed.positions.weight"] + tt.detach().to(sd["embed.positions.weight"].dtype)
    check_state_dict(cfg, sd, "imported HF model")
    for hf, ours in HF_TIED.items():
        if hf in hf_sd and not torch.equal(hf_sd[hf], sd[ours]):
            raise SurgeryError(f"HF {hf} is not tied to {dict(_hf_rows(cfg))[ours]}: our model ties the "
                               f"output projection to the token embeddings")
    return cfg, sd

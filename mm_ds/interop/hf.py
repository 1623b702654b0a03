"""Our MLM's state dict <-> Hugging Face `RobertaForMaskedLM`'s (and the task heads'), by one key table.

Pure functions on (config, state dict), like mm_ds.model.surgery: no files, no engines.

    HF_KEYS, HF_TASK_KEYS   the key tables (MLM body and head; task heads by task type)
    hf_rows(cfg)            the table expanded for a config's layers
    to_hf_keys              our keys -> HF names for the rows of HF_KEYS a state dict has: the one loop both
                            MLM and task exports (mm_ds.interop.export) go through
    to_hf_roberta, from_hf_roberta, hf_config   a whole RobertaForMaskedLM
    model_config            our ModelConfig of an HF config (no weights needed)
    check_hf_shapes         what from_hf_roberta checks, from the tensors' shapes alone (a safetensors header)
    token_type_fold         what an import does with the token-type table (recorded in the import's meta)
"""

from __future__ import annotations

from typing import Iterator, Mapping

import torch

from ..config import ModelConfig
from ..model.model import param_shapes
from ..model.surgery import TOKENS, StateDict, SurgeryError, check_state_dict, few_keys
from ..tokens import PAD, SPECIAL_IDS

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
# Downstream heads (mm_ds.model.heads, `task_head.*`) <-> HF RobertaForSequenceClassification / ...ForQuestionAnswering,
# by task type (mm_ds.data.tasks); their body is HF_KEYS without the MLM head rows.
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
# Row 0 of the token-type table is added to every token of a single-segment input (all RoBERTa ever sees; mm-ds
# feeds no token types): folded into our positions on import, one row of zeros on export.
HF_TOKEN_TYPE = "roberta.embeddings.token_type_embeddings.weight"
# Present in some HF state dicts, unused by an MLM: ignored on import.
HF_IGNORED_PREFIXES = ("roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids", "roberta.pooler.")


def hf_rows(cfg: ModelConfig) -> Iterator[tuple[str, str | tuple[str, ...]]]:
    """(our key, HF name or names) of every HF_KEYS row, "{i}" expanded over `cfg.num_layers` layers."""
    for ours, hf in HF_KEYS:
        if "{i}" in ours:
            for i in range(cfg.num_layers):
                yield ours.format(i=i), (tuple(x.format(i=i) for x in hf) if isinstance(hf, tuple)
                                         else hf.format(i=i))
        else:
            yield ours, hf


def to_hf_keys(cfg: ModelConfig, sd: StateDict, mlm_head: bool = True) -> dict[str, torch.Tensor]:
    """Fresh copies of `sd`'s HF_KEYS tensors under their HF names (fused q/k/v split in three), plus the
    token-type table as one row of zeros (our positions already hold anything folded in on import). With
    `mlm_head=False` the MLM head rows are left out: the body of a task model. Shapes are the caller's to
    check (`check_state_dict`, or the task model's own check)."""
    out: dict[str, torch.Tensor] = {}
    for ours, hf in hf_rows(cfg):
        if not mlm_head and ours.startswith("head."):
            continue
        t = sd[ours].detach()
        if isinstance(hf, tuple):
            out |= {name: part.clone() for name, part in zip(hf, t.chunk(len(hf), dim=0))}
        else:
            out[hf] = t.clone()
    out[HF_TOKEN_TYPE] = torch.zeros(1, cfg.hidden_size, dtype=sd[TOKENS].dtype)
    return out


def hf_config(cfg: ModelConfig) -> dict:
    """`RobertaConfig(**hf_config(cfg))` describes the model `to_hf_roberta` exports."""
    return {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.ffn_size, "hidden_act": "gelu",
            "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout,
            "max_position_embeddings": cfg.max_positions + PAD + 1, "type_vocab_size": 1,
            "initializer_range": cfg.init_std, "layer_norm_eps": cfg.layer_norm_eps,
            "pad_token_id": PAD, "bos_token_id": SPECIAL_IDS[0], "eos_token_id": SPECIAL_IDS[2],
            "tie_word_embeddings": True, "model_type": "roberta"}


def to_hf_roberta(cfg: ModelConfig, sd: StateDict, drop_secondary_head: bool = False) -> dict[str, torch.Tensor]:
    """Our MLM as an HF `RobertaForMaskedLM` state dict (config: `hf_config(cfg)`). The token-type table is
    one row of zeros (our positions already hold anything folded in on import). HF has no secondary head:
    a MINIJOINT model needs `drop_secondary_head=True` (or `extract_minijoint` first)."""
    check_state_dict(cfg, sd, "model")
    if cfg.secondary_head_layer is not None and not drop_secondary_head:
        raise SurgeryError(f"model.secondary_head_layer={cfg.secondary_head_layer}: HF RobertaForMaskedLM has no "
                           f"secondary head; pass drop_secondary_head=True to export the main head only")
    out = to_hf_keys(cfg, sd)
    for hf, ours in HF_TIED.items():
        out[hf] = sd[ours].detach().clone()
    return out


def model_config(hf_cfg: Mapping) -> ModelConfig:
    """Our ModelConfig of an HF RoBERTa/XLM-R config (a dict, e.g. config.json's), or a SurgeryError naming
    the key it cannot take: what `from_hf_roberta` builds, known before any weights are read."""
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
    return cfg


def check_hf_shapes(hf_cfg: Mapping, shapes: Mapping[str, tuple]) -> ModelConfig:
    """Our ModelConfig of an HF `RobertaForMaskedLM` whose state dict has these shapes (name -> shape), or a
    SurgeryError naming the missing, unexpected or misshapen key: what `from_hf_roberta` checks, known from a
    safetensors header alone (`mm-ds extend --check`)."""
    cfg = model_config(hf_cfg)
    rows = list(hf_rows(cfg))
    known = {n for _, hf in rows for n in (hf if isinstance(hf, tuple) else (hf,))} | set(HF_TIED) | {HF_TOKEN_TYPE}
    present = {k for k in shapes if not k.startswith(HF_IGNORED_PREFIXES)}
    missing = sorted(known - present - set(HF_TIED))
    extra = sorted(present - known)
    if missing or extra:
        raise SurgeryError(f"HF state dict does not match RobertaForMaskedLM with num_hidden_layers="
                           f"{cfg.num_layers}: missing {few_keys(missing)}; unexpected {few_keys(extra)}")
    want = param_shapes(cfg)
    for ours, hf in rows:
        for n in (hf if isinstance(hf, tuple) else (hf,)):
            s = want[ours] if not isinstance(hf, tuple) else (want[ours][0] // len(hf), *want[ours][1:])
            if tuple(shapes[n]) != s:
                raise SurgeryError(f"HF {n} has shape {tuple(shapes[n])}, expected {s} from the HF config "
                                   f"(vocab_size, hidden_size, intermediate_size, max_position_embeddings)")
    _check_token_type(hf_cfg, tuple(shapes[HF_TOKEN_TYPE]))
    return cfg


def _check_token_type(hf_cfg: Mapping, shape: tuple) -> None:
    h = hf_cfg["hidden_size"]
    n = hf_cfg.get("type_vocab_size", shape[0] if shape else 0)
    if len(shape) != 2 or shape[0] < 1 or shape != (n, h):
        raise SurgeryError(f"HF {HF_TOKEN_TYPE} has shape {shape}, expected (type_vocab_size={n}, "
                           f"hidden_size={h}) with at least one row: row 0 is the one folded into the positions")


def from_hf_roberta(hf_cfg: Mapping, hf_sd: StateDict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """An HF `RobertaForMaskedLM` (config as a dict, e.g. `config.to_dict()`, and state dict) as our
    (ModelConfig, state dict). Row 0 of the token-type table is added to every row of our position table:
    HF adds it to every token whose token_type_ids is 0, so the forward pass of single-segment input is the
    same up to float rounding; rows 1.. are dropped (see token_type_fold). Needs pad_token_id=1,
    hidden_act=gelu, absolute positions and tied output embeddings."""
    cfg = check_hf_shapes(hf_cfg, {k: tuple(v.shape) for k, v in hf_sd.items()})
    rows = list(hf_rows(cfg))
    sd: dict[str, torch.Tensor] = {}
    for ours, hf in rows:
        if isinstance(hf, tuple):
            sd[ours] = torch.cat([hf_sd[n].detach() for n in hf], dim=0)
        else:
            sd[ours] = hf_sd[hf].detach().clone()
    row0 = hf_sd[HF_TOKEN_TYPE][0].detach().to(sd["embed.positions.weight"].dtype)
    sd["embed.positions.weight"] = sd["embed.positions.weight"] + row0  # (P, H) + (H,): every position
    check_state_dict(cfg, sd, "imported HF model")
    for hf, ours in HF_TIED.items():
        if hf in hf_sd and not torch.equal(hf_sd[hf], sd[ours]):
            raise SurgeryError(f"HF {hf} is not tied to {dict(hf_rows(cfg))[ours]}: our model ties the "
                               f"output projection to the token embeddings")
    return cfg, sd


def token_type_fold(hf_cfg: Mapping, hf_sd: StateDict) -> dict:
    """What `from_hf_roberta` does with HF's token-type table, as recorded in an import's meta: row 0 is
    folded into the positions; rows 1.. (type_vocab_size > 1, e.g. transformers' default 2) are dropped, so
    the import reproduces the model on token_type_ids = 0 only. That is how RoBERTa and XLM-R are trained and
    used (pairs are joined with </s></s>, not token types) and all mm-ds feeds. A model fine-tuned to read
    token type 1 is imported without it: its pair inputs will differ. Refused: a table that does not match the
    config (shape (type_vocab_size, hidden_size), at least one row)."""
    tt = hf_sd[HF_TOKEN_TYPE]
    _check_token_type(hf_cfg, tuple(tt.shape))
    note = {"token_type_rows": int(tt.shape[0]), "folded": "row 0 added to every position embedding"}
    if tt.shape[0] > 1:
        same = bool(torch.equal(tt[1:], tt[:1].expand_as(tt[1:])))
        note["dropped"] = (f"rows 1..{tt.shape[0] - 1} ({'equal to' if same else 'different from'} row 0): "
                           f"the model is imported for token_type_ids = 0 only, as RoBERTa is used")
    return note

"""`mm-ds import --from fairseq`: a fairseq RoBERTa (model.pt + dict.txt + SentencePiece model), the paper's own
format, as an mm-ds Step-1 run directory (mm_ds.interop.importers); its key map is `FAIRSEQ_KEYS`."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..config import ConfigError, ModelConfig
from ..data.tokenizer import has_our_ids
from ..model import surgery
from ..model.model import param_shapes
from ..tokens import PAD
from . import spm as spm_io
from .importers import finish_import, imported_meta, load_pickle, out_final, to_fp32
from .spm import InteropError
from .vocab import SourceVocab, find_tokenizer

FS_EMBED = "encoder.sentence_encoder.embed_tokens.weight"


def _as_dict(x) -> dict:
    if x is None:
        return {}
    if isinstance(x, argparse.Namespace):
        return vars(x)
    try:
        return dict(x)
    except (TypeError, ValueError):
        return {k: getattr(x, k) for k in dir(x) if not k.startswith("_")}


def fairseq_args(ckpt: dict, path: Path) -> dict:
    """The model arguments of a fairseq checkpoint: `cfg["model"]` (fairseq >= 0.10) or `args`."""
    cfg = _as_dict(ckpt.get("cfg"))
    args = _as_dict(cfg.get("model")) or _as_dict(ckpt.get("args"))
    if not args:
        raise InteropError(f"{path}: no model arguments (neither cfg['model'] nor args); the number of "
                           f"attention heads cannot be read from the weights alone")
    return args


# fairseq RoBERTa -> ours. A tuple is concatenated along dim 0 (q, k, v). "{i}" is a layer index.
_FS_LAYER = "encoder.sentence_encoder.layers.{i}."
FAIRSEQ_KEYS: tuple[tuple[str, str | tuple[str, ...]], ...] = (
    ("embed.tokens.weight", FS_EMBED),
    ("embed.positions.weight", "encoder.sentence_encoder.embed_positions.weight"),
    ("embed.norm.weight", "encoder.sentence_encoder.emb_layer_norm.weight"),
    ("embed.norm.bias", "encoder.sentence_encoder.emb_layer_norm.bias"),
    *((f"layers.{{i}}.attn.qkv.{p}", tuple(f"{_FS_LAYER}self_attn.{x}_proj.{p}" for x in "qkv"))
      for p in ("weight", "bias")),
    *((f"layers.{{i}}.{ours}.{p}", f"{_FS_LAYER}{fs}.{p}")
      for ours, fs in (("attn.out", "self_attn.out_proj"), ("attn_norm", "self_attn_layer_norm"),
                       ("ffn.fc1", "fc1"), ("ffn.fc2", "fc2"), ("ffn_norm", "final_layer_norm"))
      for p in ("weight", "bias")),
    ("head.dense.weight", "encoder.lm_head.dense.weight"), ("head.dense.bias", "encoder.lm_head.dense.bias"),
    ("head.norm.weight", "encoder.lm_head.layer_norm.weight"),
    ("head.norm.bias", "encoder.lm_head.layer_norm.bias"),
    ("head.bias", "encoder.lm_head.bias"),
)
FAIRSEQ_TIED = ("encoder.lm_head.weight", FS_EMBED)
FAIRSEQ_IGNORED = ("encoder.classification_heads.", "classification_heads.")


def _fairseq_rename(k: str) -> str:
    """Older spellings: RoBERTa's first release said `decoder.`; fairseq >= 0.10 says `layernorm_embedding`."""
    if k.startswith("decoder."):
        k = "encoder." + k[len("decoder."):]
    return k.replace(".layernorm_embedding.", ".emb_layer_norm.")


def from_fairseq(args: dict, fs_sd: dict, where: str) -> tuple[ModelConfig, dict]:
    """(ModelConfig, state dict) of a fairseq RoBERTa encoder + LM head."""
    def need(key, ok, want):
        if key in args and not ok(args[key]):
            raise InteropError(f"{where}: args {key}={args[key]!r} is not supported; mm-ds needs {want}")

    need("activation_fn", lambda v: v == "gelu", "'gelu'")
    need("encoder_normalize_before", lambda v: not v, "False (post-LayerNorm RoBERTa)")
    need("untie_weights_roberta", lambda v: not v, "False (tied output embeddings)")
    need("encoder_learned_pos", lambda v: v, "True")
    sd: dict = {}
    for k, v in fs_sd.items():
        if not torch.is_tensor(v) or k.endswith(".version") or k.startswith(FAIRSEQ_IGNORED):
            continue
        if ".self_attn.in_proj_" in k:  # fairseq < 0.9: one fused projection, our own layout
            pre, p = k.rsplit(".in_proj_", 1)
            for x, part in zip("qkv", v.chunk(3, dim=0)):
                sd[_fairseq_rename(f"{pre}.{x}_proj.{p}")] = part
        else:
            sd[_fairseq_rename(k)] = v
    for key in ("encoder_embed_dim", "encoder_layers", "encoder_attention_heads", "encoder_ffn_embed_dim"):
        if key not in args:
            raise InteropError(f"{where}: model arguments have no {key}")
    for k in (FS_EMBED, "encoder.sentence_encoder.embed_positions.weight"):
        if k not in sd:
            raise InteropError(f"{where}: no {k}; is this a fairseq RoBERTa checkpoint?")
    P = sd["encoder.sentence_encoder.embed_positions.weight"].shape[0]
    cfg = ModelConfig(vocab_size=sd[FS_EMBED].shape[0], hidden_size=args["encoder_embed_dim"],
                      num_layers=args["encoder_layers"], num_heads=args["encoder_attention_heads"],
                      ffn_size=args["encoder_ffn_embed_dim"], max_positions=P - PAD - 1,
                      dropout=float(args.get("dropout", ModelConfig.dropout)))
    try:
        cfg.check()
    except ConfigError as e:
        raise InteropError(f"{where}: the model arguments do not give a valid model: {e}") from e
    want = param_shapes(cfg)
    rows = []
    for ours, fs in FAIRSEQ_KEYS:
        for i in (range(cfg.num_layers) if "{i}" in ours else (None,)):
            o = ours.format(i=i)
            rows.append((o, tuple(f.format(i=i) for f in fs) if isinstance(fs, tuple) else (fs.format(i=i),)))
    known = {n for _, names in rows for n in names} | {FAIRSEQ_TIED[0]}
    missing = sorted({n for _, names in rows for n in names} - set(sd))
    extra = sorted(set(sd) - known)
    if missing or extra:
        raise InteropError(f"{where}: keys do not match a fairseq RoBERTa with encoder_layers={cfg.num_layers}: "
                           f"missing {surgery.few_keys(missing)}; unexpected {surgery.few_keys(extra)}")
    out = {}
    for o, names in rows:
        s = want[o] if len(names) == 1 else (want[o][0] // len(names), *want[o][1:])
        for n in names:
            if tuple(sd[n].shape) != s:
                raise InteropError(f"{where}: {n} has shape {tuple(sd[n].shape)}, expected {s} from the model "
                                   f"arguments (encoder_embed_dim, encoder_ffn_embed_dim) and {FS_EMBED}")
        out[o] = torch.cat([sd[n] for n in names], dim=0) if len(names) > 1 else sd[names[0]].clone()
    tied = sd.get(FAIRSEQ_TIED[0])
    if tied is not None and not torch.equal(tied, sd[FS_EMBED]):
        raise InteropError(f"{where}: {FAIRSEQ_TIED[0]} is not tied to {FS_EMBED}; mm-ds ties the output "
                           f"projection to the token embeddings")
    return cfg, out


def import_fairseq(src: str | Path, out: str | Path, tokenizer: str | Path | None = None,
                   no_tokenizer: bool = False, trust_pickle: bool = False, system: str = "bl_base",
                   lang: str = "en", force: bool = False) -> dict:
    """A fairseq RoBERTa (`model.pt`, or any `.pt` given directly, with `dict.txt` and a SentencePiece model
    beside it) as `out/final/`. Rows follow dict.txt (see mm_ds.interop.spm); returns the written meta."""
    src = Path(src)
    pt = src if src.is_file() else src / "model.pt"
    home = pt.parent
    if not pt.is_file():
        found = sorted(p.name for p in home.glob("*.pt")) if home.is_dir() else []
        raise InteropError(f"{pt} does not exist" + (f"; pass one of {', '.join(found)} directly" if found else ""))
    final = out_final(out, force)
    ckpt = load_pickle(pt, trust_pickle, "checkpoint")
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise InteropError(f"{pt}: no 'model' state dict; is this a fairseq checkpoint?")
    fs_sd, dtypes = to_fp32(ckpt["model"])
    args = fairseq_args(ckpt, pt)
    cfg, sd = from_fairseq(args, fs_sd, str(pt))
    spm_src = find_tokenizer(home, tokenizer, no_tokenizer)
    rows = None
    if spm_src is not None:
        dict_txt = home / "dict.txt"
        if dict_txt.is_file():
            rows = spm_io.rows_of_fairseq_dict(dict_txt)
            if len(rows) != cfg.vocab_size:
                raise InteropError(f"{dict_txt}: {len(rows) - 5} pieces + 5 specials = {len(rows)} rows, but "
                                   f"{pt.name} {FS_EMBED} has {cfg.vocab_size}: the dictionary belongs to "
                                   f"another model")
        else:  # no dictionary: only a tokenizer whose ids already are the rows will do
            rows = spm_io.rows_of(spm_src, cfg.vocab_size, f"{pt.name} {FS_EMBED}")
            if not has_our_ids(spm_io.load(spm_src)):
                raise InteropError(f"{home}: no dict.txt; fairseq's row order comes from it (or pass --tokenizer "
                                   f"with a model whose ids equal the rows)")
    source = {"format": "fairseq", "path": str(pt.resolve()), "dtype": dtypes,
              "arch": args.get("arch") or args.get("_name")}
    vocab = SourceVocab(spm_src, rows) if spm_src is not None else None
    return finish_import(final, cfg, sd, imported_meta(cfg, system, lang, source), vocab)

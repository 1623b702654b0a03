"""Foreign checkpoints -> an mm-ds Step-1 run directory (`OUT/final/`), usable as `parent=OUT` by build-mini
(MINIPOST) and adapt (BL_BASE) like a model this system pretrained.

    import_hf         HF RobertaForMaskedLM / XLMRobertaForMaskedLM directory (config.json + safetensors/bin)
    import_fairseq    fairseq RoBERTa (model.pt + dict.txt + SentencePiece model), the paper's own format
    import_deepspeed  an engine checkpoint of this system (any ZeRO stage) -> plain fp32 final/ weights

Nothing here unpickles arbitrary objects: `.bin`/`.pt` files are read with `torch.load(weights_only=True)`
(fairseq's `argparse.Namespace` args allowed); anything else needs `trust_pickle=True`, which runs the
file's pickle code and is only for files from a source you trust.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import shutil
from pathlib import Path

import torch

from ..runtime.checkpointing import checkpoint
from ..model import surgery
from ..config import ConfigError, ModelConfig, to_dict
from ..data.tokenizer import has_our_ids
from ..model.model import is_language_param, param_shapes
from ..tokens import PAD
from . import hf
from . import spm as spm_io
from .spm import InteropError
from .vocab import SourceVocab, find_tokenizer, hf_dir_vocab

HF_MLM_ARCHS = ("RobertaForMaskedLM", "XLMRobertaForMaskedLM")
HF_MODEL_TYPES = ("roberta", "xlm-roberta")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")
HF_EMBED = "roberta.embeddings.word_embeddings.weight"
FS_EMBED = "encoder.sentence_encoder.embed_tokens.weight"


def _out_final(out: str | Path, force: bool) -> Path:
    final = Path(out) / checkpoint.FINAL
    if final.exists() and not force:
        raise InteropError(f"{final} already exists; pass --force to replace it")
    return final


def _import_meta(cfg: ModelConfig, system: str, lang: str, source: dict) -> dict:
    return {"stage": "pretrain", "system": system, "lang": lang, "step": 0, "tokens": 0, "flops": 0.0,
            "flops_cumulative": 0.0, "parent": None, "model": to_dict(cfg), "tokenizer": None,
            "imported_from": source, "time": checkpoint.now()}


def _finish(final: Path, cfg: ModelConfig, sd: dict, meta: dict, vocab: SourceVocab | None) -> dict:
    """Permute the language-specific rows into mm-ds's layout, write final/ (+ spm.model or tokenizer.json, its
    ids the new rows), return meta."""
    converted, rows = None, vocab.rows if vocab is not None else None
    if vocab is not None:
        perm = spm_io.our_layout(rows, str(vocab.path))
        moved = sum(i != j for i, j in enumerate(perm))
        if moved:
            idx = torch.tensor(perm)
            for k in [k for k in sd if is_language_param(k)]:
                sd[k] = sd[k].index_select(0, idx).contiguous()
            rows = [rows[i] for i in perm]
        if vocab.needs_writing(rows, moved):
            converted = {"from": str(vocab.path), "rows_moved": moved}
    surgery.check_state_dict(cfg, sd, "imported model")
    checkpoint.write_final(final, sd, meta)
    if vocab is not None:
        dst = vocab.write(final, perm, rows, converted)
        meta = meta | {"tokenizer": str(dst.resolve()), "tokenizer_conversion": converted}
        checkpoint.write_meta(final, meta)
        checkpoint.write_manifest(final)  # now covering the tokenizer too
    return meta


def _to_fp32(sd: dict) -> tuple[dict, str]:
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in sd.values() if torch.is_tensor(v)})
    return {k: (v.float() if v.is_floating_point() else v) for k, v in sd.items() if torch.is_tensor(v)}, \
        ",".join(dtypes)


# ---------------------------------------------------------------- Hugging Face

def check_hf_config(path: Path) -> dict:
    """config.json of a RoBERTa/XLM-R MLM, or an error naming the file and what it is instead."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InteropError(f"{path}: not a readable JSON config ({e})") from e
    mt, archs = cfg.get("model_type"), cfg.get("architectures") or []
    if mt not in HF_MODEL_TYPES or (archs and not set(archs) & set(HF_MLM_ARCHS)):
        raise InteropError(f"{path}: architectures={archs} model_type={mt!r} is not supported; mm-ds imports "
                           f"RoBERTa-family masked LMs ({', '.join(HF_MLM_ARCHS)}; model_type "
                           f"{' or '.join(HF_MODEL_TYPES)}). BERT uses another embedding and head layout, "
                           f"decoder models (GPT-2, Llama) are not MLMs, and a RobertaModel or task model has "
                           f"no MLM head")
    return cfg


def hf_weights_file(src: Path) -> Path:
    """The weights file (or shard index) of an HF directory, or an error saying what is there instead."""
    found = next((src / n for n in HF_WEIGHTS if (src / n).is_file()), None)
    if found is None:
        other = sorted(p.name for p in src.glob("*") if p.suffix in (".h5", ".msgpack", ".ckpt", ".pt"))
        raise InteropError(f"{src}: no weights file; expected one of {', '.join(HF_WEIGHTS)}"
                           + (f" (found {', '.join(other)}: convert it with transformers' save_pretrained "
                              f"first)" if other else ""))
    return found


def read_hf_weights(src: Path) -> tuple[dict, Path]:
    """The state dict of an HF directory (safetensors, sharded or not; .bin via weights_only) and its file."""
    from safetensors.torch import load_file

    found = hf_weights_file(src)
    files = [found]
    if found.name.endswith(".index.json"):
        index = json.loads(found.read_text())
        files = [src / f for f in sorted(set(index.get("weight_map", {}).values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing or not files:
            raise InteropError(f"{found}: weight_map names missing shard(s) {', '.join(missing) or '(none listed)'}")
    sd: dict = {}
    for f in files:
        if f.suffix == ".safetensors":
            sd |= load_file(str(f))
        else:
            sd |= _load_pickle(f, trust=False, what="weights")
    return sd, found


def import_hf(src: str | Path, out: str | Path, tokenizer: str | Path | None = None, no_tokenizer: bool = False,
              system: str = "bl_base", lang: str = "en", force: bool = False) -> dict:
    """An HF RoBERTa/XLM-R MLM directory as `out/final/`. Returns the written meta.

    Tokenizer: `tokenizer` if given (a SentencePiece model or a tokenizer.json), else the directory's
    `spm.model` (an mm-ds export) or `sentencepiece.bpe.model` (XLM-R, converted: see mm_ds.interop.spm), else
    its Hugging Face tokenizer (a byte-level BPE RoBERTa: vocab.json + merges.txt or tokenizer.json; converted:
    see mm_ds.interop.hf_vocab). `no_tokenizer=True` imports the weights alone. The token-type table's row 0 is
    folded into the positions, rows 1.. dropped (hf.token_type_fold): recorded in the meta's `imported_from`."""
    src = Path(src)
    final = _out_final(out, force)
    hf_cfg, _, _, vocab = inspect_hf(src, tokenizer, no_tokenizer)
    cfg_path = src / "config.json"
    hf_sd, wfile = read_hf_weights(src)
    hf_sd, dtypes = _to_fp32(hf_sd)
    try:
        cfg, sd = hf.from_hf_roberta(hf_cfg, hf_sd)
    except (surgery.SurgeryError, ConfigError) as e:
        raise InteropError(f"{wfile} with {cfg_path}: {e}") from e
    source = {"format": "hf", "path": str(src.resolve()), "weights": wfile.name, "dtype": dtypes,
              "model_type": hf_cfg.get("model_type"), "architectures": hf_cfg.get("architectures"),
              "token_type_embeddings": hf.token_type_fold(hf_cfg, hf_sd)}
    return _finish(final, cfg, sd, _import_meta(cfg, system, lang, source), vocab)


def inspect_hf(src: str | Path, tokenizer: str | Path | None = None,
               no_tokenizer: bool = False) -> tuple[dict, ModelConfig, Path, SourceVocab | None]:
    """(config.json, our ModelConfig, weights file, tokenizer or None) of an HF RoBERTa/XLM-R MLM directory,
    checked without reading the weights: the directory, its config, that a weights file is there, and a
    tokenizer whose pieces fit the embedding rows (what `import_hf` reads, `mm-ds extend --check` checks)."""
    src = Path(src)
    if not src.is_dir():
        raise InteropError(f"{src} is not a directory; a Hugging Face model is a directory holding config.json")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise InteropError(f"{src}: no config.json; is this a Hugging Face model directory?")
    hf_cfg = check_hf_config(cfg_path)
    try:
        cfg = hf.model_config(hf_cfg)
    except surgery.SurgeryError as e:
        raise InteropError(f"{cfg_path}: {e}") from e
    wfile = hf_weights_file(src)
    shapes = _safetensors_shapes(src, wfile)
    if shapes is not None:  # .bin files: only by unpickling them, at import
        try:
            hf.check_hf_shapes(hf_cfg, shapes)
        except surgery.SurgeryError as e:
            raise InteropError(f"{wfile} with {cfg_path}: {e}") from e
    return hf_cfg, cfg, wfile, hf_dir_vocab(src, tokenizer, no_tokenizer, cfg.vocab_size, f"{wfile.name} {HF_EMBED}")


def _safetensors_shapes(src: Path, wfile: Path) -> dict[str, tuple] | None:
    """Tensor name -> shape from the safetensors headers (no weights read); None for .bin files."""
    from safetensors import safe_open

    if "safetensors" not in wfile.name:
        return None
    files = ([src / f for f in sorted(set(json.loads(wfile.read_text()).get("weight_map", {}).values()))]
             if wfile.name.endswith(".index.json") else [wfile])
    shapes = {}
    for f in files:
        if not f.is_file():
            raise InteropError(f"{wfile}: weight_map names the missing shard {f.name}")
        with safe_open(str(f), "pt") as st:
            shapes |= {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
    return shapes


# ---------------------------------------------------------------- fairseq

def _load_pickle(path: Path, trust: bool, what: str) -> dict:
    """torch.load with weights_only=True (plus argparse.Namespace, the args object of fairseq checkpoints).
    Anything else refuses with a clear error unless `trust` (full unpickling: runs code from the file)."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust:
            m = re.search(r"GLOBAL (\S+)", str(e))
            found = f"it holds {m.group(1)}" if m else str(e).strip().splitlines()[0]
            fix = ("Re-save it with tensors only (safetensors)" if what == "weights" else
                   "fairseq >= 0.10 stores its config as an omegaconf DictConfig. Re-run with --trust-pickle to "
                   "unpickle it fully; that executes code from the file, so only do it for a checkpoint from a "
                   "source you trust")
            raise InteropError(f"{path}: torch.load(weights_only=True) refused the {what}: {found}, not only "
                               f"tensors and plain containers. {fix}") from e
        print(f"[mm-ds] --trust-pickle: unpickling {path} with weights_only=False", flush=True)
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as e:
        raise InteropError(f"{path}: cannot read the {what}: {e}") from e


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
    final = _out_final(out, force)
    ckpt = _load_pickle(pt, trust_pickle, "checkpoint")
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise InteropError(f"{pt}: no 'model' state dict; is this a fairseq checkpoint?")
    fs_sd, dtypes = _to_fp32(ckpt["model"])
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
    return _finish(final, cfg, sd, _import_meta(cfg, system, lang, source), vocab)


# ---------------------------------------------------------------- DeepSpeed (this system's own checkpoints)

def import_deepspeed(src: str | Path, out: str | Path, force: bool = False) -> dict:
    """Consolidate an engine checkpoint (`checkpoints/step_*`, or a run directory: its newest verified
    checkpoint) into `out/final/` fp32 weights with the checkpoint's own meta. The tokenizer is copied in."""
    src = Path(src)
    if (src / checkpoint.FINAL / checkpoint.WEIGHTS).is_file() and not (src / checkpoint.MANIFEST).is_file():
        ckpt = src / checkpoint.FINAL  # a finished run: its final/ already is consolidated
    elif checkpoint.checkpoints_dir(src).is_dir():
        ckpt = checkpoint.find_resume_point(src)
        if ckpt is None:
            raise InteropError(f"{src}: no checkpoint under {checkpoint.checkpoints_dir(src)} verifies")
    else:
        ckpt = src
    final = _out_final(out, force)
    meta, sd = checkpoint.load_final(ckpt)
    meta = {k: v for k, v in meta.items() if k != "format"}
    meta["imported_from"] = {"format": "deepspeed", "path": str(ckpt.resolve()), "zero_stage": meta.get("zero_stage")}
    tok = meta.get("tokenizer")
    checkpoint.write_final(final, sd, meta)
    if tok and Path(tok).is_file():
        dst = final / "spm.model"
        shutil.copyfile(tok, dst)
        meta["tokenizer"] = str(dst.resolve())
        checkpoint.write_meta(final, meta)
        checkpoint.write_manifest(final)
    return meta

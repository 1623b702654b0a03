"""`mm-ds import --from hf`: a Hugging Face RoBERTa/XLM-R masked LM directory (config.json + safetensors or
pytorch_model.bin) as an mm-ds Step-1 run directory (mm_ds.interop.importers); the key map is mm_ds.interop.hf."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import ConfigError, ModelConfig
from ..model import surgery
from . import hf
from .importers import finish_import, imported_meta, load_pickle, out_final, to_fp32
from .spm import InteropError
from .vocab import SourceVocab, hf_dir_vocab

HF_MLM_ARCHS = ("RobertaForMaskedLM", "XLMRobertaForMaskedLM")
HF_MODEL_TYPES = ("roberta", "xlm-roberta")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")
HF_EMBED = "roberta.embeddings.word_embeddings.weight"


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
            sd |= load_pickle(f, trust=False, what="weights")
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
    final = out_final(out, force)
    hf_cfg, _, _, vocab = inspect_hf(src, tokenizer, no_tokenizer)
    cfg_path = src / "config.json"
    hf_sd, wfile = read_hf_weights(src)
    hf_sd, dtypes = to_fp32(hf_sd)
    try:
        cfg, sd = hf.from_hf_roberta(hf_cfg, hf_sd)
    except (surgery.SurgeryError, ConfigError) as e:
        raise InteropError(f"{wfile} with {cfg_path}: {e}") from e
    source = {"format": "hf", "path": str(src.resolve()), "weights": wfile.name, "dtype": dtypes,
              "model_type": hf_cfg.get("model_type"), "architectures": hf_cfg.get("architectures"),
              "token_type_embeddings": hf.token_type_fold(hf_cfg, hf_sd)}
    return finish_import(final, cfg, sd, imported_meta(cfg, system, lang, source), vocab)


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

"""Foreign checkpoints -> an mm-ds Step-1 run directory (`OUT/final/`), usable as `parent=OUT` by build-mini
(MINIPOST) and adapt (BL_BASE) like a model this system pretrained. One module per format:

    import_hf         HF RobertaForMaskedLM / XLMRobertaForMaskedLM directory (config.json + safetensors/bin):
                      mm_ds.interop.hf_import
    import_fairseq    fairseq RoBERTa (model.pt + dict.txt + SentencePiece model), the paper's own format:
                      mm_ds.interop.fairseq_import
    import_deepspeed  an engine checkpoint of this system (any ZeRO stage) -> plain fp32 final/ weights:
                      mm_ds.interop.deepspeed_import

This module holds what they share: the output directory, the meta an import writes, the rows put in mm-ds's
layout (`finish_import`), and the one way a pickle is read. Nothing here unpickles arbitrary objects: `.bin`/`.pt`
files are read with `torch.load(weights_only=True)` (fairseq's `argparse.Namespace` args allowed); anything else
needs `trust_pickle=True`, which runs the file's pickle code and is only for files from a source you trust.
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path

import torch

from ..config import ModelConfig, to_dict
from ..model import surgery
from ..model.model import is_language_param
from ..runtime.checkpointing import checkpoint
from . import spm as spm_io
from .spm import InteropError
from .vocab import SourceVocab


def out_final(out: str | Path, force: bool) -> Path:
    final = Path(out) / checkpoint.FINAL
    if final.exists() and not force:
        raise InteropError(f"{final} already exists; pass --force to replace it")
    return final


def imported_meta(cfg: ModelConfig, system: str, lang: str, source: dict) -> dict:
    return {"stage": "pretrain", "system": system, "lang": lang, "step": 0, "tokens": 0, "flops": 0.0,
            "flops_cumulative": 0.0, "parent": None, "model": to_dict(cfg), "tokenizer": None,
            "imported_from": source, "time": checkpoint.now()}


def finish_import(final: Path, cfg: ModelConfig, sd: dict, meta: dict, vocab: SourceVocab | None) -> dict:
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


def to_fp32(sd: dict) -> tuple[dict, str]:
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in sd.values() if torch.is_tensor(v)})
    return {k: (v.float() if v.is_floating_point() else v) for k, v in sd.items() if torch.is_tensor(v)}, \
        ",".join(dtypes)


def load_pickle(path: Path, trust: bool, what: str) -> dict:
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

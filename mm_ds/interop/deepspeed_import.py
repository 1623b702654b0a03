"""`mm-ds import --from deepspeed`: an engine checkpoint of this system (any ZeRO stage) as plain fp32 `final/`
weights of an mm-ds Step-1 run directory (mm_ds.interop.importers)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..runtime.checkpointing import checkpoint
from .importers import out_final
from .spm import InteropError


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
    final = out_final(out, force)
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

"""The sha256 sums of checkpoint files (mm_ds/runtime/checkpointing/rundir.py's manifests), computed once per stage start.

A checkpoint is hashed before anything loads it (DeepSpeed unpickles its files). At the paper's BL_BASE size
that reads 1.75 GB, so it is done once: a process remembers which checkpoints it has checked (their files
unchanged since), and the side that resolves a stage run (mm_ds/stages/resolve.py) checks the parent and the
resume point and records their manifests (mm_ds/runtime/training/resolved.py): a rank whose record matches takes that
verdict (`checked`) and checks sizes only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .. import faults

MANIFEST = "manifest.json"
_checked: dict[str, tuple] = {}
"""Resolved checkpoint directory -> its files' (name, mtime, size) when their sums were checked here or recorded as
checked by the launching side."""


def sha256(path: Path, rank: int = 0) -> str:
    faults.hashing(path, rank)  # a test's count of who hashes what (MM_DS_TRACE_HASHES); inert otherwise
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _stamp(ckpt: Path) -> tuple[str, tuple]:
    """A stat of every file, not just the manifest: a file rewritten since it was checked is hashed again."""
    files = sorted(p for p in ckpt.rglob("*") if p.is_file())
    return str(ckpt.resolve()), tuple((str(p.relative_to(ckpt)), p.stat().st_mtime_ns, p.stat().st_size) for p in files)


def needed(ckpt: Path) -> bool:
    """Whether `verify` must hash `ckpt`'s files: not checked here (or by the launching side) since any of them
    last changed."""
    key, stamp = _stamp(ckpt)
    return _checked.get(key) != stamp


def checked(ckpt: str | Path) -> None:
    """`ckpt`'s files match its manifest's sums: checked here, or by the launching side, whose record says so."""
    if (Path(ckpt) / MANIFEST).is_file():
        key, stamp = _stamp(Path(ckpt))
        _checked[key] = stamp

"""The sha256 sums of checkpoint files (mm_ds/runtime/rundir.py's manifests), computed once per stage start.

A checkpoint is hashed before anything loads it (DeepSpeed unpickles its files). At the paper's BL_BASE size
that reads 1.75 GB, so it is done once: a process remembers which checkpoints it has checked (their files
unchanged since), and under a launcher rank 0 checks and broadcasts its verdict (stages/common.py
`verify_inputs`): the other ranks `trust` it and check sizes only. The process that starts the ranks checks
sizes only (`deferred`): rank 0 hashes what it loads.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from . import faults

MANIFEST = "manifest.json"
_checked: dict[str, tuple] = {}
"""Resolved checkpoint directory -> its files' (name, mtime, size) when their sums were checked here or trusted."""
_deferred = False


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
    """Whether `verify` must hash `ckpt`'s files: not checked (or trusted) here since any of them last changed,
    and not deferred."""
    key, stamp = _stamp(ckpt)
    return not _deferred and _checked.get(key) != stamp


def checked(ckpt: str | Path) -> None:
    """`ckpt`'s files match its manifest's sums: checked here, or by another rank that said so (`trust`)."""
    if (Path(ckpt) / MANIFEST).is_file():
        key, stamp = _stamp(Path(ckpt))
        _checked[key] = stamp


trust = checked


@contextlib.contextmanager
def deferred(defer: bool = True):
    """Within it, `verify` checks sizes only: the side that starts a stage's ranks, whose rank 0 hashes."""
    global _deferred
    before, _deferred = _deferred, defer or _deferred
    try:
        yield
    finally:
        _deferred = before

"""The self-describing run directory: what mm-ds writes beside DeepSpeed's files, and how it is checked. The
one owner of the run tree's names: everyone else asks for a part (`logs_dir`, `train_log`, FINAL, ...) rather
than spelling it (tests/test_layout.py keeps it so).

    RUN/
      run_config.yaml  ds_config.json      effective configs of the stage
      resolved.json                        the launch's record: world size, resume point, what was verified,
                                           each file's sum (mm_ds/runtime/training/resolved.py); the ranks start from it
      logs/                                train.jsonl, and the monitors' output when enabled (CSV, TensorBoard, W&B)
      checkpoints/                         engine checkpoints (runtime/checkpointing/checkpoint.py: DeepSpeed's layout)
        step_00001000/
          mm_ds.json                       meta: stage, system, lang, step, tokens, FLOPs, parent, model config
          manifest.json                    size and sha256 of every file: written last, checked on load
      frozen/
        model.safetensors  mm_ds.json      fp32 weights of the parameters this stage does not train (the
                                           parent's, after surgery); laid over every consolidation, since
                                           bf16/fp16 engines keep only low-precision copies of them
      final/
        model.safetensors  mm_ds.json      consolidated fp32 weights: what the next stage starts from

Every directory mm-ds publishes (a checkpoint, frozen/, final/) holds its meta and a manifest and is written under
a `.tmp` name, verified, then renamed: a crash leaves nothing half-published. Nothing here reads DeepSpeed's files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from ..distributed import dist
from . import sums

LOGS = "logs"
"""A stage run's logs (RUN/logs/train.jsonl, the monitors') and `mm-ds run`'s (OUT/logs/: each launch's job
and log)."""
TRAIN_LOG = "train.jsonl"
CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.yaml"
DS_CONFIG = "ds_config.json"
RESOLVED = "resolved.json"
"""The stage run as its launching side resolved it (mm_ds/runtime/training/resolved.py): what every rank starts from."""
META = "mm_ds.json"
MANIFEST = sums.MANIFEST
FINAL = "final"
FROZEN = "frozen"
WEIGHTS = "model.safetensors"
FORMAT = "mm-ds-checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt, or not what the caller expects."""


def logs_dir(root: str | Path) -> Path:
    """RUN/logs/ of a stage run, or OUT/logs/ of `mm-ds run`'s run tree."""
    return Path(root) / LOGS


def train_log(run_dir: str | Path) -> Path:
    """RUN/logs/train.jsonl: a stage run's log rows."""
    return logs_dir(run_dir) / TRAIN_LOG


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


# ---------------------------------------------------------------- small atomic-file helpers

def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))


def write_text_atomic(path: Path, text: str) -> None:
    # A name of this process's own: two writers of the same file (each node's command of a `--no_ssh` launch writes
    # the same resolved record) never write into one temporary file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- manifest: sizes and checksums

def write_manifest(ckpt: Path, required: list[str] = ()) -> None:
    """Size and sha256 of every file of `ckpt` (and of each of `required`, relative paths looked up by name: a stale
    directory listing must not leave one out), each file read once: the sums are recorded as checked
    (mm_ds/runtime/checkpointing/sums.py), so that `verify` right after checks sizes and does not read them again."""
    names = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()} | set(required)
    files = {}
    for rel in sorted(n for n in names if Path(n).name != MANIFEST and not n.endswith(".tmp")):
        p = ckpt / rel
        files[rel] = {"bytes": p.stat().st_size, "sha256": sums.sha256(p, dist.rank())}
    write_json_atomic(ckpt / MANIFEST, {"format": FORMAT, "files": files})
    sums.checked(ckpt)


def verify(ckpt: str | Path, checksums: bool = True) -> dict:
    """Check a checkpoint against its manifest: sizes, and sums unless this process has
    (mm_ds/runtime/checkpointing/sums.py). Raises CheckpointError naming the first bad file."""
    ckpt = Path(ckpt)
    man_path = ckpt / MANIFEST
    if not man_path.is_file():
        raise CheckpointError(f"{ckpt}: no {MANIFEST}; it is incomplete (interrupted save) or not written by mm-ds")
    try:  # ValueError: not UTF-8 or not JSON; the rest: JSON of another shape
        manifest = json.loads(man_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not all(isinstance(w, dict) and {"bytes", "sha256"} <= w.keys() for w in files.values()):
            raise ValueError("an entry of 'files' lacks 'bytes' or 'sha256'")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{man_path} is unreadable ({e!r}); the checkpoint cannot be trusted") from e
    checksums = checksums and sums.needed(ckpt)
    for rel, want in files.items():
        p = ckpt / rel
        if not p.is_file():
            raise CheckpointError(f"{p}: listed in the manifest but missing")
        if p.stat().st_size != want["bytes"]:
            raise CheckpointError(f"{p}: {p.stat().st_size} bytes, manifest says {want['bytes']} (truncated?)")
        if checksums and sums.sha256(p, dist.rank()) != want["sha256"]:
            raise CheckpointError(f"{p}: sha256 differs from the manifest (corrupted)")
    if checksums:
        sums.checked(ckpt)
    return manifest


# Meta keys that point at other files. They are written absolute (a stage's cwd is not the reader's) and
# also relative to the checkpoint, so that a run tree copied or moved as a whole still finds its parents
# and tokenizers: on reading, the relative path wins when it exists.
PATH_KEYS = ("parent", "primary", "tokenizer", "frozen")


def _portable_paths(meta: dict, ckpt: Path) -> dict:
    """`meta` as written to `ckpt`/mm_ds.json: path keys absolute, plus their paths relative to `ckpt`."""
    out, rel = {k: v for k, v in meta.items() if k != "relative_paths"}, {}
    for key in PATH_KEYS:
        if isinstance(meta.get(key), str) and meta[key]:
            target = Path(meta[key]).resolve()
            out[key] = str(target)
            rel[key] = os.path.relpath(target, ckpt.resolve())
    return out | ({"relative_paths": rel} if rel else {})


def _local_paths(meta: dict, ckpt: Path) -> dict:
    for key, rel in (meta.get("relative_paths") or {}).items():
        here = ckpt / rel
        if here.exists():
            meta[key] = str(here.resolve())
    return meta


def write_meta(ckpt: Path, meta: dict, at: Path | None = None) -> None:
    """`ckpt`/mm_ds.json for a checkpoint that will be published at `at` (default: where it is written)."""
    write_json_atomic(ckpt / META, _portable_paths(meta, at or ckpt) | {"format": FORMAT})


def read_meta(ckpt: str | Path) -> dict:
    path = Path(ckpt) / META
    if not path.is_file():
        raise CheckpointError(f"{ckpt} has no {META}: not an mm-ds checkpoint or final directory")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return _local_paths(meta, Path(ckpt))


IN_THE_WAY = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY)  # a file where a directory must go, ...


def describe_write_error(e: Exception, root: Path) -> str:
    if isinstance(e, OSError) and e.errno in IN_THE_WAY:
        return f"{type(e).__name__}: {e}"
    try:
        free = f"; {shutil.disk_usage(root).free:,} bytes free on that filesystem"
    except OSError:
        free = ""
    full = isinstance(e, OSError) and e.errno == errno.ENOSPC or "unexpected pos" in str(e) or "write failed" in str(e)
    return (f"{'disk full? ' if full and 'No space' not in str(e) else ''}{type(e).__name__}: {e}{free}"
            f"{'' if os.access(root, os.W_OK) or not root.exists() else f' ({root} is not writable)'}")


@contextlib.contextmanager
def writing(what: Path, partial: Path | None = None, then: str = "re-run with --resume"):
    """Filesystem errors while writing `what` become a CheckpointError naming it, what happened and the fix (then
    `then`); `partial`, a temporary directory of ours, is removed: nothing is half-published."""
    try:
        yield
    except CheckpointError:
        raise
    except (OSError, RuntimeError) as e:  # torch.save and safetensors report a full disk as a RuntimeError
        if partial is not None and partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        fix = (f"Move or remove what is in the way ({e.filename2 or e.filename})"  # a rename's: its target
               if isinstance(e, OSError) and e.errno in IN_THE_WAY else "Free disk space or fix permissions")
        raise CheckpointError(f"writing {what} failed: {describe_write_error(e, what.parent)}; nothing was published. "
                              f"{fix}, then {then}.") from e


def write_final(out_dir: str | Path, state_dict: dict[str, torch.Tensor], meta: dict) -> Path:
    """A self-describing weights directory: safetensors + meta. Written to a temp name, then renamed; a
    filesystem error is a CheckpointError (`writing`) and publishes nothing half-written."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    with writing(out_dir, partial=tmp):
        if tmp.is_dir():
            shutil.rmtree(tmp)  # left by a crash mid-write
        tmp.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(tmp / WEIGHTS))
        write_meta(tmp, meta, at=out_dir)
        write_manifest(tmp)
        if out_dir.is_dir():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    return out_dir


def write_frozen(run_dir: str | Path, state_dict: dict[str, torch.Tensor]) -> Path | None:
    """RUN/frozen/: the fp32 weights a stage does not train, written once (a resume finds them in place)."""
    out = Path(run_dir) / FROZEN
    if not state_dict:
        return None
    if (out / WEIGHTS).is_file():
        try:
            verify(out)
            return out
        except CheckpointError as e:
            print(f"[mm-ds] rewriting {out}: {e}", flush=True)
    return write_final(out, state_dict, {"frozen_of": str(run_dir), "time": now()})


def manifest_of(path: str | Path) -> Path:
    """The manifest of a checkpoint directory, or else of a run directory's final/ (it may not exist)."""
    path = Path(path)
    return path / MANIFEST if (path / MANIFEST).is_file() else path / FINAL / MANIFEST


def weights_dir(path: str | Path) -> Path:
    """What `load_final` reads for `path`: RUN/final/, a final/ directory itself, or an engine checkpoint."""
    return Path(path) / FINAL if (Path(path) / FINAL / WEIGHTS).is_file() else Path(path)


def unwritable(out: Path) -> str | None:
    """Why `out`, or the directory it would be created in, cannot take a file (tried for real, then removed:
    permission bits do not tell for root, read-only mounts or /proc); None when it can."""
    here = out.resolve()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{here} is not a directory, so {out} cannot be created there"
    try:
        fd, probe = tempfile.mkstemp(dir=here, prefix=".mm-ds-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"{out} cannot be written ({here}: {e.strerror}); choose another --out"
    return None


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")

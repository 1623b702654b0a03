"""The one module that knows DeepSpeed's checkpoint layout, and the self-describing run directory.

    RUN/
      run_config.yaml  ds_config.json      effective configs of the stage
      logs/                                DeepSpeed monitor output (CSV; TensorBoard/W&B when enabled)
      checkpoints/
        latest                             tag of the newest *complete* checkpoint (written last)
        step_00001000/                     engine.save_checkpoint() files (model, ZeRO optimizer shards)
          mm_ds.json                       meta: stage, system, lang, step, tokens, FLOPs, parent, model config
          manifest.json                    size and sha256 of every file: written last, checked on load
      frozen/
        model.safetensors  mm_ds.json      fp32 weights of the parameters this stage does not train (the
                                           parent's, after surgery); laid over every consolidation, since
                                           bf16/fp16 engines keep only low-precision copies of them
      final/
        model.safetensors  mm_ds.json      consolidated fp32 weights: what the next stage starts from

A checkpoint is written under `<tag>.tmp`, verified, then renamed; `latest` is replaced atomically after.
A crash mid-save leaves a `.tmp` directory that is never picked up and is removed by the next save.
The filesystem under RUN must be shared by all ranks (as DeepSpeed itself assumes).
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

from . import dist, faults, sums

META = "mm_ds.json"
MANIFEST = sums.MANIFEST
LATEST = "latest"
FINAL = "final"
FROZEN = "frozen"
WEIGHTS = "model.safetensors"
FORMAT = "mm-ds-checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt, or not what the caller expects."""


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


# ---------------------------------------------------------------- small atomic-file helpers

def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True))


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- manifest: sizes and checksums

def write_manifest(ckpt: Path) -> None:
    files = {}
    for p in sorted(ckpt.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp"):
            files[str(p.relative_to(ckpt))] = {"bytes": p.stat().st_size, "sha256": sums.sha256(p, dist.rank())}
    write_json_atomic(ckpt / MANIFEST, {"format": FORMAT, "files": files})


def verify(ckpt: str | Path, checksums: bool = True) -> dict:
    """Check a checkpoint against its manifest: sizes, and sums unless this process has (mm_ds/runtime/sums.py). Raises
    CheckpointError naming the first bad file."""
    ckpt = Path(ckpt)
    man_path = ckpt / MANIFEST
    if not man_path.is_file():
        raise CheckpointError(f"{ckpt}: no {MANIFEST}; it is incomplete (interrupted save) or not written by mm-ds")
    try:
        manifest = json.loads(man_path.read_text())
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{man_path} is unreadable ({e}); the checkpoint cannot be trusted") from e
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


# ---------------------------------------------------------------- saving and finding engine checkpoints

def save(engine, run_dir: str | Path, step: int, client_state: dict, meta: dict) -> Path:
    """Collective: every rank calls it. Writes, verifies, then publishes the checkpoint for `step`."""
    root = checkpoints_dir(run_dir)
    tag = tag_for(step)
    tmp_tag = tag + ".tmp"
    rank = dist.rank()
    dist.on_rank0(lambda: _make_room(root), f"making room for checkpoint {root / tag}")
    error = None
    stage = meta.get("stage")
    try:
        ok = engine.save_checkpoint(str(root), tag=tmp_tag, client_state=client_state, save_latest=False)
        if ok is False:
            error = "engine.save_checkpoint reported failure"
    except (OSError, RuntimeError) as e:  # disk full, permissions: say so, keep the previous checkpoint
        error = _write_error(e, root)  # (torch.save reports a full disk as a RuntimeError)
    faults.in_save(step, rank, "after-engine-save", stage)
    if dist.any_rank(error is not None):
        dist.on_rank0(lambda: shutil.rmtree(root / tmp_tag, ignore_errors=True), f"removing {root / tmp_tag}")
        raise CheckpointError(f"saving checkpoint {root / tag} failed on at least one rank"
                              f"{': ' + error if error else ''}. The previous checkpoint "
                              f"({latest_tag(run_dir) or 'none'}) is intact; free disk space or fix "
                              f"permissions on {root}, then resume with --resume.")

    def publish():
        try:
            write_meta(root / tmp_tag, meta | {"tag": tag}, at=root / tag)
            faults.in_save(step, rank, "after-meta", stage)
            write_manifest(root / tmp_tag)
            faults.in_save(step, rank, "after-manifest", stage)
            verify(root / tmp_tag)
            faults.in_save(step, rank, "before-rename", stage)
            if (root / tag).exists():  # re-saving a step (e.g. resumed after a crash post-rename)
                shutil.rmtree(root / tag)
            os.replace(root / tmp_tag, root / tag)
            faults.in_save(step, rank, "before-latest", stage)
            write_text_atomic(root / LATEST, tag)
        except (OSError, CheckpointError) as e:
            shutil.rmtree(root / tmp_tag, ignore_errors=True)
            raise CheckpointError(f"publishing checkpoint {root / tag} failed: {_write_error(e, root)}. The previous "
                                  f"checkpoint is intact; free disk space or fix permissions, then resume with "
                                  f"--resume.") from e

    dist.on_rank0(publish, f"publishing checkpoint {root / tag}")
    return root / tag


def _make_room(root: Path) -> None:
    with writing(root):
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.tmp"):  # an earlier crash mid-save
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()


IN_THE_WAY = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY)  # a file where a directory must go, ...


def _write_error(e: Exception, root: Path) -> str:
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
        raise CheckpointError(f"writing {what} failed: {_write_error(e, what.parent)}; nothing was published. "
                              f"{fix}, then {then}.") from e


def latest_tag(run_dir: str | Path) -> str | None:
    path = checkpoints_dir(run_dir) / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    return tag if (checkpoints_dir(run_dir) / tag / MANIFEST).is_file() else None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (published and with a manifest), oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and "." not in p.name  # not .tmp, .universal
                  and (p / MANIFEST).is_file())


def find_resume_point(run_dir: str | Path, checksums: bool = True) -> Path | None:
    """Newest checkpoint that verifies; a corrupt newest one is reported and the one before is used.
    Half-written ones (`*.tmp`, or published without a manifest) are reported and never used; the next
    save removes the `*.tmp` ones. Rank-0 work under a launcher (stages/common.py `verify_inputs`)."""
    root = checkpoints_dir(run_dir)
    for p in sorted(root.glob("step_*")) if root.is_dir() else []:
        if p.is_dir() and (p.name.endswith(".tmp") or not (p / MANIFEST).is_file()):
            print(f"[mm-ds] ignoring half-written checkpoint {p} (an interrupted save); the next save removes "
                  f"*.tmp ones", flush=True)
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify(ckpt, checksums)
            return ckpt
        except CheckpointError as e:
            print(f"[mm-ds] skipping checkpoint that fails verification: {e}", flush=True)
    return None


def load_into_engine(engine, ckpt: Path) -> dict:
    """Collective. Loads model, optimizer and scheduler state; returns the client state.

    DeepSpeed unpickles these files: only a checkpoint this system wrote (its manifest and meta present and
    the files matching the manifest's sizes; find_resume_point checked the sums) is handed to it."""
    verify(ckpt, checksums=False)
    read_meta(ckpt)
    path, client_state = engine.load_checkpoint(str(ckpt.parent), tag=ckpt.name, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load {ckpt}")
    return client_state


# ---------------------------------------------------------------- consolidated weights (stage hand-off)

def consolidate(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """fp32 state dict of an engine checkpoint of any ZeRO stage and world size (rank-0 work, no engine).

    DeepSpeed unpickles these files, so only checkpoints this system wrote (manifest verified) are read."""
    ckpt = Path(ckpt)
    verify(ckpt)
    meta = read_meta(ckpt)
    zero = meta.get("zero_stage", 0)
    if zero == 3:  # partitioned parameters, frozen ones included (frozen_param_fragments)
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        sd = get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name)
        return _with_frozen({k: v.detach().float().clone().contiguous() for k, v in sd.items()}, meta, ckpt)
    states = torch.load(ckpt / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    sd = dict(states["module"])
    if zero > 0:
        # The optimizer shards hold fp32 masters of the *trainable* parameters only; DeepSpeed records
        # frozen ones (frozen_param_shapes) for ZeRO-3 alone. Under ZeRO 1/2 the module state dict has
        # every parameter, frozen ones at the precision they were used in, so overlay the masters on it.
        bf16_shards = sorted(ckpt.glob("bf16_zero_pp_rank_*_mp_rank_00_optim_states.pt"))
        if bf16_shards and meta.get("precision") == "bf16" and zero == 1:
            sd.update(_bf16_optimizer_masters(states, bf16_shards, ckpt))
        else:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            sd.update(get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name))
    empty = [k for k, v in sd.items() if v.numel() == 0]
    if empty:  # ZeRO-3 placeholders that no shard filled in
        raise CheckpointError(f"{ckpt}: could not reconstruct {len(empty)} parameters ({', '.join(empty[:4])}...)"
                              f" from the ZeRO-{zero} shards")
    return _with_frozen({k: v.detach().float().clone().contiguous() for k, v in sd.items()}, meta, ckpt)


def _bf16_optimizer_masters(states: dict, shards: list[Path], ckpt: Path) -> dict[str, torch.Tensor]:
    """fp32 masters from BF16_Optimizer's shards (bf16 + ZeRO-1 + fp32 gradient accumulation), a layout that
    DeepSpeed's zero_to_fp32 does not read: each rank holds one contiguous slice of every parameter group's
    flat fp32 buffer (`single_partition_of_fp32_groups`); the groups hold the parameters of `param_shapes` in
    order, unaligned, with the group's padding at the end of the last rank's slice."""
    rank_of = {int(p.name.split("_rank_")[1].split("_")[0]): p for p in shards}
    parts = [torch.load(rank_of[r], map_location="cpu", weights_only=False)["optimizer_state_dict"]
             for r in range(len(rank_of))]
    if sorted(rank_of) != list(range(len(rank_of))) or parts[0]["partition_count"][0] != len(parts):
        raise CheckpointError(f"{ckpt}: BF16_Optimizer shards for ranks {sorted(rank_of)}, expected "
                              f"{parts[0]['partition_count'][0]}")
    out = {}
    for g, shapes in enumerate(states["param_shapes"]):
        flat = torch.cat([p["single_partition_of_fp32_groups"][g] for p in parts])
        offset = 0
        for name, shape in shapes.items():
            n = shape.numel()
            first = parts[0]["param_slice_mappings"][g].get(name)
            if first is not None and parts[0]["param_slice_mappings"][g] and first.start != offset:
                raise CheckpointError(f"{ckpt}: {name} starts at {first.start} in rank 0's slice, not at {offset}")
            out[name] = flat[offset:offset + n].view(shape).clone()
            low = states["module"][name]
            if not torch.equal(out[name].to(low.dtype), low):  # the engine's weights are the masters, rounded
                raise CheckpointError(f"{ckpt}: the fp32 master of {name} read from BF16_Optimizer's shards does "
                                      f"not round to the module's {low.dtype} weight: unexpected shard layout")
            offset += n
        padding = parts[-1]["group_paddings"][g]  # recorded by the last rank, whose slice ends the buffer
        if offset + padding != flat.numel():
            raise CheckpointError(f"{ckpt}: group {g} holds {flat.numel()} values; its parameters and padding "
                                  f"need {offset} + {padding}")
    return out


def _with_frozen(sd: dict[str, torch.Tensor], meta: dict, ckpt: Path) -> dict[str, torch.Tensor]:
    """Lay the run's fp32 frozen weights over the engine's copies of them (bf16/fp16-rounded in mixed
    precision, equal in fp32)."""
    if not meta.get("frozen"):
        return sd
    from safetensors.torch import load_file

    where = Path(meta["frozen"])
    try:
        verify(where)
    except CheckpointError as e:
        raise CheckpointError(f"{ckpt} takes its frozen fp32 weights from {where}, which fails: {e}") from None
    for k, v in load_file(str(where / WEIGHTS)).items():
        if k not in sd or sd[k].shape != v.shape:
            raise CheckpointError(f"{where}: frozen weight {k} {tuple(v.shape)} does not fit {ckpt} "
                                  f"({tuple(sd[k].shape) if k in sd else 'absent'})")
        sd[k] = v
    return sd


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


def load_final(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(meta, fp32 state dict) of a final/ directory, or of an engine checkpoint (consolidated)."""
    path = weights_dir(path)
    if (path / WEIGHTS).is_file():
        from safetensors.torch import load_file
        verify(path)
        return read_meta(path), load_file(str(path / WEIGHTS))
    if (path / MANIFEST).is_file():
        return read_meta(path), consolidate(path)
    raise CheckpointError(f"{path} holds neither {FINAL}/{WEIGHTS} nor an engine checkpoint; pass a run "
                          f"directory that finished, its {FINAL}/ directory, or a checkpoints/step_* directory")


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

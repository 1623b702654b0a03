"""The one module that knows DeepSpeed's checkpoint layout: the files `engine.save_checkpoint` writes, which of
them hold what, and how to read weights out of them without an engine. What mm-ds writes beside them (meta,
manifest, frozen/, final/) is mm_ds/runtime/checkpointing/rundir.py's; its names are re-exported here, so that a caller
reads checkpoints through one module.

    RUN/checkpoints/
      latest                               tag of the newest *complete* checkpoint (written last)
      step_00001000/                       engine.save_checkpoint() files:
        mp_rank_00_model_states.pt           the module's state dict (frozen parameters included), client state
        *zero_pp_rank_R_mp_rank_00_optim_states.pt   ZeRO-1/2: rank R's optimizer shard
        mm_ds.json  manifest.json          mm-ds's meta and manifest (rundir.py)
      step_00001000.universal/             DeepSpeed's universal checkpoint of it (resharding.py converts)
      latest_universal                     DeepSpeed's pointer at the newest universal checkpoint

A checkpoint is written under `<tag>.tmp`, verified, then renamed; `latest` is replaced atomically after.
A crash mid-save leaves a `.tmp` directory that is never picked up and is removed by the next save.
The filesystem under RUN must be shared by all ranks (as DeepSpeed itself assumes).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch

from .. import faults
from ..distributed import dist
from .rundir import (  # noqa: F401
    DS_CONFIG,
    FINAL,
    FORMAT,
    FROZEN,
    MANIFEST,
    META,
    RESOLVED,
    RUN_CONFIG,
    WEIGHTS,
    CheckpointError,
    checkpoints_dir,
    describe_write_error,
    manifest_of,
    now,
    read_meta,
    unwritable,
    verify,
    weights_dir,
    write_final,
    write_frozen,
    write_json_atomic,
    write_manifest,
    write_meta,
    write_text_atomic,
    writing,
)

LATEST = "latest"
MODEL_STATES = "mp_rank_00_model_states.pt"
"""The module's state dict, without ZeRO-3 (which partitions it into the optimizer shards)."""
LATEST_UNIVERSAL = "latest_universal"
UNIVERSAL = ".universal"
"""A checkpoint's universal conversion sits beside it under its name + this (mm_ds/runtime/checkpointing/resharding.py)."""


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


# ---------------------------------------------------------------- saving and finding engine checkpoints

def save(engine, run_dir: str | Path, step: int, client_state: dict, meta: dict, keep_resume: int = 1) -> Path:
    """Collective: every rank calls it. Writes, verifies, then publishes the checkpoint for `step`. `meta["kind"]`
    `resume` (default `curve`): of those, the newest `keep_resume` are kept, older ones removed after this one is
    published."""
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
        error = describe_write_error(e, root)  # (torch.save reports a full disk as a RuntimeError)
    faults.in_save(step, rank, "after-engine-save", stage)
    # One collective: whether any rank failed, and how many wrote an optimizer shard (rank 0 then requires each)
    failed, shards = dist.all_reduce([error is not None, bool(getattr(engine, "save_zero_checkpoint", False))])
    if failed:
        dist.on_rank0(lambda: shutil.rmtree(root / tmp_tag, ignore_errors=True), f"removing {root / tmp_tag}")
        raise CheckpointError(f"saving checkpoint {root / tag} failed on at least one rank"
                              f"{': ' + error if error else ''}. The previous checkpoint "
                              f"({latest_tag(run_dir) or 'none'}) is intact; free disk space or fix "
                              f"permissions on {root}, then resume with --resume.")
    required = optimizer_shards(int(shards), bool(engine.bfloat16_enabled()))

    def publish():
        try:
            write_meta(root / tmp_tag, meta | {"tag": tag}, at=root / tag)
            faults.in_save(step, rank, "after-meta", stage)
            write_manifest(root / tmp_tag, required=await_files(root / tmp_tag, required))
            faults.in_save(step, rank, "after-manifest", stage)
            verify(root / tmp_tag)  # sizes against the manifest; its sums were computed just now, once
            faults.in_save(step, rank, "before-rename", stage)
            if (root / tag).exists():  # re-saving a step (e.g. resumed after a crash post-rename)
                shutil.rmtree(root / tag)
            os.replace(root / tmp_tag, root / tag)
            faults.in_save(step, rank, "before-latest", stage)
            write_text_atomic(root / LATEST, tag)
        except (OSError, CheckpointError) as e:
            shutil.rmtree(root / tmp_tag, ignore_errors=True)
            raise CheckpointError(f"publishing checkpoint {root / tag} failed: {describe_write_error(e, root)}. The previous "
                                  f"checkpoint is intact; free disk space or fix permissions, then resume with "
                                  f"--resume.") from e

    def publish_and_rotate() -> None:
        publish()
        rotate_resume(run_dir, keep_resume)  # older resume checkpoints go once this one is published

    dist.on_rank0(publish_and_rotate, f"publishing checkpoint {root / tag}")
    return root / tag


def optimizer_shards(ranks: int, bf16: bool) -> list[str]:
    """The optimizer shard files DeepSpeed writes, one per data-parallel rank that writes one (ZeRO 1-3 and its bf16
    optimizer: `engine.save_zero_checkpoint`)."""
    return [f"{'bf16_' if bf16 else ''}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ranks)]


def await_files(ckpt: Path, names: list[str], wait_s: float = 10.0) -> list[str]:
    """`names` in `ckpt`, looked up one by one (a shared filesystem may list a directory from a stale cache while
    other nodes' files are there): waits `wait_s` for late ones, then a CheckpointError naming what is missing."""
    deadline = time.monotonic() + wait_s
    while missing := [n for n in names if not (ckpt / n).is_file()]:
        if time.monotonic() > deadline:
            raise CheckpointError(f"{ckpt}: {len(missing)} optimizer shard(s) missing ({', '.join(missing[:3])}), one "
                                  f"per data-parallel rank expected: a rank's save did not reach the shared filesystem "
                                  f"(or its listing here is stale)")
        time.sleep(0.5)
        os.listdir(ckpt)  # a fresh listing: NFS revalidates the directory
    return names


def kind(ckpt: Path) -> str:
    """`curve` or `resume` (engine.train's checkpoint kinds); `curve` when the meta does not say (older runs)."""
    try:
        return read_meta(ckpt).get("kind", "curve")
    except (CheckpointError, OSError, ValueError):
        return "curve"  # never removed, never hidden from the curves


def rotate_resume(run_dir: str | Path, keep: int) -> list[Path]:
    """Rank 0, after a checkpoint is published: remove the resume checkpoints (and their universal conversions) but
    the newest `keep`. Curve checkpoints always stay. A failure to remove is said, not fatal."""
    removed = []
    try:
        for old in [c for c in list_checkpoints(run_dir) if kind(c) == "resume"][:-keep]:
            for p in (old.with_name(old.name + UNIVERSAL), old):
                if p.is_dir():
                    shutil.rmtree(p)
            removed.append(old)
    except OSError as e:
        print(f"[mm-ds] could not remove an older resume checkpoint of {run_dir}: {e}", flush=True)
    return removed


def _make_room(root: Path) -> None:
    with writing(root):
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.tmp"):  # an earlier crash mid-save
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()


def latest_tag(run_dir: str | Path) -> str | None:
    path = checkpoints_dir(run_dir) / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    return tag if (checkpoints_dir(run_dir) / tag / MANIFEST).is_file() else None


def list_checkpoints(run_dir: str | Path, of_kind: str | None = None) -> list[Path]:
    """Complete checkpoints (published and with a manifest), oldest first; `of_kind="curve"`: those the paper's
    curves are drawn from (not time-based resume checkpoints)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = sorted(p for p in root.glob("step_*") if p.is_dir() and "." not in p.name  # not .tmp, .universal
                   and (p / MANIFEST).is_file())
    return [p for p in found if kind(p) == of_kind] if of_kind else found


def find_resume_point(run_dir: str | Path, checksums: bool = True) -> Path | None:
    """Newest checkpoint that verifies; a corrupt newest one is reported and the one before is used.
    Half-written ones (`*.tmp`, or published without a manifest) are reported and never used; the next
    save removes the `*.tmp` ones. The launching side's work (mm_ds/stages/resolve.py): the ranks take its verdict."""
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
    states = torch.load(ckpt / MODEL_STATES, map_location="cpu", weights_only=False)
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


def module_states(ckpt: str | Path) -> dict[str, torch.Tensor]:
    """The module's state dict as the engine saved it (every parameter at the precision it was used in, and the
    buffers): of an engine checkpoint under ZeRO 0-2, or of a universal one (the converter copies the file over)."""
    return torch.load(Path(ckpt) / MODEL_STATES, map_location="cpu", weights_only=False)["module"]


def mark_newest_universal(universal: Path) -> None:
    """DeepSpeed's converter points `latest_universal` at the name it wrote to (a temporary one): point it at
    `universal`, where the checkpoint was published."""
    write_text_atomic(universal.parent / LATEST_UNIVERSAL, universal.name)


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



"""Resume on a different world size: DeepSpeed's universal checkpoint, converted once and reused.

ZeRO-1/2 checkpoints hold one optimizer-state shard per data-parallel rank, so they load only on the
world size that wrote them. When the world size recorded in a checkpoint's `mm_ds.json` differs from
the current one (or `--reshard` asks for it), rank 0 converts the checkpoint with DeepSpeed's own
converter (`python -m deepspeed.checkpoint.ds_to_universal`) into a sibling directory

    checkpoints/step_00001000/             the original, untouched
    checkpoints/step_00001000.universal/   DeepSpeed's universal layout (per-parameter fp32 weights and Adam
                                           moments, the model states), mm_ds.json (the original meta +
                                           universal_of), manifest.json

written under `.universal.tmp`, given a manifest, verified and renamed, like every mm-ds checkpoint; a
later resume reuses it. The engine is then built with `"checkpoint": {"load_universal": true}` and
every rank re-partitions the full fp32 weights and Adam moments for the new world size.

What carries over exactly: fp32 master weights, Adam moments and step, LR-scheduler state, the step and
token counters. Data order does not depend on the world size (global sample ids, mm_ds.data.mlm), so the
resumed run sees the same samples. What does not: dropout masks are seeded per (step, micro-step, rank)
and the gradient all-reduce sums in another order, so the continuation is close to, not bitwise equal
to, an uninterrupted run on the old world size.

ZeRO-0 checkpoints need no conversion (the optimizer state is whole in the model states file).
ZeRO-3 is not handled here: consolidate its weights (`final/`) and start a new stage from them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .. import faults
from ..distributed import dist
from . import checkpoint as ckpt_io

SUFFIX = ".universal"


def universal_dir(ckpt: str | Path) -> Path:
    ckpt = Path(ckpt)
    return ckpt.with_name(ckpt.name + SUFFIX)


def plan_resume(ckpt: Path, world_size: int, force: bool = False) -> tuple[bool, str]:
    """(convert?, why) for resuming `ckpt` on `world_size` ranks. Raises CheckpointError if it cannot."""
    meta = ckpt_io.read_meta(ckpt)
    saved, zero = meta.get("world_size"), int(meta.get("zero_stage", 0))
    if saved == world_size and not force:
        return False, f"same world size ({world_size})"
    change = f"world size {saved} -> {world_size}" if saved != world_size else "--reshard"
    if zero == 0:
        return False, f"{change}; ZeRO-0 keeps the whole optimizer state on every rank: no conversion needed"
    if zero not in (1, 2):
        raise ckpt_io.CheckpointError(
            f"{ckpt} was written with ZeRO-{zero} on {saved} ranks; mm-ds reshards ZeRO-1/2 checkpoints only. "
            f"Resume on {saved} ranks, or start a new run from its consolidated weights.")
    return True, f"{change}; ZeRO-{zero} optimizer shards are re-partitioned through a universal checkpoint"


def ensure_universal(ckpt: str | Path, workers: int | None = None) -> Path:
    """The universal twin of an engine checkpoint: reused when it verifies, else converted (rank-0 work)."""
    ckpt = Path(ckpt)
    out = universal_dir(ckpt)
    if (out / ckpt_io.MANIFEST).is_file():
        try:
            ckpt_io.verify(out, checksums=False)
            return out
        except ckpt_io.CheckpointError as e:
            print(f"[mm-ds] re-converting {out}: {e}", flush=True)
    ckpt_io.verify(ckpt)  # DeepSpeed unpickles these files: only checkpoints with our manifest
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    workers = workers or max(1, min(4, (os.cpu_count() or 2) // 2))
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(ckpt),
           "--output_folder", str(tmp), "--inject_missing_state", "--num_extract_workers", str(workers),
           "--num_merge_workers", str(max(1, workers // 2))]
    log = tmp / "conversion.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        tail = log.read_text()[-2000:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise ckpt_io.CheckpointError(f"universal conversion of {ckpt} failed (exit {proc.returncode}):\n{tail}")
    meta = ckpt_io.read_meta(ckpt)
    ckpt_io.write_meta(tmp, meta | {"universal_of": ckpt.name}, at=out)
    ckpt_io.write_manifest(tmp)
    ckpt_io.verify(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    ckpt_io.mark_newest_universal(out)
    return out


def prepare(found: Path, world_size: int, ds_cfg: dict, rank: int, force: bool = False) -> Path:
    """Collective, before `deepspeed.initialize`: the directory to load, switching `ds_cfg` to universal
    loading when the checkpoint needs resharding. Rank 0 converts; the others wait."""
    convert, why = plan_resume(found, world_size, force)
    if rank == 0 and not why.startswith("same"):
        print(f"[mm-ds] resume from {found.name}: {why}", flush=True)
    if not convert:
        return found

    def convert_it():
        out = universal_dir(found)
        with ckpt_io.writing(out, partial=out.with_name(out.name + ".tmp")):
            print(f"[mm-ds] universal checkpoint: {ensure_universal(found)}", flush=True)

    dist.on_rank0(convert_it, f"converting {found} to a universal checkpoint")
    ds_cfg.setdefault("checkpoint", {})["load_universal"] = True
    return universal_dir(found)


def restore_frozen(engine, universal: Path) -> int:
    """Universal loading restores what the optimizer owns; frozen parameters and buffers come from the
    model states the converter copied over. Returns how many tensors were restored."""
    states = ckpt_io.module_states(universal)
    n = 0
    with torch.no_grad():
        for name, p in list(engine.module.named_parameters()) + list(engine.module.named_buffers()):
            if name in states and not getattr(p, "requires_grad", False):
                p.copy_(states[name].to(p.device, p.dtype))
                n += 1
    faults.after_universal_load(engine)  # a test's fault point (MM_DS_DUMP_RESUMED); inert otherwise
    return n

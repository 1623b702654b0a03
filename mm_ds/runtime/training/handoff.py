"""The stage-to-stage hand-off: what crosses it is only `final/` and its mm_ds.json (mm_ds/runtime/checkpointing/rundir.py).

A trained stage publishes final/ from its last checkpoint, consolidated to fp32 and checked against the model; a
stage of zero updates (MINIJOINT's extraction) publishes the model as built. Every checkpoint and final/ carry the
same meta (`meta_of`): stage, system, language, step, tokens, FLOPs, parent, model config and engine settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...config import to_dict
from ..checkpointing import checkpoint as ckpt_io
from ..distributed import dist
from . import ds_config as dsc

if TYPE_CHECKING:
    from .build import Stage


def meta_of(stage: Stage, step: int, tokens: int, flops: float, ds_cfg: dict | None = None,
            world: int | None = None) -> dict:
    """final/'s and every checkpoint's meta (`flops`: of this stage's `step` updates); without an engine
    (`ds_cfg` None) no engine settings. Multi-depth Step 2 adds its phases: [[depth, first, end step], ...]."""
    cfg = stage.cfg
    engine = {} if ds_cfg is None else {"run_config": to_dict(cfg), "zero_stage": dsc.zero_stage(ds_cfg),
                                        "precision": dsc.precision(ds_cfg), "world_size": world}
    if stage.schedule is not None:
        engine["depth_phases"] = [list(p) for p in stage.schedule.phases_until(step)]
    return stage.meta | {
        "stage": cfg.stage, "system": cfg.system, "lang": cfg.lang, "step": step, "tokens": tokens,
        "flops": flops, "flops_cumulative": stage.parent_flops + flops, "parent": stage.parent,
        "model": to_dict(cfg.model), **engine, "time": ckpt_io.now(),
    }


def publish(stage: Stage, run_dir: Path, meta: dict) -> None:
    """final/: the last checkpoint consolidated to fp32, checked against the model (rank-0 work)."""
    final_tag = ckpt_io.tag_for(stage.cfg.train.steps)
    sd = ckpt_io.consolidate(ckpt_io.checkpoints_dir(run_dir) / final_tag)
    want = set(stage.model.state_dict())
    if set(sd) != want:  # never publish weights the next stage could not load
        raise ckpt_io.CheckpointError(f"consolidated weights of {final_tag} do not match the model: missing "
                                      f"{sorted(want - set(sd))[:4]}, unexpected {sorted(set(sd) - want)[:4]}")
    final_dir = run_dir / ckpt_io.FINAL
    ckpt_io.write_final(final_dir, sd, meta)
    print(f"[mm-ds] wrote {final_dir}", flush=True)


def publish_as_built(stage: Stage, run_dir: Path) -> Path:
    """A stage of zero updates (MINIJOINT's extraction: its mini-model costs no FLOPs beyond Step 1): no
    engine; final/ holds the model exactly as the stage built it. Rank 0 writes, the others wait."""
    final_dir = run_dir / ckpt_io.FINAL

    def write():
        ckpt_io.write_final(final_dir, stage.model.state_dict(), meta_of(stage, 0, 0, 0.0))
        print(f"[mm-ds] {stage.cfg.system}/{stage.cfg.stage}: no updates; wrote the "
              f"{stage.cfg.model.num_layers}-layer model as built into {final_dir}", flush=True)

    dist.on_rank0(write, f"writing {final_dir}")
    return final_dir

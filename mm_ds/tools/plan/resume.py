"""`mm-ds plan`'s resume checkpoints: what train.resume_every_minutes costs in checkpoint writes at the planned step
times, and what a crash can still lose (docs/reliability.md; a stop loses only the update in flight).

A resume checkpoint is written once `resume_every_minutes` have passed since the last checkpoint of either kind, so
within each gap between the curve checkpoints (every train.checkpoint_every updates) ceil(gap / interval) - 1 of
them are written. Each writes the stage's engine checkpoint (the plan's `ckpt GB`) at WRITE_GBPS (an assumption:
parallel filesystems sustain 1-10 GB/s for one job); the newest train.keep_resume stay on disk. Young and Daly's
interval, sqrt(2 x seconds per save x MTBF) with the job's mean time between failures MTBF_H, is what the paper
presets' value was sized by.
"""

from __future__ import annotations

import math

WRITE_GBPS = 2.0
"""GB/s a checkpoint is written at (all ranks together)."""
MTBF_H = 24.0
"""Mean time between failures of a multi-node job, hours (a node, a link, a filesystem hiccup)."""
STAGE_OF_STEP = {"step1": "pretrain", "step1b": "build_mini", "step2": "adapt"}


def _config(cfgs: dict, row) -> object | None:
    """The stage config of a plan row (Step 2: its system's first language)."""
    head = f"{STAGE_OF_STEP.get(row.step)}/{row.system.lower()}"
    return next((c for k, c in cfgs.items() if k == head or k.startswith(head + "/")), None)


def format_resume(rows, cfgs: dict) -> str:
    """One line per plan row: the curve checkpoints' spacing, the resume interval, the resume writes and what they
    cost, and the most a crash loses."""
    lines = [f"resume checkpoints (train.resume_every_minutes; minutes between curve and between resume checkpoints; "
             f"written at {WRITE_GBPS:g} GB/s; Young/Daly interval at a failure every {MTBF_H:g} h):",
             "| system | step | curve min | resume min | writes/run | GB written | overhead % | crash loses min "
             "| Daly min |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cfg = _config(cfgs, r)
        if cfg is None:
            continue
        t = cfg.train
        every_s, gap_s, run_s = t.resume_every_minutes * 60, t.checkpoint_every * r.step_s, r.steps * r.step_s
        gaps = max(1, r.steps // max(1, t.checkpoint_every))
        writes = gaps * max(0, math.ceil(min(gap_s, run_s) / every_s) - 1) if every_s else 0
        save_s = r.ckpt_bytes / (WRITE_GBPS * 1e9)
        lost = min(every_s, gap_s) if every_s else gap_s
        lines.append(f"| {r.system} | {r.step} | {gap_s / 60:,.1f} | {t.resume_every_minutes:g} | {writes:,} | "
                     f"{writes * r.ckpt_bytes / 1e9:,.0f} | {100 * writes * save_s / max(run_s, 1e-9):.2f} | "
                     f"{lost / 60:,.1f} | {math.sqrt(2 * save_s * MTBF_H * 3600) / 60:.1f} |")
    return "\n".join(lines)

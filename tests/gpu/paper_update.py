"""The paper-shape update on one GPU, a process per system (nothing of another engine in its memory figure);
tests/gpu/test_gpu.py judges the JSON it writes:

    python tests/gpu/paper_update.py WORK SYSTEM OUT.json [compiled]   # SYSTEM: bl_base or minijoint; WORK/corpus made once

Per system, Step 1 at the paper's shape: its paper preset (12 layers, h 768, V 50k, 512 tokens, bf16_zero1.json)
over a synthetic corpus with a 50k-piece tokenizer (`mm-ds bench`'s: mm_ds/tools/bench/data.py), 32 sequences per
micro-step and 2 micro-steps per update (gpu_thresholds.py). The engine is built as `engine.train` builds it
(`engine.build_engine` with a run directory: the run's effective engine config, monitors included) and stepped by
`engine.train_step` with batches from a pinned `Prefetcher`, as the loop does. Then:
1. `WARMUP` updates, untimed (the first builds DeepSpeed's buffers and Adam's moments);
2. `TIMED` updates back to back, timed between two reads of the device, as the loop runs between log rows: step
   time, tokens/s, MFU against the GPU's peak; the peak allocated memory since the engine was built;
3. `WATCHED` updates under `DeviceWaits` (device_waits.py): every wait of the host for the device, micro-steps
   strict (sync-debug "error", traced synchronizations), DeepSpeed's optimizer step allowed its named reads.
With `compiled`, train.compile=true (inductor): the graphs compile in the warm-up updates; a compile later (a batch
with padding after full ones: the second graph) is taken out of the timed updates' time, as the training log does,
and the compile seconds, graphs, graph breaks and recompiles are recorded beside the eager run's figures.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from device_waits import DeviceWaits, boundary_steps_lenient
from gpu_thresholds import GRAD_ACCUM, MICRO_BATCH, SYSTEMS

WARMUP, TIMED, WATCHED = 3, 10, 2
CORPUS_MB = 2.0  # ~0.5M tokens: the 15 updates' 0.5M wrap into a second epoch at most


@dataclass(frozen=True)
class Gpu:
    """What the update asks of the device; tests/test_gpu_checks.py runs the same code on CPU with stand-ins."""
    name: Callable[[], str] = lambda: torch.cuda.get_device_name()
    reset_peak: Callable[[], None] = lambda: torch.cuda.reset_peak_memory_stats()
    peak_bytes: Callable[[], int] = lambda: torch.cuda.max_memory_allocated()
    set_sync_debug_mode: Callable[[str], None] = lambda mode: torch.cuda.set_sync_debug_mode(mode)
    pin: bool = True


def update_on_one_gpu(system: str, corpus: Path, run_dir: Path, gpu: Gpu = Gpu(), overrides: tuple = (),
                      micro_batch: int = MICRO_BATCH, grad_accum: int = GRAD_ACCUM) -> dict:
    """Step 1 of `system` (its paper preset, then `overrides`) on this process's device, measured as the module
    docstring says."""
    from mm_ds import config
    from mm_ds.runtime.distributed import dist
    from mm_ds.runtime.training import compiled
    from mm_ds.runtime.training import ds_config as dsc
    from mm_ds.runtime.training import engine as eng
    from mm_ds.runtime.training.peaks import gpu_peak_tflops
    from mm_ds.runtime.training.prefetch import Prefetcher
    from mm_ds.stages import pretrain

    total = WARMUP + TIMED + WATCHED
    cfg = config.load(f"paper/{system}", overrides=[
        f"data.corpus={corpus}", f"train.global_batch={micro_batch * grad_accum}", f"train.micro_batch={micro_batch}",
        "train.checkpoint_steps=[]", *overrides])
    stage = pretrain.build(cfg)
    rank, _, world = dist.init()
    built = eng.build_engine(stage, world, run_dir)
    engine, geo = built.engine, built.geo
    engine.train()
    gpu.reset_peak()  # from here on: the states are in, the update adds the rest
    ahead = Prefetcher(stage.batches, rank, geo, 0, total, ahead=cfg.data.prefetch, pin=gpu.pin)
    done, losses = 0, []

    def update():
        nonlocal done
        sums, _, _ = eng.train_step(engine, stage, done, rank, geo, ahead.get)
        done += 1
        return sums

    try:
        for _ in range(WARMUP):
            losses.append(float(update()["loss"]))
        t0, k0 = time.perf_counter(), compiled.seconds()
        for _ in range(TIMED):
            sums = update()
        losses.append(float(sums["loss"]))  # waits for the device: the timed updates' end
        step_s = (time.perf_counter() - t0 - (compiled.seconds() - k0)) / TIMED
        peak_bytes = gpu.peak_bytes()
        waits = DeviceWaits(gpu.set_sync_debug_mode)
        watched = 0
        with waits, boundary_steps_lenient(engine, waits):
            for _ in range(WATCHED):
                try:
                    sums = update()
                except RuntimeError as e:  # sync-debug "error": a micro-step asked the device for a value
                    if "synchroniz" not in str(e):
                        raise
                    waits.raised(e)
                    break
                watched += 1
        losses.append(float(sums["loss"]))
    finally:
        ahead.close()
    name = gpu.name()
    tokens = geo.global_batch * stage.tokens_per_sample
    flops = stage.flops_per_step(geo.global_batch)
    return {"system": system, "gpu": name, "micro_batch": geo.micro_batch, "grad_accum": geo.grad_accum,
            "ds_config": cfg.ds_config, "precision": dsc.precision(built.ds_cfg),
            "step_s": step_s, "tokens_per_s": tokens / step_s, "flops": flops,
            "mfu": flops / step_s / (gpu_peak_tflops(name) * 1e12), "peak_bytes": peak_bytes,
            "losses": losses, "watched_updates": watched, "problems": waits.problems(),
            "allowed_per_update": waits.per_update(max(watched, 1)),
            "waits": [w.__dict__ for w in waits.waits],
            "compiled": built.compiled.stats() if built.compiled is not None else None}


def main(argv: list[str]) -> int:
    from mm_ds.tools.bench.data import spread_corpus

    work, system, out, *mode = Path(argv[0]), argv[1], Path(argv[2]), *argv[3:]
    if system not in SYSTEMS or mode not in ([], ["compiled"]):
        raise SystemExit(f"paper_update.py: system {system!r} {' '.join(mode)}: choose one of {', '.join(SYSTEMS)}, "
                         f"then optionally `compiled`")
    say = lambda m: print(f"[paper_update] {m}", file=sys.stderr, flush=True)  # noqa: E731
    corpus = work / "corpus"
    if not (corpus / "meta.json").is_file():
        with tempfile.TemporaryDirectory(prefix="corpus-", dir=work) as tmp:
            made, _, _, _ = spread_corpus(Path(tmp), CORPUS_MB, 50_000, min(8, len(os.sched_getaffinity(0))), say)
            made.rename(corpus)
    result = update_on_one_gpu(system, corpus, work / "runs" / "_".join([system, *mode]),
                               overrides=("train.compile=true",) if mode else ())
    say(f"{system}: {json.dumps({k: v for k, v in result.items() if k != 'waits'}, default=float)}")
    out.write_text(json.dumps(result, indent=1, default=float))
    return 0


def leave(rc: int) -> None:
    """Exit without interpreter finalization, as `dist.finish` does for a rank: the process group's worker and
    store threads can abort a process whose work is done ("terminate called without an active exception")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))

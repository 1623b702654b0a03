"""The one training loop every stage uses.

A stage hands over a `Stage` and `build_engine` (build.py) makes its DeepSpeed engine; `train` resumes, trains, logs,
checkpoints, and finally writes consolidated weights for the next stage. `mm-ds bench` builds its engines with the
same `build_engine` and times `train_step`.

Resume is exact: batches and dropout masks are pure functions of (seed, step, micro-step, rank), and the
engine restores model, optimizer and LR-scheduler state, so a resumed run retraces the uninterrupted one, bit for
bit on CPU. On CUDA `index_select`'s and SDPA's backward passes and the loss add with atomics in no fixed order:
two runs, resumed or not, part in the last bits (docs/reliability.md).
"""

from __future__ import annotations

import logging
import math
import resource
import time
from pathlib import Path

import torch

from .. import faults
from ..checkpointing import checkpoint as ckpt_io
from ..checkpointing import resharding as universal
from ..checkpointing import rundir
from ..distributed import dist, stop
from . import compiled, handoff
from . import ds_config as dsc
from .boundary import Boundary
from .build import Stage, build_engine, release
from .ds_config import Geometry
from .peaks import device_peak_flops
from .prefetch import Prefetcher
from .resolved import Resolved
from .train_log import LogWindow, RowWriter, nonfinite_skips


def _dropout_seed(seed: int, step: int, micro: int, rank: int) -> int:
    # Dropout masks become a function of position in training, not of history: resume is bitwise exact.
    return (seed * 1_000_003 + step * 10_007 + micro * 101 + rank) % (2 ** 63 - 1)


def dropout_generator(device: torch.device) -> torch.Generator:
    """The generator dropout on `device` draws from. Seeding it alone, not `torch.manual_seed` (every CUDA
    device, and XPU and MTIA through lazy calls that format a Python traceback each time: ~0.3 ms of host
    time per micro-step, mm-ds bench's host-side figure), is the same seed for the masks."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


# ---------------------------------------------------------------- the loop

def train(stage: Stage, run_dir: str | Path, resume: bool = False, progress: bool = True,
          reshard: bool = False, given: Resolved | None = None) -> Path:
    """Train `stage` into `run_dir` and return final/. `given`: the run as its launching side resolved it
    (mm_ds/stages/resolve.py, which checked it), whose resume point, --reshard and progress bar it takes over
    `resume`, `reshard` and `progress`. A stop signal ends it after a checkpoint: `stop.Stopped` on every rank
    (mm_ds/runtime/distributed/stop.py)."""
    cfg = stage.cfg
    run_dir = Path(run_dir)
    if cfg.train.steps == 0:
        return handoff.publish_as_built(stage, run_dir)
    if given is not None:
        resume, reshard, progress = given.resume, given.reshard, given.progress
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # deepspeed.utils.logger
    with stop.handling(cfg.train.stop_signals):  # a stop signal only sets a flag; the update boundaries read it
        return _train(stage, run_dir, resume, progress, reshard, given)


def _train(stage: Stage, run_dir: Path, resume: bool, progress: bool, reshard: bool, given: Resolved | None) -> Path:
    cfg = stage.cfg
    rank, local_rank, world = dist.init()
    built = build_engine(stage, world, run_dir, resume, reshard, given)
    engine, ds_cfg, geo = built.engine, built.ds_cfg, built.geo
    frozen_dir = str(run_dir / ckpt_io.FROZEN) if built.n_train < built.n_total else None

    start_step, tokens, nonfinite, save_s = _resume(built, stage, run_dir, rank) if resume else (0, 0, 0, None)
    schedule = stage.schedule
    # FLOPs (stage.flops_until) count the whole global batch; the peak is one rank's device (GPU, or CPU threads).
    peak = device_peak_flops(cfg.peak_tflops, half=dsc.precision(ds_cfg) != "fp32") * world
    tokens_per_step = geo.global_batch * stage.tokens_per_sample
    if rank == 0:
        print(_start_line(built, cfg, world, start_step), flush=True)

    def meta(step: int) -> dict:
        return (handoff.meta_of(stage, step, tokens, stage.flops_until(step, geo.global_batch), ds_cfg, world)
                | ({"frozen": frozen_dir} if frozen_dir else {}))

    bar = _progress_bar(cfg, start_step) if progress and rank == 0 else None
    engine.train()
    window = LogWindow(geo.grad_accum)
    edge = Boundary(engine, run_dir, cfg, rank, save_s)  # the ranks' agreement after each update: stop, save
    last_checkpoint = edge.last
    ahead = Prefetcher(stage.batches, rank, geo, start_step, cfg.train.steps, ahead=cfg.data.prefetch,
                       pin=engine.device.type == "cuda")
    writer = _row_writer(run_dir, ds_cfg)  # rank 0's thread; on the other ranks it writes nothing
    try:
        if (early := edge.at_start(start_step)) is not None:
            raise edge.stopped(start_step, early)
        for step in range(start_step, cfg.train.steps):
            depth = schedule.depth_for(step) if schedule else None
            sums, data_time, skipped = train_step(engine, stage, step, rank, geo, ahead.get)
            window.add(step, sums, skipped, data_time)
            tokens += tokens_per_step
            done = step + 1
            agreed = edge.after_update(done)  # read one update late: no wait for the device
            phase_ends = schedule is not None and done < cfg.train.steps and schedule.depth_for(done) != depth
            row = done % cfg.train.log_every == 0 or done == cfg.train.steps or phase_ends  # never spans phases
            row = row or agreed.stop is not None  # a stop's row says what its save cost
            checkpoint = edge.kind(done, agreed)
            if row or checkpoint:  # the one host read of these updates (mm_ds/runtime/training/train_log.py)
                settled = window.read(row)
                nonfinite = nonfinite_skips(settled, nonfinite, cfg.train.max_nonfinite_steps,
                                            engine.fp16_enabled(), last_checkpoint,
                                            say=lambda m: rank == 0 and print(m, flush=True))
                if schedule is not None and schedule.plateau:  # every rank sees the same losses
                    schedule.observe(settled, done)
            saved = {}
            if checkpoint:  # the rows so far written (else every rank stops with rank 0's reason), then the save,
                dist.on_rank0(writer.flush, f"writing {rundir.logs_dir(run_dir)}")  # before the row that logs its cost
                client = _client(stage, done, tokens, nonfinite)
                saved = edge.save(done, agreed, client, meta(done) | {"kind": checkpoint})
                last_checkpoint = edge.last
                window.started += saved.get("save_s", 0.0)  # rows time the updates, not the saves
            if row:
                logs = _row_logs(engine, stage, geo, window, settled, done, depth, nonfinite, peak)
                writer.put({"step": done, "total_steps": cfg.train.steps, "tokens": tokens} | logs | saved)  # no wait
                _show(bar, logs)
                window.reset()
            if bar is not None:
                bar.update(1)
            if agreed.stop:
                raise edge.stopped(done, agreed.stop)
            faults.after_step(done, rank, cfg.stage)  # a test's fault point (MM_DS_KILL_AT); inert otherwise
        dist.on_rank0(writer.close, f"writing {rundir.logs_dir(run_dir)}")
    finally:
        edge.close()
        ahead.close()
        writer.close(timeout=30.0)  # after an error: the rows queued before it (a no-op after the close above)
    if bar is not None:
        bar.close()
    if faults.ARMED:  # a test's look at the live frozen weights (MM_DS_DUMP_FROZEN); never in a production run
        faults.after_training(engine, f"{cfg.stage}.{cfg.system}.{cfg.lang}")

    release(engine)
    final_dir = run_dir / ckpt_io.FINAL
    dist.on_rank0(lambda: handoff.publish(stage, run_dir, meta(cfg.train.steps)), f"writing {final_dir}")
    return final_dir


def _row_writer(run_dir: Path, ds_cfg: dict) -> RowWriter:
    """Collective: rank 0's writer of log rows, its monitors opened (a failure there stops every rank); on the
    other ranks one that writes nothing."""
    made = [RowWriter(None, ds_cfg)]
    dist.on_rank0(lambda: made.insert(0, RowWriter(rundir.train_log(run_dir), ds_cfg)),
                  f"opening the monitors under {rundir.logs_dir(run_dir)}")
    return made[0]


def _client(stage: Stage, done: int, tokens: int, nonfinite: int) -> dict:
    """A checkpoint's client state: what the loop needs to go on from update `done` exactly."""
    return {"step": done, "tokens": tokens, "rng_cpu": torch.get_rng_state(), "seed": stage.cfg.train.seed,
            "nonfinite_steps": nonfinite} | ({"schedule": stage.schedule.state_dict()} if stage.schedule else {})


def _start_line(built, cfg, world: int, start_step: int) -> str:
    engine, ds_cfg, geo = built.engine, built.ds_cfg, built.geo
    return (f"[mm-ds] {cfg.system}/{cfg.stage} lang={cfg.lang}: {built.n_train:,} of {built.n_total:,} parameters "
            f"train; world={world} micro={geo.micro_batch} accum={geo.grad_accum} global={geo.global_batch}; "
            f"steps {start_step}->{cfg.train.steps}; zero={dsc.zero_stage(ds_cfg)} {dsc.precision(ds_cfg)}; "
            f"optimizer {type(engine.optimizer).__name__} over {type(engine.basic_optimizer).__name__}; "
            f"backend {dist.backend()}")


def _show(bar, logs: dict) -> None:
    if bar is not None:
        bar.set_postfix({k: f"{v:.3g}" for k, v in logs.items()
                         if k in ("loss", "loss_main", "loss_secondary", "tokens_per_s", "mfu")}, refresh=False)


def _progress_bar(cfg, start_step: int):
    from tqdm import tqdm
    return tqdm(total=cfg.train.steps, initial=start_step, desc=f"{cfg.system}/{cfg.stage}", dynamic_ncols=True,
                mininterval=2.0)


def _resume(built, stage: Stage, run_dir: Path, rank: int) -> tuple[int, int, int, float | None]:
    """Load the resume point into the engine: (step, tokens, non-finite updates skipped) it had reached, and the
    seconds the save before it took (a stop's estimate)."""
    if built.found is None:
        if rank == 0:
            print(f"[mm-ds] --resume: no complete checkpoint in {run_dir}, starting from step 0", flush=True)
        return 0, 0, 0, None
    client = ckpt_io.load_into_engine(built.engine, built.load_from)
    if built.load_from != built.found:
        universal.restore_frozen(built.engine, built.load_from)
    if stage.schedule is not None:
        stage.schedule.load_state_dict(client["schedule"])
    if rank == 0:
        print(f"[mm-ds] resumed from {built.found} at step {client['step']}", flush=True)
    return client["step"], client["tokens"], client.get("nonfinite_steps", 0), client.get("last_save_s")


def _row_logs(engine, stage: Stage, geo: Geometry, window: LogWindow, settled, done: int, depth, nonfinite: int,
              peak: float) -> dict:
    """A log row's values over the window of updates that ends at `done`."""
    logs = settled.logs | ({"nonfinite_steps": nonfinite} if nonfinite else {})
    seconds, n = window.seconds(), window.updates
    window_flops = stage.flops_until(done, geo.global_batch) - stage.flops_until(done - n, geo.global_batch)
    logs.update(lr=engine.get_lr()[0], tokens_per_s=geo.global_batch * stage.tokens_per_sample * n / seconds,
                step_time_s=seconds / n, data_share=window.data_time / seconds,
                tflops=window_flops / seconds / 1e12, flops=stage.flops_until(done, geo.global_batch))
    if stage.schedule is not None:
        logs.update(phase=stage.schedule.depths.index(depth), depth=depth)
    logs["mfu"] = float("nan") if math.isnan(peak) else logs["tflops"] * 1e12 / peak
    logs["peak_mem_gib"] = peak_memory_gib(engine.device)
    gn = engine.get_global_grad_norm()
    if gn is not None:
        logs["grad_norm"] = float(gn)
    return logs


def peak_memory_gib(device: torch.device) -> float:
    """The most memory this rank has held so far: on a GPU its tensors' (the caching allocator's count, read without
    waiting for the device), on a CPU the process's resident set (ru_maxrss: KiB on Linux)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


LOGGED = ("loss", "correct", "masked", "examples")  # the per-micro-step outputs the log rows sum


def train_step(engine, stage: Stage, step: int, rank: int, geo: Geometry, batch_for=None
               ) -> tuple[dict[str, torch.Tensor], float, bool | torch.Tensor]:
    """One optimizer update (geo.grad_accum micro steps). Returns the summed per-micro-step logs, left on the
    device (mm_ds/runtime/training/train_log.py reads them when a row is due), the seconds spent waiting for batches,
    and whether the update was skipped as non-finite (`skip_nonfinite`). `batch_for(step, micro)` gives the
    batches (the loop's `Prefetcher`); by default they are built here. `mm-ds bench` times this function."""
    batch_for = batch_for or (lambda s, m: stage.batches(s, m, rank, geo))
    # Multi-depth Step 2: the depth is the schedule's when the update runs (a plateau may just have moved it).
    depth = {"depth": stage.schedule.depth_for(step)} if stage.schedule is not None else {}
    logged: list[dict[str, torch.Tensor]] = []
    data_time, skipped, masks = 0.0, False, dropout_generator(engine.device)
    for micro in range(geo.grad_accum):
        td = time.perf_counter()
        batch = batch_for(step, micro)
        batch = {k: (v.to(engine.device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
        data_time += time.perf_counter() - td
        masks.manual_seed(_dropout_seed(stage.cfg.train.seed, step, micro, rank))
        out = engine(**batch, **depth)
        if faults.ARMED:  # a test's fault point (MM_DS_NAN_AT); never in a production run
            out = faults.poison(out, step + 1, rank)
        engine.backward(out["loss"])
        if micro == geo.grad_accum - 1:
            skipped = skip_nonfinite(engine)
        engine.step()
        logged.append({k: v for k, v in out.items() if k.startswith(LOGGED)})
    with torch.no_grad():  # summed once per update, not per micro-step: 3 ops per key instead of 3 x grad_accum
        sums = {k: torch.stack([o[k] for o in logged]).double().sum(0) for k in logged[0]}
    if skipped is False:  # DeepSpeed's own optimizers decided (their own host read); free to ask
        skipped = not engine.was_step_applied()
    if rank == 0 and (made := compiled.of(engine.module)) is not None and (news := made.news()) is not None:
        print(news, flush=True)  # the update's compiles: at the first updates, then at a new depth or mask
    return sums, data_time, skipped


def skip_nonfinite(engine) -> bool | torch.Tensor:
    """Give a plain optimizer DeepSpeed's skip of a non-finite update. The ZeRO 1-3 optimizers (and the
    fp16/bf16 wrappers) skip an update whose gradient norm is not finite by themselves: no parameter or
    optimizer-state change, no LR-scheduler step, `engine.skipped_steps` + 1; this returns False for them (the
    loop asks `engine.was_step_applied()`). Under ZeRO 0 in fp32, DeepSpeed hands the update to the torch
    optimizer, which would apply NaN. Called after the last micro-step's backward (the gradients are
    all-reduced by then, so every rank sees the same), for torch's fused Adam/AdamW (what mm-ds configures) it
    hands the optimizer a device flag, `found_inf`, that makes its kernel leave parameters, moments and step
    count untouched, with no host read; the flag is returned. The LR schedule still advances over such an
    update (DeepSpeed cannot know of it without a read). Any other optimizer costs one host read per update:
    non-finite gradients are dropped and DeepSpeed's `overflow` flag raised, as for its own optimizers."""
    opt = engine.optimizer
    if type(opt).__module__.startswith("deepspeed.runtime"):
        return False  # a DeepSpeed optimizer: it checks (and skips) itself
    params = [p for p in engine.module.parameters() if p.grad is not None]
    if not params:
        return False
    bad = ~torch.isfinite(torch.stack(torch._foreach_norm([p.grad for p in params])).sum())
    if isinstance(opt, torch.optim.Adam | torch.optim.AdamW) and opt.defaults.get("fused"):
        opt.found_inf = bad.float()
        return opt.found_inf
    opt.overflow = dist.any_rank(bool(bad))
    if opt.overflow:
        for p in params:
            p.grad = None  # the optimizer leaves parameters without gradients (and their state) untouched
    return opt.overflow

"""The one training loop every stage uses.

A stage hands over a `Stage`: the model after surgery, which parameters train, a deterministic batch
function and its FLOPs per update. This module resolves the DeepSpeed config, freezes parameters *before*
`deepspeed.initialize` (so ZeRO keeps no optimizer state for them), resumes, trains, logs, checkpoints,
and finally writes consolidated weights for the next stage.

Resume is exact: batches and dropout masks are pure functions of (seed, step, micro-step, rank), and the
engine restores model, optimizer and LR-scheduler state, so a resumed run retraces the uninterrupted one.
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import checkpoint as ckpt_io
from . import faults
from .config import ConfigError, RunConfig, dump_yaml, to_dict


@dataclass(frozen=True)
class Geometry:
    """Batch geometry, resolved before any engine exists so bad values fail early."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    world_size: int


@dataclass
class Stage:
    cfg: RunConfig
    model: torch.nn.Module
    trainable: Callable[[str], bool]
    batches: Callable[[int, int, int, Geometry], dict]
    """(step, micro_step, rank, geometry) -> keyword arguments of model.forward (tensors on CPU)."""
    flops_per_step: Callable[[int], float]
    """global batch -> analytic FLOPs of one update (mm_ds.flops)."""
    tokens_per_sample: int
    parent: str | None = None
    parent_flops: float = 0.0
    meta: dict = field(default_factory=dict)


# ---------------------------------------------------------------- distributed set-up

def init_distributed() -> tuple[int, int, int]:
    """(rank, local_rank, world_size). Outside any launcher, runs as a world of one."""
    import deepspeed

    from .launch import adopt_env
    adopt_env()  # srun / mpirun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* from the launcher's own variables
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ and "PMI_RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if not torch.distributed.is_initialized():
        if not torch.cuda.is_available():
            skip_shm_comm_build()
        _bind_rendezvous()
        deepspeed.init_distributed(verbose=False)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    from .watchdog import start as watch_launcher
    watch_launcher(rank)  # a SIGKILLed launcher must not leave this rank running (mm_ds/watchdog.py)
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
    if not torch.cuda.is_available():
        # CPU ranks share the cores: one rank's BLAS threads must not fight another's.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", world)))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
        keep_freed_memory()
    else:
        torch.cuda.set_device(local_rank)
    return rank, local_rank, world


def skip_shm_comm_build() -> None:
    """On CPU, DeepSpeed's communication backend JIT-compiles its shared-memory op (C++, ~25 s on 2 cores,
    again for every new virtual environment) at start-up. Only `inference_all_reduce` (tensor-parallel
    inference) uses it; training collectives go through torch.distributed (gloo). Marking the op
    incompatible skips the build; DeepSpeed keeps `__compatible_ops__` as one dict so that edits persist."""
    import deepspeed.ops

    ops = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(ops, dict):
        ops["deepspeed_shm_comm"] = False


_RENDEZVOUS_SOCKET = None


def _bind_rendezvous() -> None:
    """env:// rendezvous that listens only on MASTER_ADDR. torch's own TCPStore server binds every interface
    (`::`) whatever MASTER_ADDR says; here rank 0 binds the listening socket to MASTER_ADDR:MASTER_PORT
    itself and hands it to the store (`master_listen_fd`), then DeepSpeed adopts the process group."""
    global _RENDEZVOUS_SOCKET
    import socket

    from deepspeed.accelerator import get_accelerator
    from torch.distributed.constants import default_pg_timeout

    env = os.environ
    if not all(k in env for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")):
        return  # another rendezvous (e.g. MPI discovery inside DeepSpeed): leave it to DeepSpeed
    rank, world, addr, port = int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])
    fd = None
    if rank == 0:
        family, _, _, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(where)
        except OSError as e:
            raise ConfigError(f"rank 0 cannot listen on MASTER_ADDR:MASTER_PORT={addr}:{port} ({e}); choose a free "
                              f"launch.master_port, and an address of rank 0's machine as launch.master_addr") from None
        sock.listen(max(128, world))
        _RENDEZVOUS_SOCKET, fd = sock, sock.fileno()  # kept open for the life of the process group
    store = torch.distributed.TCPStore(addr, port, world, rank == 0, default_pg_timeout, master_listen_fd=fd)
    torch.distributed.init_process_group(get_accelerator().communication_backend_name(), store=store, rank=rank,
                                         world_size=world, timeout=default_pg_timeout)


def keep_freed_memory() -> None:
    """CPU training allocates and frees the same large tensors every step (gradients, ZeRO's flat
    partitions, attention scores). glibc hands blocks over 32 MiB back to the kernel on free, so each step
    faults them in again, page by page; on a VM that was ~10% of a base-shape step. Keep freed memory in the
    heap instead (RSS then stays at the step's high-water mark). MM_DS_MALLOC=system opts out; a no-op
    without glibc."""
    if os.environ.get("MM_DS_MALLOC") == "system":
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    mallopt(M_MMAP_MAX, 0)  # no mmap for large blocks: they come from (and return to) the heap
    mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1)  # never shrink the heap (2 GiB of free top before trimming)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- DeepSpeed config

def find_ds_config(name: str) -> Path:
    """A path, or a name in the repository's / installed ds_configs/."""
    p = Path(name)
    if p.is_file():
        return p
    here = Path(__file__).resolve().parent
    for root in (here.parent / "ds_configs", here / "ds_configs", Path(os.sys.prefix) / "share/mm-ds/ds_configs"):
        if (root / name).is_file():
            return root / name
    raise ConfigError(f"DeepSpeed config {name!r} not found (looked at the path and in ds_configs/); "
                      f"pass --ds-config PATH or a name such as fp32_zero1.json")


def read_ds_config(cfg: RunConfig) -> tuple[Path, dict]:
    path = find_ds_config(cfg.ds_config)
    try:
        return path, json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"DeepSpeed config {path} is not valid JSON: {e}") from e


def global_batch(cfg: RunConfig) -> int:
    """Sequences per update: the run config's, else the DeepSpeed JSON's (it does not depend on world size)."""
    path, ds = read_ds_config(cfg)
    gb = cfg.train.global_batch or ds.get("train_batch_size")
    if not gb:
        raise ConfigError(f"batch geometry unset: give train.global_batch or train_batch_size in {path}")
    return int(gb)


def resolve_ds_config(cfg: RunConfig, world_size: int, run_dir: Path | None) -> tuple[dict, Geometry]:
    path, ds = read_ds_config(cfg)
    t = cfg.train
    global_batch = t.global_batch or ds.get("train_batch_size")
    micro = t.micro_batch or ds.get("train_micro_batch_size_per_gpu")
    if not global_batch or not micro:
        raise ConfigError(f"batch geometry unset: give train.global_batch and train.micro_batch, or "
                          f"train_batch_size and train_micro_batch_size_per_gpu in {path}")
    if global_batch % (micro * world_size):
        raise ConfigError(f"global batch {global_batch} is not divisible by micro batch {micro} x world size "
                          f"{world_size}; choose train.global_batch as a multiple of {micro * world_size} or "
                          f"change train.micro_batch / the number of ranks")
    geo = Geometry(global_batch, micro, global_batch // (micro * world_size), world_size)
    ds["train_batch_size"] = geo.global_batch
    ds["train_micro_batch_size_per_gpu"] = geo.micro_batch
    ds["gradient_accumulation_steps"] = geo.grad_accum
    opt = ds.setdefault("optimizer", {"type": "AdamW", "params": {}})
    opt.setdefault("params", {})["lr"] = t.lr
    sched = ds.setdefault("scheduler", {"type": "WarmupDecayLR", "params": {}})
    if sched.get("type") != "WarmupDecayLR":
        raise ConfigError(f"{path}: scheduler.type must be WarmupDecayLR (the paper's linear warm-up and decay)")
    sp = sched.setdefault("params", {})
    if sp.get("warmup_type", "log") != "linear":
        raise ConfigError(f"{path}: scheduler.params.warmup_type must be \"linear\"; DeepSpeed's default "
                          f"warms up log-shaped, which is not the paper's recipe")
    sp.update(total_num_steps=t.steps, warmup_max_lr=t.lr, warmup_num_steps=max(1, t.warmup_steps))
    sp.setdefault("warmup_min_lr", 0.0)
    if not torch.cuda.is_available():
        if ds.get("bf16", {}).get("enabled") or ds.get("fp16", {}).get("enabled"):
            raise ConfigError(f"{path} enables bf16/fp16, but there is no GPU: CPU training is fp32 "
                              f"(use fp32_zero*.json)")
        opt["params"].setdefault("torch_adam", True)
        if opt["params"]["torch_adam"] and not opt["params"].get("foreach"):
            # torch's fused CPU AdamW: one pass over the flat ZeRO partition instead of ~10 full-size
            # temporaries (base shape: 0.2 s instead of 1.9 s per step on one core).
            opt["params"].setdefault("fused", True)
    if run_dir is not None:
        mon = {"enabled": True, "output_path": str(run_dir / "logs"), "job_name": cfg.stage}
        ds.setdefault("csv_monitor", mon)
        for k in ("tensorboard", "wandb"):
            if ds.get(k, {}).get("enabled"):
                ds[k].setdefault("output_path", str(run_dir / "logs"))
                ds[k].setdefault("job_name", cfg.stage)
    ds["steps_per_print"] = ds.get("steps_per_print", 10 ** 9)
    return ds, geo


def zero_stage(ds: dict) -> int:
    return int(ds.get("zero_optimization", {}).get("stage", 0))


# ---------------------------------------------------------------- checkpoint schedule

def is_checkpoint_step(step: int, cfg: RunConfig) -> bool:
    t = cfg.train
    return step == t.steps or step in t.checkpoint_steps or (t.checkpoint_every and step % t.checkpoint_every == 0)


def _dropout_seed(seed: int, step: int, micro: int, rank: int) -> int:
    # Dropout masks become a function of position in training, not of history: resume is bitwise exact.
    return (seed * 1_000_003 + step * 10_007 + micro * 101 + rank) % (2 ** 63 - 1)


# ---------------------------------------------------------------- peak FLOP/s for MFU

_GPU_BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "V100": 125.0, "A10": 125.0, "L4": 121.0}


def device_peak_flops(cfg: RunConfig) -> float:
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for k, v in _GPU_BF16_PEAK_TFLOPS.items():
            if k in name:
                return v * 1e12
        return float("nan")
    return measure_matmul_peak()["median_flops"]


def measure_matmul_peak(n: int = 1024, reps: int = 8) -> dict:
    """fp32 FLOP/s of an n^3 matmul with this process's threads: median and best of `reps` (CPU MFU's peak)."""
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=c)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - t0)
    flop = 2 * n ** 3
    return {"n": n, "median_flops": flop / statistics.median(times), "best_flops": flop / min(times)}


# ---------------------------------------------------------------- the loop

def train(stage: Stage, run_dir: str | Path, resume: bool = False, progress: bool = True,
          reshard: bool = False) -> Path:
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    import logging
    ds_logger.setLevel(logging.WARNING)
    cfg = stage.cfg
    run_dir = Path(run_dir)
    rank, local_rank, world = init_distributed()
    ds_cfg, geo = resolve_ds_config(cfg, world, run_dir)

    if rank == 0:
        check_run_dir(run_dir, resume)
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt_io.write_text_atomic(run_dir / "run_config.yaml", dump_yaml(cfg))
        ckpt_io.write_json_atomic(run_dir / "ds_config.json", ds_cfg)
    torch.distributed.barrier()

    model = stage.model
    from .model import param_groups, set_trainable
    n_train, n_total = set_trainable(model, stage.trainable)
    wd = ds_cfg["optimizer"].get("params", {}).get("weight_decay", 0.0)
    if zero_stage(ds_cfg) == 3 and hasattr(model, "heads"):
        for head in model.heads().values():  # the tied projection lives in another module
            deepspeed.zero.register_external_parameter(head, model.embed.tokens.weight)
    found = ckpt_io.find_resume_point(run_dir) if resume else None
    load_from = found
    if found is not None:
        from . import universal  # another world size: reshard through a universal checkpoint
        check_resumable(found, cfg)
        load_from = universal.prepare(found, world, ds_cfg, rank, force=reshard)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model, wd),
                                           config=copy.deepcopy(ds_cfg))

    start_step, tokens, nonfinite = 0, 0, 0
    if resume:
        if found is not None:
            client = ckpt_io.load_into_engine(engine, load_from)
            if load_from != found:
                universal.restore_frozen(engine, load_from)
            start_step, tokens = client["step"], client["tokens"]
            nonfinite = client.get("nonfinite_steps", 0)
            if rank == 0:
                print(f"[mm-ds] resumed from {found} at step {start_step}", flush=True)
        elif rank == 0:
            print(f"[mm-ds] --resume: no complete checkpoint in {run_dir}, starting from step 0", flush=True)

    flops_step = stage.flops_per_step(geo.global_batch)
    # flops_step counts the whole global batch; the peak is one rank's device (GPU, or CPU threads).
    peak = device_peak_flops(cfg) * world
    tokens_per_step = geo.global_batch * stage.tokens_per_sample
    if rank == 0:
        print(f"[mm-ds] {cfg.system}/{cfg.stage} lang={cfg.lang}: {n_train:,} of {n_total:,} parameters train; "
              f"world={world} micro={geo.micro_batch} accum={geo.grad_accum} global={geo.global_batch}; "
              f"steps {start_step}->{cfg.train.steps}; zero={zero_stage(ds_cfg)}", flush=True)

    bar = None
    if progress and rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=cfg.train.steps, initial=start_step, desc=f"{cfg.system}/{cfg.stage}",
                   dynamic_ncols=True, mininterval=2.0)
    engine.train()
    window: dict[str, float] = {}
    window_steps, window_time, data_time, window_skipped = 0, 0.0, 0.0, 0
    for step in range(start_step, cfg.train.steps):
        t0 = time.perf_counter()
        step_logs, step_data_time = train_step(engine, stage, step, rank, geo)
        data_time += step_data_time
        skipped = _nonfinite_check(engine, step, step_logs, run_dir, rank, nonfinite, cfg.train.max_nonfinite_steps)
        nonfinite += skipped
        window_skipped += skipped
        dt = time.perf_counter() - t0
        window_steps += 1
        window_time += dt
        for k, v in ({} if skipped else step_logs).items():
            window[k] = window.get(k, 0.0) + v
        tokens += tokens_per_step
        done = step + 1
        if done % cfg.train.log_every == 0 or done == cfg.train.steps:
            logs = _reduce_logs(window, max(1, window_steps - window_skipped) * geo.grad_accum)
            if nonfinite:
                logs["nonfinite_steps"] = nonfinite
            logs.update(lr=engine.get_lr()[0], tokens_per_s=tokens_per_step * window_steps / window_time,
                        step_time_s=window_time / window_steps, data_share=data_time / window_time,
                        tflops=flops_step * window_steps / window_time / 1e12)
            logs["mfu"] = logs["tflops"] * 1e12 / peak if peak == peak else float("nan")
            gn = engine.get_global_grad_norm()
            if gn is not None:
                logs["grad_norm"] = float(gn)
            if rank == 0:
                if engine.monitor is not None and engine.monitor.enabled:
                    engine.monitor.write_events([(f"train/{k}", v, done) for k, v in logs.items()])
                _append_jsonl(run_dir / "logs" / "train.jsonl", {"step": done, "tokens": tokens} | logs)
                if bar is not None:
                    bar.set_postfix({k: f"{v:.3g}" for k, v in logs.items()
                                     if k in ("loss", "loss_main", "loss_aux", "tokens_per_s", "mfu")}, refresh=False)
            window, window_steps, window_time, data_time, window_skipped = {}, 0, 0.0, 0.0, 0
        if bar is not None:
            bar.update(1)
        if is_checkpoint_step(done, cfg):
            meta = _meta(stage, ds_cfg, world, done, tokens, flops_step)
            client = {"step": done, "tokens": tokens, "rng_cpu": torch.get_rng_state(), "seed": cfg.train.seed,
                      "nonfinite_steps": nonfinite}
            ckpt_io.save(engine, run_dir, done, client, meta)
        _maybe_inject_fault(done, rank, cfg.stage)
    if bar is not None:
        bar.close()

    final_tag = ckpt_io.tag_for(cfg.train.steps)
    final_dir = run_dir / ckpt_io.FINAL
    if rank == 0:
        sd = ckpt_io.consolidate(ckpt_io.checkpoints_dir(run_dir) / final_tag)
        want = set(stage.model.state_dict())
        if set(sd) != want:  # never publish weights the next stage could not load
            raise ckpt_io.CheckpointError(f"consolidated weights of {final_tag} do not match the model: missing "
                                          f"{sorted(want - set(sd))[:4]}, unexpected {sorted(set(sd) - want)[:4]}")
        ckpt_io.write_final(final_dir, sd, _meta(stage, ds_cfg, world, cfg.train.steps, tokens, flops_step))
        print(f"[mm-ds] wrote {final_dir}", flush=True)
    torch.distributed.barrier()
    return final_dir


def train_step(engine, stage: Stage, step: int, rank: int, geo: Geometry) -> tuple[dict[str, float], float]:
    """One optimizer update (geo.grad_accum micro steps): the summed per-micro-step logs, and the seconds
    spent fetching batches. `mm-ds bench` times this same function."""
    step_logs: dict[str, float] = {}
    data_time = 0.0
    for micro in range(geo.grad_accum):
        td = time.perf_counter()
        batch = stage.batches(step, micro, rank, geo)
        batch = {k: (v.to(engine.device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
        data_time += time.perf_counter() - td
        torch.manual_seed(_dropout_seed(stage.cfg.train.seed, step, micro, rank))
        out = faults.poison(engine(**batch), step + 1, rank)  # test hook MM_DS_NAN_AT; inert otherwise
        engine.backward(out["loss"])
        if micro == geo.grad_accum - 1:
            _drop_nonfinite_grads(engine)
        engine.step()
        for k, v in out.items():
            if k.startswith(("loss", "correct", "masked", "examples")):
                step_logs[k] = step_logs.get(k, 0.0) + float(v.detach())
    return step_logs, data_time


def _reduce_logs(window: dict[str, float], n_micro: int) -> dict[str, float]:
    keys = sorted(window)
    t = torch.tensor([window[k] for k in keys], dtype=torch.float64)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
        t /= torch.distributed.get_world_size()
    vals = dict(zip(keys, t.tolist()))
    out = {k: vals[k] / n_micro for k in keys if k.startswith("loss")}
    # MLM accuracy over masked tokens per head; downstream accuracy over examples.
    denom = vals.get("masked_tokens", vals.get("examples"))
    for k in keys:
        if k.startswith("correct") and denom:
            out["acc" + k[len("correct"):]] = vals[k] / denom
    return out


def _meta(stage: Stage, ds_cfg: dict, world: int, step: int, tokens: int, flops_step: float) -> dict:
    cfg = stage.cfg
    flops = flops_step * step
    return stage.meta | {
        "stage": cfg.stage, "system": cfg.system, "lang": cfg.lang, "step": step, "tokens": tokens,
        "flops": flops, "flops_cumulative": stage.parent_flops + flops, "parent": stage.parent,
        "model": to_dict(cfg.model), "run_config": to_dict(cfg), "zero_stage": zero_stage(ds_cfg),
        "world_size": world, "time": ckpt_io.now(),
    }


def _append_jsonl(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def check_run_dir(run_dir: Path, resume: bool) -> None:
    if resume or not run_dir.exists():
        return
    if ckpt_io.list_checkpoints(run_dir) or (run_dir / ckpt_io.FINAL).exists():
        raise ConfigError(f"{run_dir} already holds checkpoints of a run; pass --resume to continue it, or "
                          f"choose a new --out (nothing was overwritten)")


def check_resumable(found: Path, cfg: RunConfig) -> None:
    meta = ckpt_io.read_meta(found)
    mine = to_dict(cfg.model)
    if meta.get("model") != mine:
        diff = {k: (meta.get("model", {}).get(k), v) for k, v in mine.items() if meta.get("model", {}).get(k) != v}
        raise ConfigError(f"--resume: {found} was trained with a different architecture "
                          f"(checkpoint vs. now: {diff}); resume with the same model config or use a new --out")
    for key in ("stage", "system"):
        if meta.get(key) != getattr(cfg, key):
            raise ConfigError(f"--resume: {found} is {key}={meta.get(key)!r}, this run is {getattr(cfg, key)!r}")


def _maybe_inject_fault(step: int, rank: int, stage: str | None = None) -> None:
    """Test hook: MM_DS_KILL_AT=STEP[:RANK|:launcher] SIGKILLs that rank (default 0), or the launcher, after
    STEP, like a lost node or a killed job (mm_ds/faults.py)."""
    faults.after_step(step, rank, stage)


def _drop_nonfinite_grads(engine) -> None:
    """Give a plain optimizer DeepSpeed's skip. The ZeRO 1-3 optimizers (and the fp16/bf16 wrappers) skip an
    update whose gradient norm is not finite by themselves: no parameter or optimizer-state change, no
    LR-scheduler step, `engine.skipped_steps` + 1. Under ZeRO 0 in fp32, DeepSpeed hands the update to the
    torch (or fused) optimizer, which would apply NaN. Called after the last micro-step's backward (the
    gradients are all-reduced by then), it drops non-finite gradients and raises the `overflow` flag that
    DeepSpeed's `_take_model_step` reads to skip the LR step and count the skip, as for its own optimizers."""
    opt = engine.optimizer
    if type(opt).__module__.startswith("deepspeed.runtime"):
        return  # a DeepSpeed optimizer: it checks (and skips) itself
    params = [p for p in engine.module.parameters() if p.grad is not None]
    bad = torch.zeros(1, device=engine.device)
    if params:
        bad += (~torch.isfinite(torch.stack(torch._foreach_norm([p.grad for p in params])).sum())).float()
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    opt.overflow = bool(bad.item())
    if opt.overflow:
        for p in params:
            p.grad = None  # the optimizer leaves parameters without gradients (and their state) untouched


def _nonfinite_check(engine, step: int, logs: dict, run_dir: Path, rank: int, count: int, budget: int) -> bool:
    """Collective. True when update `step` was non-finite on any rank and skipped; raises when it was
    applied anyway (nothing can undo it) or when the skips exceed train.max_nonfinite_steps."""
    keys = sorted(k for k in logs if k.startswith("loss"))
    flags = torch.tensor([0.0 if math.isfinite(logs[k]) else 1.0 for k in keys]
                         + [0.0 if engine.was_step_applied() else 1.0])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    bad_heads = [k for k, f in zip(keys, flags[:-1].tolist()) if f]
    skipped = bool(flags[-1])
    if not bad_heads and (not skipped or engine.fp16_enabled()):
        return False  # fp16 loss scaling skips overflowing updates while it calibrates: not a fault
    heads = ", ".join(h for h in bad_heads if h != "loss") or ("loss" if bad_heads else "none (the loss is "
                                                               "finite; the gradients are not)")
    last = ckpt_io.latest_tag(run_dir)
    if not skipped:
        raise FloatingPointError(f"non-finite loss at step {step + 1} (head(s): {heads}) and DeepSpeed applied "
                                 f"the update anyway (no gradient-norm check: zero_optimization.compute_grad_norm "
                                 f"is off?); the weights are garbage from here. Stopped. Last good checkpoint: "
                                 f"{last or 'none'}; resume from it with --resume.")
    count += 1
    where = (f"step {step + 1} (head(s): {heads}); {count} non-finite update(s) so far, budget "
             f"train.max_nonfinite_steps={budget}")
    if count > budget:
        raise FloatingPointError(f"non-finite loss or gradients at {where}: stopped instead of training on "
                                 f"garbage. Last good checkpoint: {last or 'none'}. Lower train.lr, enable "
                                 f"gradient_clipping in the DeepSpeed config or check the data, then --resume "
                                 f"(or raise train.max_nonfinite_steps).")
    if rank == 0:
        print(f"[mm-ds] skipped the update of {where}", flush=True)
    return True

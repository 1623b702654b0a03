"""The DeepSpeed engine config of a stage: read, completed from the run config, and validated before any rank
starts.

The JSON holds engine settings only (ZeRO, precision, optimizer type and hyper-parameters, clipping, monitors).
mm-ds writes the batch geometry and the schedule into it (`train.*` is their one source of truth), then runs
DeepSpeed's own parser on the result, so a typo inside a block, a value of the wrong type or an unsupported
combination is reported with the file and key before the launcher starts a rank, not by every rank after it.

Precision rules (DeepSpeed 0.19.8):
- bf16 accumulates gradients in fp32 (`data_types.grad_accum_dtype`, set when the JSON leaves it out): over the
  paper's 8-64 micro-steps bf16 accumulation loses most of the gradient's low bits. DeepSpeed does this with
  BF16_Optimizer (ZeRO 1) or the ZeRO 2/3 optimizers; with ZeRO 0 it raises NotImplementedError, so bf16 with
  ZeRO 0 is refused here (bf16_zero1.json holds the same memory on one rank).
- bf16 also reduces gradients across ranks in fp32 (`communication_data_type`, set when the JSON leaves it
  out): DeepSpeed's default, the training dtype, rounds every reduced gradient to bf16 before the fp32
  accumulation sees it. Which collectives carry what per ZeRO stage: mm_ds/tools/plan/plan.py.
- fp16 is for GPUs: DeepSpeed's CPU accelerator has none. bf16 runs on CPU too, slowly (tests use it at tiny size).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ...config import ConfigError, RunConfig
from ..checkpointing.rundir import logs_dir
from . import compiled
from .ds_parser import validate


@dataclass(frozen=True)
class Geometry:
    """Batch geometry, resolved before any engine exists so bad values fail early."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    world_size: int


# Keys whose values mm-ds writes from the run config: "auto" there (as in configs written for the Hugging Face
# Trainer) means "mm-ds fills it in". "auto" anywhere else is an error naming the key.
FILLED_IN = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "optimizer.params.lr", "scheduler.params.total_num_steps", "scheduler.params.warmup_max_lr",
             "scheduler.params.warmup_num_steps", "scheduler.params.warmup_min_lr")

# Monitors that write files (`monitor.*` turns them on): their output goes under RUN/logs unless the JSON says
# otherwise. W&B and Comet have no such fields (W&B's directory comes from WANDB_DIR, which the engine points
# at RUN/logs).
FILE_MONITORS = ("csv_monitor", "tensorboard")
MONITORS = ("csv_monitor", "tensorboard", "wandb", "comet")
"""DeepSpeed's monitor blocks. The engine itself gets none of them (`engine_config`): given one, it writes the LR
to it at every update, on rank 0, in the training thread. mm-ds writes its log rows to them instead, from a
thread of rank 0's (mm_ds/runtime/training/train_log.py `RowWriter`)."""

# Engine settings that make the host wait for the device. On CUDA each such wait drains the queue the host keeps
# ahead of the GPU, which then idles until the host queues work again. mm-ds measures throughput itself (wall time
# over a log window: logs/train.jsonl), so `resolve` turns DeepSpeed's throughput timer off (it is on, and
# synchronized, by default); the others are off by default, and `syncing` names them when a JSON turns one on.
# DeepSpeed 0.19.8 (runtime/training/engine.py forward/step, utils/timer.py, comm/comm.py).
SYNCING = (
    ("timers.throughput", lambda ds: _get(ds, "timers.throughput.enabled", True)
     and _get(ds, "timers.throughput.synchronized", True),
     "its throughput timer calls get_accelerator().synchronize() at every forward's start and every "
     "engine.step()'s end (set \"synchronized\": false, or leave the block out: mm-ds logs tokens_per_s itself)"),
    ("wall_clock_breakdown", lambda ds: _get(ds, "wall_clock_breakdown", False),
     "its timers read their CUDA events back (Event.synchronize) at every engine.step()"),
    ("flops_profiler.enabled", lambda ds: _get(ds, "flops_profiler.enabled", False),
     "it turns wall_clock_breakdown on, whose timers synchronize at every engine.step()"),
    ("comms_logger.enabled", lambda ds: _get(ds, "comms_logger.enabled", False),
     "it calls get_accelerator().synchronize() after every collective"),
)


def find(name: str) -> Path:
    """A path, or a name in the repository's / installed ds_configs/."""
    p = Path(name)
    if p.is_file():
        return p
    here = Path(__file__).resolve().parents[2]  # mm_ds/
    for root in (here.parent / "ds_configs", here / "ds_configs", Path(sys.prefix) / "share/mm-ds/ds_configs"):
        if (root / name).is_file():
            return root / name
    raise ConfigError(f"DeepSpeed config {name!r} not found (looked at the path and in ds_configs/); "
                      f"pass --ds-config PATH or a name such as {', '.join(shipped()[:3])}")


def shipped() -> list[str]:
    here = Path(__file__).resolve().parents[2]  # mm_ds/
    for root in (here.parent / "ds_configs", Path(sys.prefix) / "share/mm-ds/ds_configs"):
        if root.is_dir():
            return sorted(p.name for p in root.glob("*.json"))
    return []


def read(cfg: RunConfig) -> tuple[Path, dict]:
    path = find(cfg.ds_config)
    try:
        ds = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"DeepSpeed config {path} is not valid JSON: {e}") from e
    if not isinstance(ds, dict):
        raise ConfigError(f"DeepSpeed config {path} must hold a JSON object, got {type(ds).__name__}")
    _check_auto(ds, path)
    return path, ds


def _check_auto(ds: dict, path: Path, prefix: str = "") -> None:
    """Drop "auto" where mm-ds fills the value in; refuse it anywhere else, naming the key."""
    for key, value in list(ds.items()):
        name = prefix + key
        if isinstance(value, dict):
            _check_auto(value, path, name + ".")
        elif value == "auto":
            if name not in FILLED_IN:
                raise ConfigError(f"{path}: {name} is \"auto\", a value only the Hugging Face Trainer fills in; "
                                  f"give a number (mm-ds fills in only {', '.join(FILLED_IN)})")
            del ds[key]


def zero_stage(ds: dict) -> int:
    return int(ds.get("zero_optimization", {}).get("stage", 0))


def precision(ds: dict) -> str:
    return "bf16" if ds.get("bf16", {}).get("enabled") else "fp16" if ds.get("fp16", {}).get("enabled") else "fp32"


def reduction_dtype(ds: dict) -> str:
    """The dtype data-parallel gradients are reduced in: `communication_data_type`, else fp32 under bf16 (what
    `resolve` sets) and the training dtype otherwise (DeepSpeed's default)."""
    kind = precision(ds)
    return str(ds.get("communication_data_type") or ("fp32" if kind == "bf16" else kind)).lower()


def _int(value, key: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{path}: {key}={value!r} must be a positive integer")
    return value


def global_batch(cfg: RunConfig) -> int:
    """Sequences per update: the run config's, else the DeepSpeed JSON's (it does not depend on world size)."""
    path, ds = read(cfg)
    if cfg.train.global_batch:
        return cfg.train.global_batch
    if "train_batch_size" not in ds:
        raise ConfigError(f"batch geometry unset: give train.global_batch or train_batch_size in {path}")
    return _int(ds["train_batch_size"], "train_batch_size", path)


def split(global_batch: int, micro_batch: int, world_size: int) -> Geometry | None:
    """`global_batch` sequences per update over `world_size` ranks at most `micro_batch` per rank and forward pass;
    None when they cannot divide. A micro batch above a rank's share of the global batch runs that share in one
    micro-step: a micro batch is what one device holds at once, and the global batch is the algorithm's (the
    paper recipe's shallow stages run 64 per device on 8 GPUs and 32 on 64 GPUs)."""
    share, rest = divmod(global_batch, world_size)
    micro = min(micro_batch, share)
    if rest or not micro or share % micro:
        return None
    return Geometry(global_batch, micro, share // micro, world_size)


def micro_batch(cfg: RunConfig) -> int | None:
    """Sequences per device per forward pass, at most (`split`): the run config's, else the DeepSpeed JSON's (its
    "auto" is dropped by `read`); None when neither sets one. A value that is not a positive integer: ConfigError."""
    path, ds = read(cfg)
    value = cfg.train.micro_batch or ds.get("train_micro_batch_size_per_gpu")
    return None if value is None else _int(value, "train_micro_batch_size_per_gpu", path)


def geometry(cfg: RunConfig, world_size: int, path: Path | None = None, ds: dict | None = None) -> Geometry:
    """The batch geometry of `cfg` on `world_size` ranks (its engine JSON `ds` at `path`, read unless given);
    a ConfigError when it cannot divide. `mm-ds plan` asks it of a cluster's size."""
    if ds is None:
        path, ds = read(cfg)
    t = cfg.train
    gb = t.global_batch or ds.get("train_batch_size")
    micro = t.micro_batch or ds.get("train_micro_batch_size_per_gpu")
    if not gb or not micro:
        raise ConfigError(f"batch geometry unset: give train.global_batch and train.micro_batch, or "
                          f"train_batch_size and train_micro_batch_size_per_gpu in {path}")
    gb = _int(gb, "train_batch_size", path)
    micro = _int(micro, "train_micro_batch_size_per_gpu", path)
    geo = split(gb, micro, world_size)
    if geo is None:
        raise ConfigError(no_split(gb, micro, world_size))
    return geo


def no_split(global_batch: int, micro_batch: int, world_size: int) -> str:
    """Why `global_batch` cannot run on `world_size` ranks at most `micro_batch` each (`split`), and what can: the
    world sizes that keep it, and another micro batch only where one helps (the world size divides the batch)."""
    keep = [w for w in range(1, global_batch + 1) if split(global_batch, micro_batch, w)]
    sizes = ", ".join(map(str, keep[:16])) + (f", ... ({len(keep)} in all)" if len(keep) > 16 else "")
    share, rest = divmod(global_batch, world_size)
    if rest:
        why, micro = f"{world_size} ranks cannot share it evenly, whatever the micro batch", ""
    else:
        why = f"a rank's share, {share} sequences, is not a multiple of {micro_batch}"
        fit = max(d for d in range(1, micro_batch + 1) if share % d == 0)
        micro = f", or a train.micro_batch that divides {share}, e.g. {fit}"
    return (f"global batch {global_batch} is not divisible by micro batch {micro_batch} x world size {world_size} "
            f"({why}). World sizes that keep it: {sizes} (launch.nodes x launch.ranks){micro}. Changing "
            f"train.global_batch instead departs from the paper's protocol (the update's size is part of it)")


def resolve(cfg: RunConfig, world_size: int, run_dir: Path | None = None, on_this_machine: bool = True
            ) -> tuple[dict, Geometry]:
    """The effective engine config of `cfg` on `world_size` ranks, checked by DeepSpeed's parser.

    `on_this_machine`: the ranks will run on this machine's accelerator, so device rules apply (fp16 needs a
    GPU). `mm-ds run --check` on a login node without GPUs passes False."""
    path, ds = read(cfg)
    t = cfg.train
    geo = geometry(cfg, world_size, path, ds)
    ds.update(train_batch_size=geo.global_batch, train_micro_batch_size_per_gpu=geo.micro_batch,
              gradient_accumulation_steps=geo.grad_accum)
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
    if precision(ds) == "bf16":
        ds.setdefault("data_types", {}).setdefault("grad_accum_dtype", "fp32")
        ds.setdefault("communication_data_type", reduction_dtype(ds))
    if opt["params"].get("torch_adam") and not opt["params"].get("foreach"):
        # torch's fused AdamW: one pass over the flat ZeRO partition instead of ~10 full-size temporaries
        # (base shape on CPU: 0.2 s instead of 1.9 s per step on one core).
        opt["params"].setdefault("fused", True)
    if run_dir is not None:
        _monitors(ds, cfg)
        for k in FILE_MONITORS:
            if ds.get(k, {}).get("enabled"):
                ds[k].setdefault("output_path", str(logs_dir(run_dir)))
                ds[k].setdefault("job_name", cfg.stage)
    ds["steps_per_print"] = ds.get("steps_per_print", 10 ** 9)
    ds.setdefault("timers", {}).setdefault("throughput", {}).setdefault("enabled", False)  # SYNCING says why
    validate(ds, geo, path)
    _precision(ds, path, on_this_machine)
    compiled.check(t.compile, t.compile_backend, ds, zero_stage(ds), path)
    return ds, geo


def _monitors(ds: dict, cfg: RunConfig) -> None:
    """`monitor.*` of the run config as DeepSpeed's monitor blocks; keys the engine JSON sets win."""
    m = cfg.monitor
    wandb = {"project": m.wandb_project} | ({"group": m.wandb_group} if m.wandb_group else {})
    for block, on, fields in (("csv_monitor", m.csv, {}), ("tensorboard", m.tensorboard, {}),
                              ("wandb", m.wandb, wandb)):
        if on:
            ds[block] = {"enabled": True, **fields} | ds.get(block, {})


def _precision(ds: dict, path: Path, on_this_machine: bool) -> None:
    kind = precision(ds)
    if kind == "bf16":
        if zero_stage(ds) == 0 and ds["data_types"]["grad_accum_dtype"] == "fp32":
            raise ConfigError(f"{path}: bf16 with zero_optimization.stage 0: DeepSpeed 0.19.8 accumulates gradients "
                              f"in fp32 only with ZeRO 1-3 (BF16_Optimizer, ZeRO optimizers) and raises "
                              f"NotImplementedError for ZeRO 0; use bf16_zero1.json (on one rank it holds the "
                              f"same memory as ZeRO 0), or fp32")
    if not on_this_machine:
        return
    import torch
    if kind == "fp16" and not torch.cuda.is_available():
        raise ConfigError(f"{path} enables fp16, which needs a GPU (DeepSpeed's CPU accelerator has no fp16); "
                          f"on CPU use bf16_zero1.json (slow here) or fp32_zero*.json")


def _get(ds: dict, dotted: str, default):
    for key in dotted.split("."):
        if not isinstance(ds, dict) or key not in ds:
            return default
        ds = ds[key]
    return ds


def syncing(ds: dict) -> list[str]:
    """What in the engine config `ds` makes the host wait for the device every micro-step (`SYNCING`)."""
    return [f"{key}: {why}" for key, on, why in SYNCING if on(ds)]


def engine_config(ds: dict) -> dict:
    """What `deepspeed.initialize` gets of the effective config `ds`: all of it but the monitor blocks
    (`MONITORS` says why)."""
    return {k: copy.deepcopy(v) for k, v in ds.items() if k not in MONITORS}


def warn_if_slow(ds: dict) -> None:
    """bf16 runs on DeepSpeed's CPU accelerator, but its matmuls are far slower than fp32 there; and settings that
    make a GPU wait for the host every micro-step (`syncing`)."""
    import torch
    if precision(ds) == "bf16" and not torch.cuda.is_available():
        print("[mm-ds] note: bf16 on CPU is slow (bf16 matmuls run ~400x slower than fp32 on a 2-core x86 CPU); "
              "use fp32_zero*.json for CPU runs beyond tiny sizes", flush=True)
    for what in syncing(ds):
        print(f"[mm-ds] warning: the DeepSpeed config syncs the device every micro-step: {what}; on a GPU it "
              f"idles while the host catches up", flush=True)

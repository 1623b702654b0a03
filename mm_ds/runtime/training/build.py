"""A stage's DeepSpeed engine, built and let go: what the one training loop (engine.py) and `mm-ds bench` step.

A stage hands over a `Stage`: the model after surgery, which parameters train, a deterministic batch function and its
FLOPs per update. `build_engine` turns it into a DeepSpeed engine: the DeepSpeed config resolved (or taken as the
launching side resolved it), the frozen parameters frozen *before* `deepspeed.initialize` so ZeRO keeps no optimizer
state for them, the resume point found, the forward compiled with train.compile. `release` lets it go again, as
`mm-ds run`'s one job needs between stages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ...config import RunConfig, dump_yaml
from ...model.model import param_groups, set_trainable
from ..checkpointing import checkpoint as ckpt_io
from ..checkpointing import resharding as universal
from ..checkpointing import rundir
from ..distributed import dist
from . import compiled
from . import ds_config as dsc
from .ds_config import Geometry
from .phases import DepthSchedule
from .resolved import Resolved


@dataclass
class Stage:
    cfg: RunConfig
    """`cfg.train.steps` = 0: a stage of no updates (MINIJOINT's extraction): final/ is the model as built."""
    model: torch.nn.Module
    trainable: Callable[[str], bool]
    batches: Callable[[int, int, int, Geometry], dict]
    """(step, micro_step, rank, geometry) -> keyword arguments of model.forward (tensors on CPU)."""
    flops_per_step: Callable[..., float]
    """(global batch, depth=None) -> analytic FLOPs of one update (mm_ds.model.flops); `depth` with a `schedule`."""
    tokens_per_sample: int
    parent: str | None = None
    parent_flops: float = 0.0
    meta: dict = field(default_factory=dict)
    schedule: DepthSchedule | None = None
    """Multi-depth Step 2: the depth of each update (its batches carry it); its state is checkpointed."""

    def flops_until(self, step: int, global_batch: int) -> float:
        """Analytic FLOPs of updates [0, step): per phase at its depth when there is a schedule."""
        if self.schedule is None:
            return self.flops_per_step(global_batch) * step
        return self.schedule.flops_until(step, lambda d: self.flops_per_step(global_batch, d))


@dataclass
class Engine:
    """A `Stage` made ready to step: the DeepSpeed engine and what the loop reads beside it."""
    engine: object
    ds_cfg: dict
    geo: Geometry
    n_train: int
    n_total: int
    found: Path | None = None
    """--resume: the newest complete checkpoint of the run directory (None: start from step 0)."""
    load_from: Path | None = None
    """What to load for `found`: it, or its universal conversion when the world size changed."""
    compiled: compiled.Compiled | None = None
    """train.compile: the engine's module with its forward compiled (None: eager)."""


def build_engine(stage: Stage, world: int, run_dir: Path | None = None, resume: bool = False,
                 reshard: bool = False, given: Resolved | None = None) -> Engine:
    """The DeepSpeed engine of `stage` on `world` ranks: the effective DeepSpeed config, the stage's frozen
    parameters frozen before `deepspeed.initialize` (which then sees only the trainable parameter groups),
    and with `run_dir` the run's files (the frozen fp32 weights) and, with `resume`, the checkpoint to load.
    `given`: the stage run as its launching side resolved it (mm_ds/runtime/training/resolved.py), whose engine config
    and resume point it takes; without it (mm-ds bench, tests) they are resolved here and the configs written into
    `run_dir`. Collective when `run_dir` is given. `train` and `mm-ds bench` build theirs here."""
    import deepspeed

    cfg, model = stage.cfg, stage.model
    rank = dist.rank()
    ds_cfg, geo = (given.ds_cfg, given.geo) if given is not None else dsc.resolve(cfg, world, run_dir)
    if geo.world_size != world:
        raise ValueError(f"{run_dir} was resolved for {geo.world_size} ranks, but {world} started; resolve it again")
    n_train, n_total = set_trainable(model, stage.trainable)
    if run_dir is not None:
        dist.on_rank0(lambda: _write_run_files(run_dir, cfg, ds_cfg, model, configs=given is None),
                      f"writing the run files of {run_dir}")
        if ds_cfg.get("wandb", {}).get("enabled"):
            os.environ.setdefault("WANDB_DIR", str(rundir.logs_dir(run_dir)))  # W&B's block has no output path
            rundir.logs_dir(run_dir).mkdir(parents=True, exist_ok=True)

    use_tf32(cfg.train.tf32 and dsc.precision(ds_cfg) == "fp32")
    compiling = compiled.dynamo_switch(cfg.train.compile)  # compiling nothing: TORCHDYNAMO_DISABLE=1, a faster start
    if cfg.train.compile and not compiling and rank == 0:
        print(f"[mm-ds] train.compile=true, but {compiled.DISABLE}=1 is set in the environment: training eager",
              flush=True)
    wd = ds_cfg["optimizer"].get("params", {}).get("weight_decay", 0.0)
    if dsc.zero_stage(ds_cfg) == 3 and hasattr(model, "heads"):
        for head in model.heads().values():  # the tied projection lives in another module
            deepspeed.zero.register_external_parameter(head, model.embed.tokens.weight)
    found = None
    if given is not None:  # the launching side found it (and verified its sums)
        found = given.resume_from
    elif resume and run_dir is not None:  # rank 0 looks for all: what it finds decides the collectives that load it
        found = dist.on_rank0(lambda: ckpt_io.find_resume_point(run_dir), f"looking for a checkpoint in {run_dir}")
    load_from = None
    if found is not None:
        load_from = universal.prepare(found, world, ds_cfg, rank, force=reshard)  # another world size: reshard
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model, wd),
                                           config=dsc.engine_config(ds_cfg))  # no monitors: RowWriter has them
    made = None
    if compiling:  # after initialize: the module DeepSpeed holds, its hooks left eager (mm_ds/runtime/training/compiled.py)
        made = compiled.compile_forward(engine.module, cfg.train.compile_backend, compiled_graphs(stage))
    return Engine(engine, ds_cfg, geo, n_train, n_total, found, load_from, made)


def compiled_graphs(stage: Stage) -> int:
    """The most graphs `stage`'s compiled forward may need: without and with an attention mask, per depth."""
    return 2 * (len(stage.schedule.depths) if stage.schedule is not None else 1)


def _write_run_files(run_dir: Path, cfg: RunConfig, ds_cfg: dict, model: torch.nn.Module, configs: bool) -> None:
    """Rank 0: the frozen fp32 weights and, with `configs` (no launching side wrote them), the effective configs,
    into `run_dir`."""
    with ckpt_io.writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        if configs:
            ckpt_io.write_text_atomic(run_dir / ckpt_io.RUN_CONFIG, dump_yaml(cfg))
            ckpt_io.write_json_atomic(run_dir / ckpt_io.DS_CONFIG, ds_cfg)
    # Under bf16/fp16 DeepSpeed casts every parameter, frozen ones too, to the training dtype, and keeps fp32
    # masters only of what trains. The frozen fp32 weights (the parent's, after surgery) are kept once per run
    # and laid over every consolidation, so that final/ holds them bit for bit.
    ckpt_io.write_frozen(run_dir, {n: p.detach().float().clone() for n, p in model.named_parameters()
                                   if not p.requires_grad})
    dsc.warn_if_slow(ds_cfg)


def use_tf32(on: bool) -> None:
    """TF32 matmuls (and cuDNN convolutions) on CUDA for fp32 training (train.tf32); torch's default is full
    fp32 ("ieee"). torch 2.13's per-backend API (allow_tf32 is its legacy, not to be mixed with it)."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.fp32_precision = torch.backends.cudnn.fp32_precision = "tf32" if on else "ieee"


def release(engine) -> None:
    """Let the stage's engine, optimizer and model go (`mm-ds run`'s one job trains every stage in one process).
    `engine.destroy()` removes the optimizer's hooks (ZeRO 3: the parameter hooks of every module). Left, in
    DeepSpeed 0.19.8, each holding the model and through its hooks the engine for the life of the process: the
    engine's own forward hooks, and under ZeRO 3 a module list it never empties (parameter_offload's
    FWD_MODULE_STACK) and a class-wide cache keyed by the parameter coordinator (only a cache: a live engine fills
    it again)."""
    from deepspeed.runtime.zero import parameter_offload
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coordinator

    engine.destroy()
    compiled.release(engine.module)
    for hook in (engine.module_forward_pre_hook, engine.module_forward_post_hook):
        if hook is not None:
            hook.remove()
    parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK if m is not engine.module]
    cached = Coordinator.__dict__.get("_PartitionedParameterCoordinator__params_to_release")  # nvtx(lru_cache(f))
    for cell in getattr(cached, "__closure__", None) or ():
        if hasattr(cell.cell_contents, "cache_clear"):
            cell.cell_contents.cache_clear()

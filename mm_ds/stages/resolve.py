"""A stage run, and its one resolution before any rank starts.

A `StageRun` is what a stage command says (its stage, preset, overrides and run directory) and gives its effective
config; `mm-ds run`, the recipe check and `mm-ds extend` build them directly and never parse a command line.

`resolve` is the one place a stage run is checked and completed: the stage's preflight (its data and parent, which
leaves the config as `build` makes it), the engine config through DeepSpeed's parser at the launch's world size,
the run directory, the resume point and the checkpoint it loads; then it writes RUN/run_config.yaml, ds_config.json
and resolved.json (mm_ds/runtime/training/resolved.py), which every rank starts from. It runs where the launch starts
(the `mm-ds STAGE` process, `mm-ds run`), or on rank 0 of ranks that are already running (a launcher started the stage
command on every rank; `mm-ds run`'s one job). `--check` runs it without what needs the machine or the data: nothing
is written, no port bound, and a parent or corpus that is not there yet skips the checks that read it.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

from .. import config
from ..config import ConfigError, RunConfig, to_dict
from ..runtime.checkpointing import checkpoint as ckpt_io
from ..runtime.distributed import launch
from ..runtime.training import ds_config, resolved
from ..runtime.training.resolved import Resolved

STAGES = {
    "pretrain": ("mm_ds.stages.pretrain", "Step 1: pretrain an MLM (BL_BASE, BL_SMALL, MINIJOINT)"),
    "build-mini": ("mm_ds.stages.build_mini", "Step 1b: extract (MINIJOINT) or build (MINIPOST) the mini-model"),
    "adapt": ("mm_ds.stages.adapt", "Step 2: learn target-language embeddings over a frozen body"),
    "finetune": ("mm_ds.stages.finetune", "Step 3: finetune the primary model on an English task"),
}
"""command -> (module with build() and preflight(), help)"""


@dataclass(frozen=True)
class StageRun:
    """One run of a training stage: `mm-ds STAGE [--preset PRESET] --out OUT OVERRIDES...`."""
    stage: str
    """The config's stage: pretrain, build_mini, adapt or finetune."""
    out: Path
    """Its run directory."""
    preset: str | None = None
    overrides: tuple[str, ...] = ()
    """`key=value` config overrides, applied in order after the preset."""
    name: str = ""
    """Where `mm-ds run` shows and logs it: `stage/run dir under OUT` (adapt/minipost/de)."""
    packed: bool = False
    """A single-device run, packed with others onto the launch's devices (`stage_runs.PACKED`), not data-parallel."""
    config_file: str | None = field(default=None, repr=False)
    """`--config FILE`: applied after the preset, before the overrides."""

    @property
    def command(self) -> str:
        return self.stage.replace("_", "-")

    @property
    def argv(self) -> list[str]:
        """The stage command of this run, `mm-ds ARGV`: what `mm-ds run` shows, and what a packed run's process runs."""
        return [self.command, *(["--preset", self.preset] if self.preset is not None else []),
                *(["--config", self.config_file] if self.config_file else []), "--out", str(self.out),
                *self.overrides]

    def config(self) -> RunConfig:
        """The effective RunConfig: defaults, then the preset, then the config file, then the overrides."""
        cfg = config.load(self.preset, self.config_file, list(self.overrides))
        if cfg.stage != self.stage:
            raise ConfigError(f"the config is for stage {cfg.stage!r}, not {self.command!r}; use "
                              f"`mm-ds {cfg.stage}` or a {self.command} preset")
        return cfg


def stage_module(stage: str):
    return importlib.import_module(STAGES[stage.replace("_", "-")][0])


@dataclass
class Checked:
    """What `resolve(check=True)` found: the effective configs, and the checks it skipped."""
    cfg: RunConfig
    ds_cfg: dict | None
    geo: ds_config.Geometry | None
    skipped: list[str]


def resolve(run: StageRun, resume: bool = False, *, launching: bool = True, check: bool = False,
            progress: bool = False, reshard: bool = False, resume_with: str = "", world: int | None = None
            ) -> Resolved | Checked:
    """Every check of `run` that can fail on bad input, before any engine exists, then its record in RUN
    (`check`: the findings instead, nothing written). `launching`: the launch starts from this process (its settings
    are checked here: hostfile, executables, address, and the port unless `check`); else the ranks run already,
    `world` of them, and this is their rank 0."""
    cfg = run.config()
    launch.resolve(cfg.launch)  # the hostfile's node count, before the world size is read
    world = cfg.launch.world_size if world is None else world
    check_run_dir(run.out, resume=resume)  # first: a run that cannot write its directory reads no data
    skipped = _preflight(stage_module(run.stage), cfg, check)
    ds_cfg, geo = ds_config.resolve(cfg, world, run.out) if cfg.train.steps else (None, None)
    found = ckpt_io.find_resume_point(run.out, checksums=not check) if resume else None  # its sums checked here, once
    if found is not None:
        check_resumable(found, cfg)
    notes = launch.preflight(cfg.launch, port=not check) if launching else []
    if cfg.launch.launcher == "none" and cfg.launch.ranks != 1:
        raise ConfigError("launch.launcher=none runs a single process; set launch.ranks=1")
    if check:
        if cfg.launch.launcher not in ("none", "srun"):
            notes.append(f"whether launch.master_port={cfg.launch.master_port} is free (when the ranks start)")
        return Checked(cfg, ds_cfg, geo, skipped + notes)
    parent = ckpt_io.weights_dir(cfg.parent) if cfg.parent else None
    inputs = tuple(c for c in (parent, found) if c is not None and (Path(c) / ckpt_io.MANIFEST).is_file())
    done = Resolved(run.out.resolve(), cfg, ds_cfg, geo, world, resume, found, reshard, progress,
                    resume_with or "the same command with --resume", inputs)
    resolved.write(done)
    return done


def _preflight(stage_mod, cfg: RunConfig, check: bool) -> list[str]:
    """The stage's own checks (`preflight`: its parent and data; it leaves `cfg` as `build` makes it). `check`: a
    parent or corpus that does not exist yet skips them, which the returned list says."""
    missing = [f"{key}={path}" for key, path in (("parent", cfg.parent), ("data.corpus", cfg.data.corpus))
               if path and not Path(path).exists()] if check else []
    if missing:
        checks = " ".join(inspect.getdoc(stage_mod.preflight).split())
        return [f"({' and '.join(missing)} not there yet) {checks}"]
    stage_mod.preflight(cfg)
    return []


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """A new run never overwrites another's checkpoints or final weights, and its directory can be written."""
    problem = ckpt_io.unwritable(run_dir)
    if problem:
        raise ConfigError(problem)
    if resume or not run_dir.exists():
        return
    if ckpt_io.list_checkpoints(run_dir) or (run_dir / ckpt_io.FINAL).exists():
        raise ConfigError(f"{run_dir} already holds checkpoints of a run; pass --resume to continue it, or "
                          f"choose a new --out (nothing was overwritten)")


def check_resumable(found: Path, cfg: RunConfig) -> None:
    """The checkpoint --resume would load was written by this stage, system and architecture."""
    meta = ckpt_io.read_meta(found)
    mine = to_dict(cfg.model)
    if meta.get("model") != mine:
        diff = {k: (meta.get("model", {}).get(k), v) for k, v in mine.items() if meta.get("model", {}).get(k) != v}
        raise ConfigError(f"--resume: {found} was trained with a different architecture "
                          f"(checkpoint vs. now: {diff}); resume with the same model config or use a new --out")
    for key in ("stage", "system"):
        if meta.get(key) != getattr(cfg, key):
            raise ConfigError(f"--resume: {found} is {key}={meta.get(key)!r}, this run is {getattr(cfg, key)!r}")

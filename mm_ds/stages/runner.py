"""One stage run, as `mm-ds <stage>` runs it: parse, validate, preflight, launch the ranks, train.

A `StageRun` is what a stage command says (its stage, preset, overrides and run directory) and gives its effective
config; `mm-ds run`, the recipe check and `mm-ds extend` build them directly and never parse a command line. The
command line (`StageRun.argv`) is what a launcher hands to the ranks, and what they validate against
(`command_fingerprint`). The CLI (mm_ds/cli.py) only dispatches here; nothing imports the CLI.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError
from ..runtime import checkpoint as ckpt_io

# command -> (module with build() and preflight(), help)
STAGES = {
    "pretrain": ("mm_ds.stages.pretrain", "Step 1: pretrain an MLM (BL_BASE, BL_SMALL, MINIJOINT)"),
    "build-mini": ("mm_ds.stages.build_mini", "Step 1b: extract (MINIJOINT) or build (MINIPOST) the mini-model"),
    "adapt": ("mm_ds.stages.adapt", "Step 2: learn target-language embeddings over a frozen body"),
    "finetune": ("mm_ds.stages.finetune", "Step 3: finetune the primary model on an English task"),
}


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
        """The mm-ds arguments of this run: `python -m mm_ds.cli ARGV` (or mm_ds/rank.py ARGV) runs it."""
        return [self.command, *(["--preset", self.preset] if self.preset is not None else []),
                *(["--config", self.config_file] if self.config_file else []), "--out", str(self.out),
                *self.overrides]

    def config(self):
        """The effective RunConfig: defaults, then the preset, then the config file, then the overrides."""
        from .. import config

        cfg = config.load(self.preset, self.config_file, list(self.overrides))
        if cfg.stage != self.stage:
            raise ConfigError(f"the config is for stage {cfg.stage!r}, not {self.command!r}; use "
                              f"`mm-ds {cfg.stage}` or a {self.command} preset")
        return cfg


def stage_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"mm-ds {name}", description=STAGES[name][1])
    p.add_argument("--preset", help="packaged preset, e.g. tiny/minijoint (see `mm-ds presets`)")
    p.add_argument("--config", help="your own YAML/JSON config file (applied after the preset)")
    p.add_argument("--ds-config", help="DeepSpeed engine JSON: a path or a name in ds_configs/ (fp32_zero{0,1,2,3} "
                   "for CPU; bf16_zero{1,2,3} for GPUs, slow on CPU; fp16_zero1 for GPUs only)")
    p.add_argument("--out", required=True, help="run directory (checkpoints, logs, final weights)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out")
    p.add_argument("--ranks", type=int, help="local ranks to start when not under a launcher (launch.ranks)")
    p.add_argument("--launcher", choices=["deepspeed", "mpirun", "srun", "none"], help="launch.launcher")
    p.add_argument("--reshard", action="store_true", help="with --resume: convert the checkpoint to DeepSpeed's "
                   "universal format first (automatic when the world size changed)")
    p.add_argument("--check", "--dry-run", dest="check", action="store_true",
                   help="validate and print the effective configs; train nothing (--dry-run: the same)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.lr=3e-4")
    return p


def parse(name: str, argv: list[str]) -> tuple[argparse.Namespace, StageRun]:
    """(the command's flags, its StageRun) of `mm-ds NAME ARGV`."""
    args = stage_parser(name).parse_intermixed_args(argv)  # key=value may follow flags
    overrides = list(args.overrides)
    if args.ds_config:
        overrides.append(f"ds_config={args.ds_config}")
    if args.ranks:
        overrides.append(f"launch.ranks={args.ranks}")
    if args.launcher:
        overrides.append(f"launch.launcher={args.launcher}")
    return args, StageRun(name.replace("-", "_"), Path(args.out), args.preset, tuple(overrides),
                          config_file=args.config)


def stage_config(name: str, argv: list[str]):
    """(parsed arguments, effective RunConfig) of `mm-ds NAME ARGV`."""
    args, run = parse(name, argv)
    return args, run.config()


def stage_module(stage: str):
    return importlib.import_module(STAGES[stage.replace("_", "-")][0])


VALIDATED = "MM_DS_VALIDATED"
"""Set by the mm-ds launcher side for the ranks it starts: the fingerprint of the command it validated. A
launcher may hand it to some ranks only (mpirun: those on its own node), so rank 0's tells every rank."""


def command_fingerprint(name: str, argv: list[str]) -> str:
    """Of `mm-ds NAME ARGV` run from this directory: ranks skip `validate` only for exactly that command."""
    return hashlib.sha256(json.dumps([os.getcwd(), name, *argv]).encode()).hexdigest()[:16]


def validated_env(argv: list[str]) -> dict[str, str]:
    """The environment that tells the ranks of `mm-ds ARGV` that it was validated (`preflight`)."""
    return {VALIDATED: command_fingerprint(argv[0], argv[1:])}


LOOK = object()
"""`validate`'s `found` default: find the resume point here (the ranks of a launch pass rank 0's)."""


def validate(stage_mod, cfg, out: Path, resume: bool, world: int, skipped: list[str] | None = None, found=LOOK):
    """Every check of a stage run that can fail on bad input, before any engine exists: the stage's data and
    parent (`preflight`, which leaves `cfg` as `build` makes it), the engine config through DeepSpeed's
    parser on `world` ranks, the run directory (first), and the checkpoint a resume would load. Run once per
    process: by the launcher side, and by ranks that no mm-ds launcher validated for. Returns the engine
    config and geometry (None for a stage of zero updates: it has no engine).

    `skipped` (`--check`): a parent or corpus that does not exist yet skips the preflight checks that read
    it, described in this list, so that a Step-2 config can be checked before Step 1 ends."""
    from ..runtime import ds_config

    check_run_dir(out, resume=resume)  # first: a run that cannot write its directory reads no data
    missing = [f"{key}={path}" for key, path in (("parent", cfg.parent), ("data.corpus", cfg.data.corpus))
               if path and not Path(path).exists()] if skipped is not None else []
    if missing:
        checks = " ".join(inspect.getdoc(stage_mod.preflight).split())
        skipped.append(f"({' and '.join(missing)} not there yet) {checks}")
    else:
        stage_mod.preflight(cfg)
    resolved = ds_config.resolve(cfg, world, out) if cfg.train.steps else (None, None)
    found = ckpt_io.find_resume_point(out) if resume and found is LOOK else found
    if resume and found is not None:
        check_resumable(found, cfg)
    return resolved


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


def check_resumable(found: Path, cfg) -> None:
    """The checkpoint --resume would load was written by this stage, system and architecture."""
    from ..config import to_dict

    meta = ckpt_io.read_meta(found)
    mine = to_dict(cfg.model)
    if meta.get("model") != mine:
        diff = {k: (meta.get("model", {}).get(k), v) for k, v in mine.items() if meta.get("model", {}).get(k) != v}
        raise ConfigError(f"--resume: {found} was trained with a different architecture "
                          f"(checkpoint vs. now: {diff}); resume with the same model config or use a new --out")
    for key in ("stage", "system"):
        if meta.get(key) != getattr(cfg, key):
            raise ConfigError(f"--resume: {found} is {key}={meta.get(key)!r}, this run is {getattr(cfg, key)!r}")


def preflight(run: StageRun, resume: bool = False, check: bool = False):
    """What `mm-ds STAGE ...` does before any rank starts: `validate`, the launcher's settings, then `--check`'s
    printout or a stage of zero updates, run here (MINIJOINT's extraction). Returns (cfg, done): done means
    nothing is left to launch."""
    from .. import config
    from ..runtime import engine, launch, sums

    cfg = run.config()
    launch.resolve(cfg.launch)  # the hostfile's node count, before the world size is read
    stage_mod = stage_module(run.stage)
    skipped = [] if check else None
    # Ranks to start: their rank 0 hashes what they load (stages/common.py verify_inputs); here sizes suffice.
    with sums.deferred(cfg.launch.launcher != "none" and not check):
        ds_cfg, geo = validate(stage_mod, cfg, run.out, resume, cfg.launch.world_size, skipped)
    unchecked = launch.preflight(cfg.launch, port=not check)
    if check:
        print(config.dump_yaml(cfg))
        print(f"# launch: {launch.describe(cfg.launch)}")
        if ds_cfg is not None:
            print(json.dumps(ds_cfg, indent=2))
            print(f"# geometry: {geo.micro_batch} x {geo.grad_accum} x {geo.world_size} = {geo.global_batch} (micro "
                  f"batch x accumulation steps x world size = global batch)")
        if cfg.launch.launcher not in ("none", "srun"):
            skipped.append(f"whether launch.master_port={cfg.launch.master_port} is free (when the ranks start)")
        print("\n".join(f"# --check skipped: {s}" for s in skipped + unchecked))
        return cfg, True
    if not cfg.train.steps:  # no engine, no ranks: the stage's model as built is its result
        engine.train(stage_mod.build(cfg), run.out, resume=resume, progress=False)
        return cfg, True
    if cfg.launch.launcher == "none" and cfg.launch.ranks != 1:
        raise ConfigError("launch.launcher=none runs a single process; set launch.ranks=1")
    return cfg, False


def validated_here(name: str, argv: list[str]) -> bool:
    """This process's environment says the mm-ds process that started it validated `mm-ds NAME ARGV`. Only one
    process's answer counts: under a launcher rank 0's, broadcast (another rank may not have the variable)."""
    return os.environ.get(VALIDATED) == command_fingerprint(name, argv)


def run_stage(name: str, argv: list[str]) -> int:
    """`mm-ds NAME ARGV`: outside a launcher, validate and start the ranks (or run a stage of zero updates
    here); inside one, this rank's part of the run."""
    from ..runtime import dist, engine, launch

    args, run = parse(name, argv)
    if not launch.under_launcher():
        cfg = run.config()
        if not (cfg.launch.launcher == "none" and validated_here(name, argv)):  # else `mm-ds run` checked it
            cfg, done = preflight(run, args.resume, args.check)
            if done:
                return 0
            if cfg.launch.launcher != "none":
                return launch.relaunch(cfg.launch, [name, *argv], validated_env([name, *argv]), cfg.train.stop_grace_s)
    else:
        cfg = run.config()
        rank, _, world = dist.init(cfg.launch)  # its timeouts: the config every rank parses
        from .common import verify_inputs  # rank 0 hashes the parent and the resume point, once
        found = verify_inputs(cfg.parent, run.out if args.resume else None)
        if not dist.broadcast_object(validated_here(name, argv) if rank == 0 else None):
            # a rank started by hand, or by `mm-ds run`'s one job: every rank checks what it sees (and all stop
            # when one fails), then rank 0 may write
            stage_mod = stage_module(run.stage)
            dist.on_every_rank(lambda: validate(stage_mod, cfg, run.out, args.resume, world, found=found),
                               f"checking the stage run {run.out}")
    # A file one node cannot read fails there: every rank stops with that rank's reason, none waits for it.
    stage = dist.on_every_rank(lambda: stage_module(run.stage).build(cfg), f"building the stage {run.out}")
    engine.train(stage, run.out, resume=args.resume, progress=not args.no_progress, reshard=args.reshard)
    return 0

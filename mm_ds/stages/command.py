"""`mm-ds <stage>`: parse the command, resolve the stage run once (mm_ds/stages/resolve.py: its checks, then
RUN/resolved.json), and start `mm_ds/rank.py RUN` on launch.ranks ranks, each of which trains it
(mm_ds/stages/runner.py); `--check` prints what the resolver found instead.

Under a launcher the user started (`deepspeed --module mm_ds.cli pretrain ...`, launchers/*.sh) every rank runs the
command: rank 0 resolves, then every rank trains from RUN as a launched rank does. The CLI (mm_ds/cli.py) only
dispatches here; nothing imports the CLI.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import config
from ..runtime.distributed import dist, launch, stop
from ..runtime.training import engine, resolved
from .resolve import STAGES, Checked, StageRun, resolve, stage_module
from .runner import train_run


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


def run_stage(name: str, argv: list[str]) -> int:
    """`mm-ds NAME ARGV`: outside a launcher, resolve the run and start its ranks (or run it here: launcher none, or
    a stage of zero updates); inside one, rank 0 resolves and every rank trains."""
    args, run = parse(name, argv)
    how = dict(progress=not args.no_progress, reshard=args.reshard, resume_with=stop.resume_command([name, *argv]))
    if launch.under_launcher():
        dist.init(run.config().launch)  # its timeouts: the config every rank parses
        dist.on_rank0(lambda: resolve(run, args.resume, launching=False, world=dist.world_size(), **how),
                      f"resolving the stage run {run.out}")
        return train_run(run.out)
    got = resolve(run, args.resume, check=args.check, **how)
    if isinstance(got, Checked):
        show_check(got)
        return 0
    if published_as_built(got):
        return 0
    if got.cfg.launch.launcher == "none":
        return train_run(run.out, got)
    return launch.relaunch(got.cfg.launch, [str(got.run_dir)], grace_s=got.cfg.train.stop_grace_s)


def published_as_built(got: resolved.Resolved) -> bool:
    """A stage of zero updates (MINIJOINT's extraction) needs no engine and no ranks: its model as built is its
    result, published here, where it was resolved. False for any other stage: its ranks train it."""
    if got.cfg.train.steps:
        return False
    engine.train(stage_module(got.cfg.stage).build(got.cfg), got.run_dir, given=got)
    return True


def show_check(got: Checked) -> None:
    """`--check`'s printout: the effective configs, the launch, the batch geometry, what was not checked."""
    cfg, geo = got.cfg, got.geo
    print(config.dump_yaml(cfg))
    print(f"# launch: {launch.describe(cfg.launch)}")
    if got.ds_cfg is not None:
        print(json.dumps(got.ds_cfg, indent=2))
        print(f"# geometry: {geo.micro_batch} x {geo.grad_accum} x {geo.world_size} = {geo.global_batch} (micro "
              f"batch x accumulation steps x world size = global batch)")
    print("\n".join(f"# --check skipped: {s}" for s in got.skipped))



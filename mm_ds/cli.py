"""`mm-ds <command>`: dispatch from one table. Training stages share one argument set and one runner.

    mm-ds prepare  --lang en --input 'corpus/en/*.txt.xz' --out data/en
    mm-ds pretrain --preset tiny/minijoint --out runs/tiny-mj [key=value ...] [--resume] [--dry-run]
    deepspeed --num_gpus 8 --module mm_ds.cli pretrain --preset paper/minijoint --ds-config bf16_zero1.json --out runs/mj
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import os
import sys
from pathlib import Path

from .runtime import checkpoint as ckpt_io
from .runtime.checkpoint import CheckpointError
from .config import ConfigError, did_you_mean
from .runtime.dist import OtherRankFailed

# command -> (module with build()/preflight(), or module:function taking argv), help
STAGE_COMMANDS = {
    "pretrain": ("mm_ds.stages.pretrain", "Step 1: pretrain an MLM (BL_BASE, BL_SMALL, MINIJOINT)"),
    "build-mini": ("mm_ds.stages.build_mini", "Step 1b: extract (MINIJOINT) or build (MINIPOST) the mini-model"),
    "adapt": ("mm_ds.stages.adapt", "Step 2: learn target-language embeddings over a frozen body"),
    "finetune": ("mm_ds.stages.finetune", "Step 3: finetune the primary model on an English task"),
}
TOOL_COMMANDS = {
    "prepare": ("mm_ds.cli:prepare_main", "train SentencePiece and encode a corpus into token shards"),
    "run": ("mm_ds.pipeline.run:main", "a whole experiment from a recipe ({recipes}; or your YAML file), one "
            "results table"),
    "transfer": ("mm_ds.eval.transfer:main", "Step 4: zero-shot transfer by swapping target embeddings in"),
    "extend": ("mm_ds.pipeline.extend:main", "an English HF model (or mm-ds run) + target text -> a Hugging Face "
               "model for the new language: import, Step 1b, prepare, Step 2, export, with resume and --check"),
    "world": ("mm_ds.data.world:main", "generate the synthetic multilingual world (the embedded default data)"),
    "score": ("mm_ds.eval.score:main", "score a predictions file as the official evaluation scripts would"),
    "flops": ("mm_ds.tools.costs:main", "analytic training FLOPs and V100-days of a recipe's stages"),
    "plan": ("mm_ds.tools.plan:main", "time, GPU-hours, communication and disk of a recipe's stages on a GPU cluster"),
    "report": ("mm_ds.report.report:main", "tables, curves and speedups from evaluated checkpoints"),
    "align": ("mm_ds.eval.align:main", "alignment check: held-out target MLM of each Step-2 mini-model and of its "
              "primary model with those embeddings (no task data)"),
    "import": ("mm_ds.interop:import_main", "an HF/XLM-R, fairseq or DeepSpeed checkpoint as an mm-ds Step-1 run"),
    "export": ("mm_ds.interop:export_main", "a checkpoint of any stage as a Hugging Face model directory"),
    "config": ("mm_ds.tools.discover:config_main", "every config key of a stage: type, default (or a preset's "
               "value) and documentation"),
    "presets": ("mm_ds.tools.discover:presets_main", "list the packaged presets, recipes and engine configs; "
                "--show NAME prints one"),
    "verify": ("mm_ds.tools.verify:main", "check checkpoints or final weights against their manifests"),
    "bench": ("mm_ds.tools.bench:main", "time every stage kind vs. a matmul peak and transformers; CPU speed targets"),
}

# Started by `mm-ds run` for its ranks, not by users: they work but `mm-ds --help` does not list them.
INTERNAL_COMMANDS = {
    "run-job": ("mm_ds.pipeline.run:job_main", "the ranks of `mm-ds run`'s one job: every stage in order"),
    "run-eval": ("mm_ds.eval.transfer:run_eval_main", "the ranks of `mm-ds run`'s evaluation"),
    "run-pack": ("mm_ds.pipeline.pack:main", "the ranks of `mm-ds run`'s Step 3: single-device runs, several at once"),
    "run-align": ("mm_ds.eval.align_spread:run_align_main", "the ranks of `mm-ds run`'s alignment check"),
}


def stage_parser(name: str, help_text: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"mm-ds {name}", description=help_text)
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
    p.add_argument("--dry-run", action="store_true", help="validate and print the effective configs; train nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.lr=3e-4")
    return p


def stage_config(name: str, argv: list[str]):
    """(parsed arguments, effective RunConfig) of `mm-ds NAME ARGV`; `mm-ds run --check` reads its plan so."""
    from . import config

    args = stage_parser(name, STAGE_COMMANDS[name][1]).parse_intermixed_args(argv)  # key=value may follow flags
    overrides = list(args.overrides)
    if args.ds_config:
        overrides.append(f"ds_config={args.ds_config}")
    if args.ranks:
        overrides.append(f"launch.ranks={args.ranks}")
    if args.launcher:
        overrides.append(f"launch.launcher={args.launcher}")
    cfg = config.load(args.preset, args.config, overrides)
    if cfg.stage != name.replace("-", "_"):
        raise ConfigError(f"the config is for stage {cfg.stage!r}, not {name!r}; use `mm-ds {cfg.stage}` "
                          f"or a {name} preset")
    return args, cfg


VALIDATED = "MM_DS_VALIDATED"
"""Set by the mm-ds launcher side for the ranks it starts: the fingerprint of the command it validated. A
launcher may hand it to some ranks only (mpirun: those on its own node), so rank 0's tells every rank."""


def fingerprint(name: str, argv: list[str]) -> str:
    """Of `mm-ds NAME ARGV` run from this directory: ranks skip `validate` only for exactly that command."""
    return hashlib.sha256(json.dumps([os.getcwd(), name, *argv]).encode()).hexdigest()[:16]


def validated_env(argv: list[str]) -> dict[str, str]:
    """The environment that tells the ranks of `mm-ds ARGV` that it was validated (`preflight_stage`)."""
    return {VALIDATED: fingerprint(argv[0], argv[1:])}


LOOK = object()
"""`validate`'s `found` default: find the resume point here (the ranks of a launch pass rank 0's)."""


def validate(stage_mod, cfg, out: Path, resume: bool, world: int, skipped: list[str] | None = None, found=LOOK):
    """Every check of a stage run that can fail on bad input, before any engine exists: the stage's data and
    parent (`preflight`, which leaves `cfg` as `build` makes it), the engine config through DeepSpeed's
    parser on `world` ranks, the run directory (first), and the checkpoint a resume would load. Run once per
    process: by the launcher side, and by ranks that no mm-ds launcher validated for. Returns the engine
    config and geometry (None for a stage of zero updates: it has no engine).

    `skipped` (`--dry-run`): a parent or corpus that does not exist yet skips the preflight checks that read
    it, described in this list, so that a Step-2 config can be checked before Step 1 ends."""
    from .runtime import ds_config

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
    from .config import to_dict

    meta = ckpt_io.read_meta(found)
    mine = to_dict(cfg.model)
    if meta.get("model") != mine:
        diff = {k: (meta.get("model", {}).get(k), v) for k, v in mine.items() if meta.get("model", {}).get(k) != v}
        raise ConfigError(f"--resume: {found} was trained with a different architecture "
                          f"(checkpoint vs. now: {diff}); resume with the same model config or use a new --out")
    for key in ("stage", "system"):
        if meta.get(key) != getattr(cfg, key):
            raise ConfigError(f"--resume: {found} is {key}={meta.get(key)!r}, this run is {getattr(cfg, key)!r}")


def preflight_stage(name: str, argv: list[str]):
    """What `mm-ds NAME ARGV` does before any rank starts: `validate`, the launcher's settings, then
    `--dry-run`'s printout or a stage of zero updates, run here (MINIJOINT's extraction). Returns (args, cfg,
    done): done means nothing is left to launch."""
    from . import config
    from .runtime import engine, launch, sums

    args, cfg = stage_config(name, argv)
    stage_mod = importlib.import_module(STAGE_COMMANDS[name][0])
    out = Path(args.out)
    skipped = [] if args.dry_run else None
    # Ranks to start: their rank 0 hashes what they load (stages/common.py verify_inputs); here sizes suffice.
    with sums.deferred(cfg.launch.launcher != "none" and not args.dry_run):
        ds_cfg, geo = validate(stage_mod, cfg, out, args.resume, cfg.launch.world_size, skipped)
    launch.preflight(cfg.launch, port=not args.dry_run)
    if args.dry_run:
        print(config.dump_yaml(cfg))
        if ds_cfg is not None:
            print(json.dumps(ds_cfg, indent=2))
            print(f"# geometry: {geo}")
        if cfg.launch.launcher not in ("none", "srun"):
            skipped.append(f"whether launch.master_port={cfg.launch.master_port} is free (when the ranks start)")
        print("\n".join(f"# --dry-run skipped: {s}" for s in skipped))
        return args, cfg, True
    if not cfg.train.steps:  # no engine, no ranks: the stage's model as built is its result
        engine.train(stage_mod.build(cfg), out, resume=args.resume, progress=False)
        return args, cfg, True
    if cfg.launch.launcher == "none" and cfg.launch.ranks != 1:
        raise ConfigError("launch.launcher=none runs a single process; set launch.ranks=1")
    return args, cfg, False


def validated_here(name: str, argv: list[str]) -> bool:
    """This process's environment says the mm-ds process that started it validated `mm-ds NAME ARGV`. Only one
    process's answer counts: under a launcher rank 0's, broadcast (another rank may not have the variable)."""
    return os.environ.get(VALIDATED) == fingerprint(name, argv)


def run_stage(name: str, argv: list[str]) -> int:
    from .runtime import dist, engine, launch

    if not launch.under_launcher():
        args, cfg = stage_config(name, argv)
        if not (cfg.launch.launcher == "none" and validated_here(name, argv)):  # else `mm-ds run` checked it
            args, cfg, done = preflight_stage(name, argv)
            if done:
                return 0
            if cfg.launch.launcher != "none":
                return launch.relaunch(cfg.launch, [name, *argv], validated_env([name, *argv]))
    else:
        args, cfg = stage_config(name, argv)
        rank, _, world = dist.init()
        from .stages.common import verify_inputs  # rank 0 hashes the parent and the resume point, once
        found = verify_inputs(cfg.parent, Path(args.out) if args.resume else None)
        if not dist.broadcast_object(validated_here(name, argv) if rank == 0 else None):
            # a rank started by hand, or by `mm-ds run`'s one job: every rank checks what it sees (and all stop
            # when one fails), then rank 0 may write
            stage_mod = importlib.import_module(STAGE_COMMANDS[name][0])
            dist.on_every_rank(lambda: validate(stage_mod, cfg, Path(args.out), args.resume, world, found=found),
                               f"checking the stage run {args.out}")
    stage = importlib.import_module(STAGE_COMMANDS[name][0]).build(cfg)
    engine.train(stage, Path(args.out), resume=args.resume, progress=not args.no_progress, reshard=args.reshard)
    return 0


def prepare_main(argv: list[str]) -> int:
    from .data.corpus import prepare

    p = argparse.ArgumentParser(prog="mm-ds prepare", description=TOOL_COMMANDS["prepare"][1])
    p.add_argument("--lang", required=True, help="language code of the text, e.g. en or de (recorded in meta.json)")
    p.add_argument("--input", required=True, action="append",
                   help="text files/globs (.txt, .gz, .xz; CC-100 layout) or hf:NAME[:CONFIG][:SPLIT][:COLUMN]; repeatable")
    p.add_argument("--out", required=True, help="directory to write: SentencePiece model, token shards, meta.json "
                   "(a stage's data.corpus)")
    p.add_argument("--vocab-size", type=int, default=50000, help="SentencePiece pieces, specials included "
                   "(fewer, with a warning, when the text cannot support that many) (default: %(default)s)")
    p.add_argument("--character-coverage", type=float, default=0.9998,
                   help="share of characters SentencePiece covers; the rest map to <unk> (default: %(default)s)")
    p.add_argument("--sample-sentences", type=int, default=2_000_000,
                   help="sentences sampled for SentencePiece training (bounded, so CC-100-sized inputs work) "
                        "(default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="encoding processes (default: all cores)")
    p.add_argument("--spm-model", help="reuse this SentencePiece model instead of training one (its size wins "
                   "over --vocab-size)")
    p.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"],
                   help="SentencePiece algorithm: unigram (XLM-R) or bpe (small lexicons) (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sentence sample (default: %(default)s)")
    p.add_argument("--heldout", type=float, default=0.0, metavar="FRACTION",
                   help="hold this fraction of the lines out of training (chosen by a hash of each line's text) "
                        "into heldout.txt, for the alignment check (default: %(default)s, none)")
    a = p.parse_args(argv)
    meta = prepare(a.lang, a.input, a.out, vocab_size=a.vocab_size, character_coverage=a.character_coverage,
                   sample_sentences=a.sample_sentences, workers=a.workers, seed=a.seed, spm_model=a.spm_model,
                   model_type=a.model_type, heldout=a.heldout)
    print(json.dumps(meta, indent=2, default=str))
    return 0


def _usage() -> str:
    from .config import recipe_names  # the packaged ones, as they ship

    lines = ["usage: mm-ds <command> [options]    (mm-ds <command> --help: its options; mm-ds --version)", "",
             "commands:"]
    for name, (_, h) in {**STAGE_COMMANDS, **TOOL_COMMANDS}.items():
        lines.append(f"  {name:<12}{h.format(recipes=', '.join(recipe_names()))}")
    return "\n".join(lines)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("mm-ds")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def _finish(rc: int) -> int:
    dist = sys.modules.get("mm_ds.runtime.dist")  # only a command that started ranks has anything to tear down
    return dist.finish(rc) if dist is not None else rc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The deepspeed launcher appends --local_rank=N; the rank is also in the environment.
    argv = [a for a in argv if not a.startswith("--local_rank")]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"mm-ds {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    tools = TOOL_COMMANDS | INTERNAL_COMMANDS
    try:
        if name in STAGE_COMMANDS:
            return _finish(run_stage(name, rest))
        if name in tools:
            module_name, func = tools[name][0].split(":")
            return _finish(int(getattr(importlib.import_module(module_name), func)(rest) or 0))
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError, FloatingPointError, OtherRankFailed) as e:
        # The rank that failed says why; of the ranks it stopped (OtherRankFailed), one per node says so.
        if not isinstance(e, OtherRankFailed) or os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"mm-ds {name}: error: {e}", file=sys.stderr)
        return 2
    hint = did_you_mean(name, [*STAGE_COMMANDS, *TOOL_COMMANDS])
    print(f"mm-ds: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

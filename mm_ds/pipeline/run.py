"""`mm-ds run RECIPE`: a whole experiment, stage by stage, with one results table at the end.

A recipe (packaged `recipes/NAME.yaml` or a file) names the systems, target languages, tasks, seeds, the
data, and a preset per stage (mm_ds/recipe.py). It makes a list of stage runs; each is launched as its own `mm-ds
<stage>` process (which starts its ranks under the recipe's launcher), skipped when its `final/`
verifies, and resumed from its newest complete checkpoint when it was interrupted. MINIPOST shares
BL_BASE's pretrained model and its finetuned models (same primary model, paper §2.2).

    OUT/world/                      generated data (tiny recipe)
    OUT/data/{lang}/                prepared corpora
    OUT/pretrain/{bl_base,bl_small,minijoint}/
    OUT/build_mini/{minijoint,minipost}/
    OUT/adapt/{system}/{lang}/
    OUT/finetune/{primary}/{task}/seed{n}/
    OUT/results.jsonl, OUT/results.md
    OUT/align/, OUT/align.jsonl     the alignment check of every system's Step 2 (mm_ds/eval/align.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..runtime import checkpoint, stop
from ..config import ConfigError, from_dict
from .pack import complete
from .progress import Follow, StageFailed, Watched, say
from .progress import run_logged as _run_logged
from ..config import recipe_names
from ..recipe import Recipe, load_recipe, minis_in_english, task_root
from .prepare import languages, only_prepare, prepare_data, prepared
from .prepare import world_complete  # noqa: F401 (run.world_complete, as it was)
from .spread import run_spread, spread_steps
from .stage_runs import stage_runs
from ..stages.runner import StageRun
from ..systems import REFERENCE


def _launch_stage(run: StageRun, resume: bool, log: Path, follow: Follow | None = None) -> None:
    """One stage as `mm-ds STAGE ARGV` would run it, with its checks done here (one process fewer per stage:
    start-up, not training, dominates small stages) and its ranks started by the launcher, output to `log`."""
    import contextlib

    from ..runtime.launch import command, launch_env
    from ..stages.runner import preflight, validated_env

    argv = run.argv + ["--no-progress"] + (["--resume"] if resume else [])
    say(f"$ mm-ds {' '.join(argv)}")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        try:
            cfg, done = preflight(run, resume)
        except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, ValueError) as e:
            raise ConfigError(f"stage {run.name}: {e}") from e
    if not done:
        _run_logged(command(cfg.launch, argv) if cfg.launch.launcher != "none"
                    else [sys.executable, "-m", "mm_ds.cli", *argv], log, follow,
                    launch_env(cfg.launch) | validated_env(argv), cfg.train.stop_grace_s)


def run_stages(todo: list[StageRun], logs: Path) -> None:
    """Each stage run in order, one launch each, its output in `logs`, progress shown meanwhile; an
    interrupted one resumes from its newest checkpoint. The caller has left out the complete ones."""
    for i, n in enumerate(todo):
        resume = bool(checkpoint.list_checkpoints(n.out))
        if resume:
            found = checkpoint.find_resume_point(n.out, checksums=False)  # its rank 0 hashes it
            say(f"resume {n.name} from {found.name if found else 'step 0 (no checkpoint verifies)'}")
        log = logs / f"{n.name.replace('/', '_')}.log"
        try:
            _launch_stage(n, resume, log, Follow([_watched(n, i, len(todo), log)]))
        except stop.Stopped as e:  # its ranks saved: say where, for the line that ends `mm-ds run`
            saved = checkpoint.latest_tag(n.out) or "no checkpoint"
            raise stop.Stopped(e.signame, f"stopped by {e.signame or 'a stop signal'}: {n.name} saved at {saved}; "
                                          f"its log: {log}") from None


def _watched(run: StageRun, i: int, n: int, log: Path) -> Watched:
    return Watched(run.name.partition("/")[2], run.out, log, i, n)  # its run directory under OUT: adapt/minipost/t1


def _state(run_dir: Path) -> tuple[bool, bool]:
    """(complete, has checkpoints) of a stage's run directory."""
    try:
        return complete(run_dir), bool(checkpoint.list_checkpoints(run_dir))
    except OSError as e:
        raise checkpoint.CheckpointError(f"cannot read {run_dir} ({type(e).__name__}: {e}); make the run tree "
                                         f"readable on rank 0's node, then re-run the same command") from e


def job_main(argv: list[str]) -> int:
    """Inside `mm-ds run`'s one job (every rank): run each listed stage that is not complete, in order."""
    import gc

    from ..runtime import dist
    from ..stages.runner import run_stage

    dist.init()
    # The stage list decides every collective that follows: rank 0 reads it for all (no node's own look).
    for stage_argv in dist.on_rank0(lambda: json.loads(Path(argv[0]).read_text()), f"reading {argv[0]}"):
        if dist.any_rank(stop.requested() is not None):  # a stop while the last one published: start no other
            name = stop.requested().name if stop.requested() else None
            raise stop.Stopped(name, f"[mm-ds] stopped by {name or 'a stop signal on another rank'} between two "
                                     f"steps; resume with: {stop.resume_command()}")
        if stage_argv[0] == "run-eval":
            from ..eval.transfer import run_eval_main
            run_eval_main(stage_argv[1:])
            continue
        if stage_argv[0] == "run-pack":  # Step 3: every rank takes single-device runs until none is left
            from .pack import run_pack
            run_pack(Path(stage_argv[1]))
            continue
        if stage_argv[0] == "run-align":  # the alignment check, after Step 4, the same way
            from ..eval.align_spread import run_align_main
            run_align_main(stage_argv[1:])
            continue
        run_dir = Path(stage_argv[stage_argv.index("--out") + 1])
        # Rank 0 decides for all: a rank that looked for itself could see a stage that rank 0 has just
        # finished alone (an extraction) as complete, skip its barrier, and deadlock the job.
        done, has_checkpoints = dist.on_rank0(lambda: _state(run_dir), f"looking at {run_dir}")
        if done:
            continue
        resume = ["--resume"] if has_checkpoints else []
        print(f"[mm-ds run] stage: mm-ds {' '.join(stage_argv + resume)}", flush=True)
        run_stage(stage_argv[0], stage_argv[1:] + resume)
        gc.collect()
    return 0


def evaluate(recipe: Recipe, out: Path, job_ran_it: bool = False) -> list[dict]:
    """Step 4 for the whole recipe: the units without a current result run on the recipe's launcher (every
    rank takes its share, on its device), or in this process when it has one rank; then every row."""
    import torch

    from ..config import LaunchConfig
    from ..runtime.launch import command, launch_env
    from ..eval.transfer import cached, collect, eval_units, run_units, scored_with, write_eval_spec

    units, root, results = eval_units(recipe, out), str(task_root(recipe, out)), out / "eval"
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the ranks' kind of device: this machine's
    todo = [u for u in units if cached(results, u, root, scored_with(device)) is None]
    if todo and not job_ran_it:
        cfg = from_dict(LaunchConfig, recipe.launch)
        say(f"evaluation: {len(todo)} of {len(units)} units to run on {cfg.world_size} rank(s); its log: "
            f"{out / 'logs' / 'eval.log'}")
        if cfg.world_size == 1 or cfg.launcher == "none":
            run_units(units, root, results, device=device, say=lambda m: say(m.removeprefix("[mm-ds] ")))
        else:
            spec = write_eval_spec(recipe, out)
            _run_logged(command(cfg, ["run-eval", str(spec)]), out / "logs" / "eval.log", Follow([], spec),
                        launch_env(cfg))
    return collect(units, root, results)


def spread_alignment(recipe: Recipe, out: Path, job_ran_it: bool) -> None:
    """The alignment check's scoring on the recipe's launch, every rank taking Step-2 runs (mm_ds/eval/align_spread.py),
    before `align_recipe` writes its report here; a one-job run's ranks did it, and one rank leaves it to here."""
    from ..eval.align_spread import write_spec
    from ..config import LaunchConfig
    from ..runtime.launch import command, launch_env

    cfg = from_dict(LaunchConfig, recipe.launch)
    if job_ran_it or cfg.world_size == 1 or cfg.launcher == "none" or (spec := write_spec(recipe, out)) is None:
        return
    say(f"alignment check: {len(json.loads(spec.read_text())['jobs'])} language(s) on {cfg.world_size} rank(s); "
        f"its log: {out / 'logs' / 'align.log'}")
    _run_logged(command(cfg, ["run-align", str(spec)]), out / "logs" / "align.log", None, launch_env(cfg))


def results_table(recipe: Recipe, rows: list[dict], out: Path):
    """Table 2 per task, captioned, into OUT/results.md, and the report it comes from: the same renderer
    (mm_ds/report/table2.py) writes report/tables.md's Table 2."""
    from ..report import report
    from ..report.records import clean_records, control_scores, recorded, source_scores
    from ..report.table2 import format_table2s

    results, warnings = clean_records(rows, str(out / "results.jsonl"))
    rep = report.build_report(results, warnings=warnings, controls=control_scores(rows), sources=source_scores(rows),
                              seeds=recorded(rows, "seeds"), world=recipe.world is not None,
                              headline_tasks=recipe.headline())
    text = format_table2s(rep)
    (out / "results.md").write_text(text + "\n")
    return text, rep


STEP_NAMES = {"pretrain": "Step 1 (pretrain)", "build_mini": "Step 1b (build-mini)", "adapt": "Step 2 (adapt)",
              "finetune": "Step 3 (finetune)"}


def stage_runs_summary(recipe: Recipe, runs: list[StageRun], done: dict[str, bool], out: Path) -> str:
    """`mm-ds run --list-stage-runs`'s head: the stage runs per step, how they run, and what is already done; Step 4
    and the alignment check."""
    from ..config import LaunchConfig
    from ..eval.align import aligned_runs

    launch = from_dict(LaunchConfig, recipe.launch)
    world, spread = launch.world_size, launch.spread
    side = spread_steps(runs, spread) if recipe.mode == "per_stage" else {}
    lines = [f"# {len(runs)} stage runs into {out}, {sum(done.values())} done (final/ verifies):"]
    for stage, title in STEP_NAMES.items():
        mine = [n for n in runs if n.name.startswith(stage + "/")]
        if mine:
            how = (f"single-device runs, {min(world, len(mine))} at once" if mine[0].packed
                   else f"side by side on {spread} groups of {world // spread} rank(s)" if stage in side
                   else f"each data-parallel on {world} rank(s), one after another")
            lines.append(f"#   {title:<21} {len(mine):>4} runs, {sum(done[n.name] for n in mine):>4} done; {how}")
    results = len(list((out / "eval").glob("*.json"))) if (out / "eval").is_dir() else 0
    lines.append(f"#   Step 4 (evaluation)   units over every Step-2 checkpoint, task and language (`mm-ds plan` "
                 f"counts them): {results} results in {out / 'eval'}")
    if pairs := aligned_runs(recipe):  # the recipe's rule: its data may not be prepared yet
        rows = sum(len(list((out / "align" / s / lang).glob("*.json"))) for s, lang in pairs)
        lines.append(f"#   alignment check       {len(pairs):>4} Step-2 runs in {len({p[1] for p in pairs})} "
                     f"language(s), each checkpoint and step 0: {rows} scored in {out / 'align'}")
    return "\n".join(lines + ["# the stage commands, in order:"])


def _one_job(recipe: Recipe, out: Path, todo: list[StageRun], packed: list[StageRun]) -> None:
    """One launch for every stage: the ranks walk the data-parallel stage runs in-process (a new engine per
    stage), take Step 3's single-device runs from a queue, then share the evaluation (its units are listed by
    rank 0 once Step 2 has written its checkpoints)."""
    from ..config import LaunchConfig
    from ..runtime.launch import command, launch_env
    from .pack import Watch, step3_failed, step3_spec
    job_file = out / "logs" / "job.json"
    job_file.parent.mkdir(parents=True, exist_ok=True)
    (out / "logs" / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1))
    entries = [n.argv + ["--no-progress"] for n in todo]
    spec = step3_spec(packed, recipe, out) if packed else None
    entries += [["run-pack", str(spec)]] if spec else []
    entries.append(["run-eval", str(out / "logs" / "eval.json"), str(out / "logs" / "recipe.json"), str(out)])
    from ..eval.align_spread import write_spec as align_spec
    entries += [["run-align", str(a)]] if (a := align_spec(recipe, out)) else []  # after Step 4, on every rank
    job_file.write_text(json.dumps(entries, indent=1))
    cfg = from_dict(LaunchConfig, recipe.launch)
    say(f"{len(todo)} stage runs, {len(packed)} single-device Step-3 runs and the evaluation in one job of "
        f"{cfg.world_size} ranks; its log: {out / 'logs' / 'job.log'}")
    try:
        _run_logged(command(cfg, ["run-job", str(job_file)]) if cfg.launcher != "none"
                    else [sys.executable, "-m", "mm_ds.cli", "run-job", str(job_file)], out / "logs" / "job.log",
                    Follow([_watched(n, i, len(todo), out / "logs" / "job.log") for i, n in enumerate(todo)],
                           out / "logs" / "eval.json", others=[Watch(spec, "Step 3")] if spec else []),
                    launch_env(cfg))
    except StageFailed as e:
        raise step3_failed(spec, e) if spec else e from None


def _write_results(recipe: Recipe, out: Path, rows: list[dict]) -> None:
    """results.jsonl, results.md and Table 5, the report, and the alignment check's MLM-level tables."""
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    rep = None
    if recipe.tasks:
        table, rep = results_table(recipe, rows, out)
        print(table)
    if minis_in_english(recipe):  # Table 5: the mini-models' own English scores beside the primary models'
        from ..report.analyses import english_table
        english = english_table(recipe, rows)
        (out / "english.md").write_text(english + "\n")
        print("\nEnglish performance of the primary models and their mini-models (Table 5):\n" + english)
    if REFERENCE in recipe.systems and recipe.tasks:  # near-maximal performance is defined against BL_BASE (§4.2)
        from ..report import report
        written = report.write_report(rep, out / "report")
        print("\n" + report.format_tables(rep, table2s=False))  # Table 2 is results.md, printed above
        say("report: " + ", ".join(str(p) for p in written if p.suffix in (".md", ".png")))
    from ..report.report import MLM_DIR
    if recipe.align_sequences:  # the alignment check and the MLM level: no task data needed
        import torch

        from ..eval.align import align_recipe
        written = align_recipe(recipe, out, "cuda" if torch.cuda.is_available() else "cpu",
                               say=lambda m: say(m.removeprefix("[mm-ds] ")))
        if (out / "report" / MLM_DIR / "tables.md").is_file():
            print("\nAt the MLM level (held-out target MLM accuracy of the primary model with the Step-2 "
                  "embeddings):\n\n" + (out / "report" / MLM_DIR / "tables.md").read_text())
        say("alignment check and MLM level: " + ", ".join(str(p) for p in written if p.suffix in (".md", ".png")))


def run(recipe: Recipe, out: Path, list_only: bool = False) -> int:
    runs = stage_runs(recipe, out)
    if list_only:
        done = {n.name: complete(n.out) for n in runs}
        print(stage_runs_summary(recipe, runs, done, out))
        for n in runs:
            print(f"{'done' if done[n.name] else 'todo'}  mm-ds {' '.join(n.argv)}")
        from .check import protocol
        try:
            configs = {n.out.resolve(): n.config() for n in runs}
        except ConfigError:  # `--check` names the stage; the plan is still listed
            return 0
        print("\n".join(f"# {line}" for note in protocol(recipe, runs, configs) for line in note.splitlines()),
              file=sys.stderr)  # stdout stays one stage command a line, for scripts
        return 0
    from .check import check
    report = check(recipe, out, strict=True)
    if report.problems:  # before any data work: nothing is written
        raise ConfigError(f"the recipe cannot run:\n{report.format()}\n(`mm-ds run RECIPE --check --out DIR` "
                          f"finds the same without running, but takes data that is absent altogether for data still "
                          f"to come: a note there)")
    t0 = time.time()
    os.environ.setdefault("MM_DS_LAUNCH_ROOT", str(os.getpid()))  # stage ranks exit if this process dies
    out.mkdir(parents=True, exist_ok=True)
    if recipe.world is None and (left := [lang for lang in languages(recipe) if not prepared(out, lang)]):
        say(f"preparing {' '.join(left)} here before any stage; on a cluster `mm-ds run RECIPE --only prepare` does "
            f"it apart, as a CPU job before the GPU allocation")
    prepare_data(recipe, out)
    todo = [n for n in runs if not complete(n.out)]
    for n in runs:
        if n not in todo:
            print(f"[mm-ds run] skip {n.name.partition('/')[2]}: complete", flush=True)  # its run dir under OUT
    packed, todo = [n for n in todo if n.packed], [n for n in todo if not n.packed]
    job_ran_eval = recipe.mode == "one_job" and bool(todo or packed)
    if job_ran_eval:
        _one_job(recipe, out, todo, packed)
        todo, packed = [], []
    if recipe.launch.get("spread", 1) > 1:  # side by side on groups of nodes (its --check passed above)
        run_spread(todo, recipe, out, lambda runs: run_stages(runs, out / "logs"))
    else:
        run_stages(todo, out / "logs")
    from .pack import run_step3
    run_step3(packed, recipe, out)
    rows = evaluate(recipe, out, job_ran_it=job_ran_eval)
    spread_alignment(recipe, out, job_ran_it=job_ran_eval)
    _write_results(recipe, out, rows)
    from ..report.report import MLM_DIR
    say(f"{len(runs)} stage runs, {time.time() - t0:.0f} s; "
        + (f"results: {out / 'results.md'} (rows: {out / 'results.jsonl'})" if recipe.tasks
           else f"MLM-level results: {out / 'report' / MLM_DIR / 'tables.md'} (rows: {out / 'align.jsonl'})"))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds run", description="run a whole experiment from a recipe")
    p.add_argument("recipe", help=f"packaged recipe ({', '.join(recipe_names())}; `mm-ds presets` describes them) "
                   f"or a YAML file, whose relative paths start at its folder")
    p.add_argument("--out", required=True)
    p.add_argument("--list-stage-runs", "--plan", dest="list_stage_runs", action="store_true",
                   help="print the stage runs per step, their commands and state; run nothing (--plan: its old "
                        "name; the cluster plan is `mm-ds plan`)")
    p.add_argument("--check", "--dry-run", dest="check", action="store_true", help="validate every stage run "
                   "(configs, engine configs, batch geometry, launcher, task coverage, files that are here); run "
                   "nothing (--dry-run: the same)")
    p.add_argument("--launch", action="append", default=[], metavar="KEY=VALUE",
                   help="launch.* setting for every training stage, over the recipe's (repeatable), e.g. "
                        "--launch launcher=mpirun --launch hostfile=hosts --launch nodes=2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a recipe key (repeatable), e.g. --set seeds=[1] --set task_root=/data/tasks")
    p.add_argument("--only", choices=["prepare"], help="prepare: only every language's data (`mm-ds prepare` into "
                   "OUT/data), on this machine's CPUs: a CPU job before the GPU allocation; then `mm-ds run` starts "
                   "with the GPU stages. With --check: what it would prepare, and whether the text inputs are there")
    p.add_argument("--lang", action="append", metavar="LANG", help="with --only prepare: only this language of the "
                   "recipe (repeatable), e.g. one CPU job per language")
    a = p.parse_args(argv)
    if a.lang and not a.only:
        p.error("--lang goes with --only prepare")
    sets = list(a.set)
    for item in a.launch:
        if "=" not in item:
            raise ConfigError(f"--launch {item!r} must look like KEY=VALUE, e.g. --launch ranks=8")
        sets.append("launch." + item.removeprefix("launch."))
    recipe = load_recipe(a.recipe, sets)
    if a.only == "prepare":
        try:
            return only_prepare(recipe, a.recipe, Path(a.out), a.lang, a.check)
        except StageFailed as e:
            print(f"mm-ds run: error: {e}", file=sys.stderr)
            return 1
    if a.check:
        from .check import check
        report = check(recipe, Path(a.out), strict=False)
        print(f"mm-ds run {a.recipe} --check: {report.format()}")
        return 1 if report.problems else 0
    try:
        with stop.forwarding(raise_when_idle=True):  # a stop signal: its launcher saves, then this ends
            return run(recipe, Path(a.out), a.list_stage_runs)
    except StageFailed as e:  # the stage's own traceback is in its log; ours would bury the message
        print(f"mm-ds run: error: {e}", file=sys.stderr)
        return 1
    except stop.Stopped as e:
        say(f"{e}; resume with: {shlex.join(['mm-ds', 'run', *argv])}")
        return stop.EXIT_CODE

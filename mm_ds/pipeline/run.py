"""`mm-ds run RECIPE`: a whole experiment, stage by stage, with one results table at the end.

A recipe (packaged `recipes/NAME.yaml` or a file) names the systems, target languages, tasks, seeds, the
data, and a preset per stage (mm_ds/pipeline/recipe.py). It makes a list of stage runs and work items (Step 3's pack, the
evaluation, the alignment check: mm_ds/pipeline/items.py). A stage run is skipped when its `final/` verifies, else
resolved here (mm_ds/stages/resolve.py) and its ranks started on its run directory under the recipe's launcher,
resuming from its newest complete checkpoint when it was interrupted; `launch_items` decides whether the items run
each in a launch of its own or all in one (mode: one_job; mm_ds/pipeline/jobs.py). MINIPOST shares BL_BASE's
pretrained model and its finetuned models (same primary model, paper §2.2).

    OUT/world/                      generated data (tiny recipe)
    OUT/data/{lang}/                prepared corpora
    OUT/pretrain/{bl_base,bl_small,minijoint}/
    OUT/build_mini/{minijoint,minipost}/
    OUT/adapt/{system}/{lang}/
    OUT/finetune/{primary}/{task}/seed{n}/
    OUT/results.jsonl, OUT/results.md
    OUT/align/, OUT/align.jsonl     the alignment check of every system's Step 2 (pipeline/alignment.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from ..config import ConfigError, LaunchConfig, from_dict, recipe_names
from ..eval.align_spread import Alignment
from ..eval.transfer import scored_with
from ..report import report
from ..report.analyses import english_table
from ..report.records import clean_records, control_scores, recorded, source_scores
from ..report.report import MLM_DIR
from ..report.table2 import format_table2s
from ..runtime.checkpointing import checkpoint
from ..runtime.checkpointing.rundir import logs_dir
from ..runtime.distributed import stop
from ..runtime.distributed.launch import launch_env, preflight, rank_command
from ..stages.command import published_as_built
from ..stages.resolve import StageRun, resolve
from ..systems import REFERENCE
from . import jobs
from .alignment import align_recipe, aligned_runs
from .check import check, protocol
from .evaluation import Evaluation, cached, collect, default_device, expand, run_evaluation
from .items import work_items
from .jobs import Training
from .pack import STEP3, Pack, Watch, complete, step3_failed
from .prepare import languages, only_prepare, prepare_data, prepared
from .prepare import world_complete  # noqa: F401 (run.world_complete, as it was)
from .progress import Follow, StageFailed, Watched, say
from .progress import run_logged as _run_logged
from .recipe import Recipe, english_tasks, load_recipe, minis_in_english, primaries
from .spread import run_spread, spread_steps
from .stage_runs import stage_runs


def _launch_stage(run: StageRun, resume: bool, log: Path, follow: Follow | None = None) -> None:
    """One stage as `mm-ds STAGE ARGV` would run it: resolved here (one process fewer per stage: start-up, not
    training, dominates small stages), its ranks started by the launcher on its run directory, output to `log`."""
    argv = run.argv + ["--no-progress"] + (["--resume"] if resume else [])
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        try:
            got = resolve(run, resume, resume_with=stop.resume_command(argv))  # a resume point's sums checked here
        except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, ValueError) as e:
            raise ConfigError(f"stage {run.name}: {e}") from e
    if resume:
        found = got.resume_from
        say(f"resume {run.name} from {found.name if found else 'step 0 (no checkpoint verifies)'}")
    say(f"$ mm-ds {' '.join(argv)}")
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        if published_as_built(got):
            return
    _run_logged(rank_command(got.cfg.launch, got.run_dir), log, follow, launch_env(got.cfg.launch),
                got.cfg.train.stop_grace_s)


def run_stages(todo: list[StageRun], logs: Path) -> None:
    """Each stage run in order, one launch each, its output in `logs`, progress shown meanwhile; an
    interrupted one resumes from its newest checkpoint. The caller has left out the complete ones."""
    for i, n in enumerate(todo):
        resume = bool(checkpoint.list_checkpoints(n.out))
        log = logs / f"{n.name.replace('/', '_')}.log"
        try:
            _launch_stage(n, resume, log, Follow([_watched(n, i, len(todo), log)]))
        except stop.Stopped as e:  # its ranks saved: say where, for the line that ends `mm-ds run`
            saved = checkpoint.latest_tag(n.out) or "no checkpoint"
            raise stop.Stopped(e.signame, f"stopped by {e.signame or 'a stop signal'}: {n.name} saved at {saved}; "
                                          f"its log: {log}") from None


def _watched(run: StageRun, i: int, n: int, log: Path) -> Watched:
    return Watched(run.name.partition("/")[2], run.out, log, i, n)  # its run directory under OUT: adapt/minipost/t1


def launch_items(recipe: Recipe, out: Path, items: list) -> None:
    """The one place that decides how work items run: all in one launch (`mode: one_job`, while a stage or Step 3
    is left to run), else each alone: stage runs one after another (or side by side, launch.spread), each resolved
    here and launched on its run directory; Step 3's pack, the evaluation and the alignment check each on the
    recipe's launch, the last two in this process when it has one rank."""
    launch = from_dict(LaunchConfig, recipe.launch, prefix="launch.")
    trainings = [i.run for i in items if isinstance(i, Training)]
    packs = [i for i in items if isinstance(i, Pack)]
    if recipe.mode == "one_job" and (trainings or packs):
        say(f"{len(trainings)} stage runs, {sum(len(p.runs) for p in packs)} single-device Step-3 runs and the "
            f"evaluation in one job of {launch.world_size} ranks; its log: {logs_dir(out) / 'job.log'}")
        stages = [_watched(n, i, len(trainings), logs_dir(out) / "job.log") for i, n in enumerate(trainings)]
        _launch_job(launch, out, "job", items, Follow(stages, _progress(items), others=_watches(packs)))
        return
    if launch.spread > 1:  # side by side on groups of nodes (its --check passed before)
        run_spread(trainings, recipe, out, lambda runs: run_stages(runs, logs_dir(out)))
    else:
        run_stages(trainings, logs_dir(out))
    for item in (i for i in items if not isinstance(i, Training)):
        if isinstance(item, Pack):
            say(f"Step 3: {len(item.runs)} single-device runs, {min(launch.world_size, len(item.runs))} at once on "
                f"{launch.world_size} device(s); each run's log: {logs_dir(out)}/finetune_*.log, the launch's: "
                f"{logs_dir(out) / f'{STEP3}.log'}")
            preflight(launch)
            _launch_job(launch, out, STEP3, [item], Follow([], others=_watches([item])))
        elif isinstance(item, Evaluation) and (left := _evaluation_left(item))[0]:
            say(f"evaluation: {left[0]} of {left[1]} units to run on {launch.world_size} rank(s); its log: "
                f"{logs_dir(out) / 'eval.log'}")
            if launch.world_size == 1 or launch.launcher == "none":  # one rank: here
                run_evaluation(item, say=lambda m: say(m.removeprefix("[mm-ds] ")))
            else:
                _launch_job(launch, out, "eval", [item], Follow([], _progress([item])))
        elif isinstance(item, Alignment) and launch.world_size > 1 and launch.launcher != "none":  # else: at the end
            say(f"alignment check: {len(item.runs)} language(s) on {launch.world_size} rank(s); its log: "
                f"{logs_dir(out) / 'align.log'}")
            _launch_job(launch, out, "align", [item], None)


def _launch_job(launch: LaunchConfig, out: Path, name: str, items: list, follow: Follow | None) -> None:
    """`items` in one launch: OUT/logs/NAME.json, run by `mm_ds/rank.py` on every rank, output to OUT/logs/NAME.log."""
    job = jobs.write(logs_dir(out) / f"{name}.json", items)
    packs = [i for i in items if isinstance(i, Pack)]
    try:
        _run_logged(rank_command(launch, job), logs_dir(out) / f"{name}.log", follow, launch_env(launch))
    except StageFailed as e:
        raise step3_failed(packs[0], e) if packs else e from None


def _watches(packs: list) -> list:
    return [Watch(p, "Step 3") for p in packs]


def _progress(items: list) -> Path | None:
    """Where the evaluation among `items` lists its units once it has them, for `Follow`."""
    return next((Path(i.progress) for i in items if isinstance(i, Evaluation) and i.progress), None)


def _evaluation_left(item: Evaluation) -> tuple[int, int]:
    """(units without a current result scored on this machine's kind of device, units) of the evaluation."""
    units, how = expand(item.groups), scored_with(default_device())
    return sum(cached(Path(item.results), u, item.data_root, how) is None for u in units), len(units)


def results_table(recipe: Recipe, rows: list[dict], out: Path):
    """Table 2 per task, captioned, into OUT/results.md, and the report it comes from: the same renderer
    (mm_ds/report/table2.py) writes report/tables.md's Table 2."""
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


def _write_results(recipe: Recipe, out: Path, rows: list[dict]) -> None:
    """results.jsonl, results.md and Table 5, the report, and the alignment check's MLM-level tables."""
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    rep = None
    if recipe.tasks:
        table, rep = results_table(recipe, rows, out)
        print(table)
    if minis_in_english(recipe):  # Table 5: the mini-models' own English scores beside the primary models'
        english = english_table(recipe, rows, primaries(recipe), minis_in_english(recipe), english_tasks(recipe))
        (out / "english.md").write_text(english + "\n")
        print("\nEnglish performance of the primary models and their mini-models (Table 5):\n" + english)
    if REFERENCE in recipe.systems and recipe.tasks:  # near-maximal performance is defined against BL_BASE (§4.2)
        written = report.write_report(rep, out / "report")
        print("\n" + report.format_tables(rep, table2s=False))  # Table 2 is results.md, printed above
        say("report: " + ", ".join(str(p) for p in written if p.suffix in (".md", ".png")))
    if recipe.align_sequences:  # the alignment check and the MLM level: no task data needed
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
        try:
            configs = {n.out.resolve(): n.config() for n in runs}
        except ConfigError:  # `--check` names the stage; the plan is still listed
            return 0
        print("\n".join(f"# {line}" for note in protocol(recipe, runs, configs) for line in note.splitlines()),
              file=sys.stderr)  # stdout stays one stage command a line, for scripts
        return 0
    findings = check(recipe, out, strict=True)
    if findings.problems:  # before any data work: nothing is written
        raise ConfigError(f"the recipe cannot run:\n{findings.format()}\n(`mm-ds run RECIPE --check --out DIR` "
                          f"finds the same without running, but takes data that is absent altogether for data still "
                          f"to come: a note there)")
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if recipe.world is None and (left := [lang for lang in languages(recipe) if not prepared(out, lang)]):
        say(f"preparing {' '.join(left)} here before any stage; on a cluster `mm-ds run RECIPE --only prepare` does "
            f"it apart, as a CPU job before the GPU allocation")
    prepare_data(recipe, out)
    todo = [n for n in runs if not complete(n.out)]
    for n in runs:
        if n not in todo:
            print(f"[mm-ds run] skip {n.name.partition('/')[2]}: complete", flush=True)  # its run dir under OUT
    items = work_items(recipe, out, todo)
    launch_items(recipe, out, items)
    ev = next(i for i in items if isinstance(i, Evaluation))
    rows = collect(expand(ev.groups), ev.data_root, Path(ev.results))
    _write_results(recipe, out, rows)
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
        findings = check(recipe, Path(a.out), strict=False)
        print(f"mm-ds run {a.recipe} --check: {findings.format()}")
        return 1 if findings.problems else 0
    try:
        with stop.forwarding(raise_when_idle=True):  # a stop signal: its launcher saves, then this ends
            return run(recipe, Path(a.out), a.list_stage_runs)
    except StageFailed as e:  # the stage's own traceback is in its log; ours would bury the message
        print(f"mm-ds run: error: {e}", file=sys.stderr)
        return 1
    except stop.Stopped as e:
        say(f"{e}; resume with: {shlex.join(['mm-ds', 'run', *argv])}")
        return stop.EXIT_CODE

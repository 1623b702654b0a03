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
    OUT/align/, OUT/align.jsonl     the alignment check of the mini-model systems (mm_ds/align.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import checkpoint
from .config import ConfigError, from_dict
from .progress import Follow, Watched, say
from .recipe import (Recipe, StageRun, load_recipe, minis_in_english, prepare_options, stage_runs, task_root,
                     text_inputs)
from .systems import REFERENCE, system_of


class StageFailed(RuntimeError):
    """A process `mm-ds run` started failed; the message names its log and shows its last lines."""


def complete(run: Path) -> bool:
    try:
        checkpoint.verify(run / checkpoint.FINAL, checksums=False)
        return True
    except checkpoint.CheckpointError:
        return False


# ---------------------------------------------------------------- running

def _mm_ds(argv: list[str], log: Path) -> None:
    say(f"$ mm-ds {' '.join(argv)}")
    _run_logged([sys.executable, "-m", "mm_ds.cli", *argv], log)


def _launch_stage(name: str, argv: list[str], log: Path, follow: Follow | None = None) -> None:
    """One stage as `mm-ds STAGE ARGV` would run it, with its checks done here (one process fewer per stage:
    start-up, not training, dominates small stages) and its ranks started by the launcher, output to `log`."""
    import contextlib

    from .cli import preflight_stage, validated_env
    from .launch import command

    say(f"$ mm-ds {' '.join(argv)}")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        try:
            _, cfg, done = preflight_stage(argv[0], argv[1:])
        except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, ValueError) as e:
            raise ConfigError(f"stage {name}: {e}") from e
    if not done:
        _run_logged(command(cfg.launch, argv) if cfg.launch.launcher != "none"
                    else [sys.executable, "-m", "mm_ds.cli", *argv], log, follow, validated_env(argv))


def run_stages(todo: list[StageRun], logs: Path) -> None:
    """Each stage run in order, one launch each, its output in `logs`, progress shown meanwhile; an
    interrupted one resumes from its newest checkpoint. The caller has left out the complete ones."""
    for i, n in enumerate(todo):
        resume = ["--resume"] if checkpoint.list_checkpoints(n.out) else []
        if resume:
            found = checkpoint.find_resume_point(n.out)
            say(f"resume {n.name} from {found.name if found else 'step 0 (no checkpoint verifies)'}")
        log = logs / f"{n.name.replace('/', '_')}.log"
        _launch_stage(n.name, n.argv + ["--no-progress"] + resume, log, Follow([_watched(n, i, len(todo), log)]))


def _watched(run: StageRun, i: int, n: int, log: Path) -> Watched:
    return Watched(run.name.partition("/")[2], run.out, log, i, n)  # its run directory under OUT: adapt/minipost/t1


def _run_logged(cmd: list[str], log: Path, follow: Follow | None = None, env: dict[str, str] | None = None) -> None:
    """Run `cmd` with all its output (the ranks' and DeepSpeed's) in `log`; `follow` shows progress meanwhile."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONUNBUFFERED": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                        **(env or {})}
    with open(log, "a") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            (follow or Follow([])).wait(proc)
        except BaseException:  # Ctrl-C: the launcher and its ranks stop with us
            proc.terminate()
            proc.wait()
            raise
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise StageFailed(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; its output is in {log}:\n"
                          f"{tail}\nFix the cause and re-run the same `mm-ds run` command: finished stages are "
                          f"skipped and interrupted ones resume")


def job_main(argv: list[str]) -> int:
    """Inside `mm-ds run`'s one job (every rank): run each listed stage that is not complete, in order."""
    import gc

    from . import dist
    from .cli import run_stage

    rank, _, _ = dist.init()
    for stage_argv in json.loads(Path(argv[0]).read_text()):
        if stage_argv[0] == "run-eval":
            from .stages.transfer import run_eval_main
            run_eval_main(stage_argv[1:])
            continue
        run_dir = Path(stage_argv[stage_argv.index("--out") + 1])
        # Rank 0 decides for all: a rank that looked for itself could see a stage that rank 0 has just
        # finished alone (an extraction) as complete, skip its barrier, and deadlock the job.
        done, has_checkpoints = dist.broadcast_object(
            (complete(run_dir), bool(checkpoint.list_checkpoints(run_dir))) if rank == 0 else None)
        if done:
            continue
        resume = ["--resume"] if has_checkpoints else []
        print(f"[mm-ds run] stage: mm-ds {' '.join(stage_argv + resume)}", flush=True)
        run_stage(stage_argv[0], stage_argv[1:] + resume)
        gc.collect()
    return 0


def world_complete(world: Path) -> bool:
    """world.json is written last and lists every file: trust a world only when it parses and they exist."""
    try:
        manifest = json.loads((world / "world.json").read_text())
        return all((world / f).is_file() for f in manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prepare_data(recipe: Recipe, out: Path) -> None:
    if recipe.world is not None and not world_complete(out / "world"):
        from .data.world import generate_world
        generate_world(out / "world", languages=tuple(recipe.langs), **recipe.world)
    if recipe.rehearsal:
        from .data import rehearsal
        if not rehearsal.complete(out / "tasks"):
            rehearsal.build(recipe.data_root or ".", out / "tasks")
    opts = []
    for k, v in prepare_options(recipe).items():
        opts += [f"--{k.replace('_', '-')}", str(v)]
    for lang in [recipe.source_lang, *recipe.langs]:
        if (out / "data" / lang / "meta.json").is_file():  # prepare publishes the directory whole, meta.json last
            print(f"[mm-ds run] skip prepare {lang}: complete", flush=True)
            continue
        inputs = [str(out / "world" / "text" / f"{lang}.txt")] if recipe.world is not None else text_inputs(recipe, lang)
        args = ["prepare", "--lang", lang, "--out", str(out / "data" / lang)]
        for i in inputs:
            args += ["--input", i]
        _mm_ds(args + opts, out / "logs" / f"prepare_{lang}.log")


def evaluate(recipe: Recipe, out: Path, job_ran_it: bool = False) -> list[dict]:
    """Step 4 for the whole recipe: the units without a current result run on the recipe's launcher (every
    rank takes its share, on its device), or in this process when it has one rank; then every row."""
    from .config import LaunchConfig
    from .launch import command
    from .stages.transfer import cached, collect, eval_units, run_units, write_eval_spec

    units, root, results = eval_units(recipe, out), str(task_root(recipe, out)), out / "eval"
    todo = [u for u in units if cached(results, u, root) is None]
    if todo and not job_ran_it:
        cfg = from_dict(LaunchConfig, recipe.launch)
        say(f"evaluation: {len(todo)} of {len(units)} units to run on {cfg.world_size} rank(s); its log: "
            f"{out / 'logs' / 'eval.log'}")
        if cfg.world_size == 1 or cfg.launcher == "none":
            import torch
            run_units(units, root, results, device="cuda" if torch.cuda.is_available() else "cpu",
                      say=lambda m: say(m.removeprefix("[mm-ds] ")))
        else:
            spec = write_eval_spec(recipe, out)
            _run_logged(command(cfg, ["run-eval", str(spec)]), out / "logs" / "eval.log", Follow([], spec))
    return collect(units, root, results)


def results_table(recipe: Recipe, rows: list[dict], out: Path) -> str:
    """Table 2's layout: systems x (task, language) final scores, with the Step-2 cost and the control."""
    from .flops import to_v100_days

    def final(system, task, lang, kind):
        cand = [r for r in rows if (r["system"], r["task"], r["lang"], r["kind"]) == (system, task, lang, kind)]
        return max(cand, key=lambda r: r["step"]) if cand else None

    cols = [(t, lang) for t in recipe.tasks for lang in [recipe.source_lang, *recipe.langs]]
    head = ["system", "Step-2 EFLOPs", "V100-days"] + [f"{t} {lang}" for t, lang in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in recipe.systems:
        adapted = [final(s, t, lang, "adapted") for t in recipe.tasks for lang in recipe.langs]
        cost = statistics.mean(r["flops"] for r in adapted if r) if any(adapted) else 0.0
        cells = [system_of(s).label, f"{cost / 1e18:.3g}", f"{to_v100_days(cost):.2g}"]
        for t, lang in cols:
            if lang == recipe.source_lang:
                r = final(s, t, lang, "source")
                cells.append(f"{r['score']:.1f}" if r else "-")
            else:
                r, c = final(s, t, lang, "adapted"), final(s, t, lang, "control")
                cells.append(f"{r['score']:.1f} (ctrl {c['score']:.1f})" if r and c else "-")
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    return text


def run(recipe: Recipe, out: Path, list_only: bool = False) -> int:
    runs = stage_runs(recipe, out)
    if list_only:
        for n in runs:
            print(f"{'done' if complete(n.out) else 'todo'}  mm-ds {' '.join(n.argv)}")
        from .check import protocol
        from .cli import stage_config
        try:
            configs = {n.out.resolve(): stage_config(n.argv[0], n.argv[1:])[1] for n in runs}
        except ConfigError:  # `--check` names the stage; the plan is still listed
            return 0
        print("\n".join(f"# {line}" for note in protocol(recipe, runs, configs) for line in note.splitlines()),
              file=sys.stderr)  # stdout stays one stage command a line, for scripts
        return 0
    from .check import check
    report = check(recipe, out, strict=True)
    if report.problems:  # before any data work: nothing is written
        raise ConfigError(f"the recipe cannot run:\n{report.format()}\n(`mm-ds run RECIPE --check --out DIR` "
                          f"lists the same without running)")
    t0 = time.time()
    os.environ.setdefault("MM_DS_LAUNCH_ROOT", str(os.getpid()))  # stage ranks exit if this process dies
    out.mkdir(parents=True, exist_ok=True)
    prepare_data(recipe, out)
    todo = [n for n in runs if not complete(n.out)]
    for n in runs:
        if n not in todo:
            print(f"[mm-ds run] skip {n.name}: complete", flush=True)
    job_ran_eval = False
    if recipe.mode == "one_job" and todo:
        # One launch for every stage: the ranks walk the stage runs in-process (a new engine per stage), then share
        # the evaluation (its units are listed by rank 0 once Step 2 has written its checkpoints).
        from .config import LaunchConfig
        from .launch import command
        job_file = out / "logs" / "job.json"
        job_file.parent.mkdir(parents=True, exist_ok=True)
        (out / "logs" / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1))
        entries = [n.argv + ["--no-progress"] for n in todo]
        entries.append(["run-eval", str(out / "logs" / "eval.json"), str(out / "logs" / "recipe.json"), str(out)])
        job_file.write_text(json.dumps(entries, indent=1))
        cfg = from_dict(LaunchConfig, recipe.launch)
        say(f"{len(todo)} stages and the evaluation in one job of {cfg.world_size} ranks; its log: "
            f"{out / 'logs' / 'job.log'}")
        _run_logged(command(cfg, ["run-job", str(job_file)]) if cfg.launcher != "none"
                    else [sys.executable, "-m", "mm_ds.cli", "run-job", str(job_file)], out / "logs" / "job.log",
                    Follow([_watched(n, i, len(todo), out / "logs" / "job.log") for i, n in enumerate(todo)],
                           out / "logs" / "eval.json"))
        todo, job_ran_eval = [], True
    run_stages(todo, out / "logs")
    rows = evaluate(recipe, out, job_ran_it=job_ran_eval)
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    if recipe.tasks:
        print(results_table(recipe, rows, out))
    if minis_in_english(recipe):  # Table 5: the mini-models' own English scores beside the primary models'
        from .analyses import english_table
        english = english_table(recipe, rows)
        (out / "english.md").write_text(english + "\n")
        print("\nEnglish performance of the primary models and their mini-models (Table 5):\n" + english)
    if REFERENCE in recipe.systems and recipe.tasks:  # near-maximal performance is defined against BL_BASE (§4.2)
        from . import report
        from .records import clean_records, control_scores
        results, warnings = clean_records(rows, str(out / "results.jsonl"))
        rep = report.build_report(results, warnings=warnings, controls=control_scores(rows),
                                  headline_tasks=recipe.headline())
        written = report.write_report(rep, out / "report")
        print("\n" + report.format_tables(rep, table2s=False))  # results.md above is Table 2 with the controls
        say("report: " + ", ".join(str(p) for p in written if p.suffix in (".md", ".png")))
    from .report import MLM_DIR
    if recipe.align_sequences:  # the alignment check and the MLM level: no task data needed
        import torch

        from .align import align_recipe
        written = align_recipe(recipe, out, "cuda" if torch.cuda.is_available() else "cpu",
                               say=lambda m: say(m.removeprefix("[mm-ds] ")))
        if (out / "report" / MLM_DIR / "tables.md").is_file():
            print("\nAt the MLM level (held-out target MLM accuracy of the primary model with the Step-2 "
                  "embeddings):\n\n" + (out / "report" / MLM_DIR / "tables.md").read_text())
        say("alignment check and MLM level: " + ", ".join(str(p) for p in written if p.suffix in (".md", ".png")))
    say(f"{len(runs)} stages, {time.time() - t0:.0f} s; "
        + (f"results: {out / 'results.md'} (rows: {out / 'results.jsonl'})" if recipe.tasks
           else f"MLM-level results: {out / 'report' / MLM_DIR / 'tables.md'} (rows: {out / 'align.jsonl'})"))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds run", description="run a whole experiment from a recipe")
    p.add_argument("recipe", help="packaged recipe (tiny, quick, paper) or a YAML file")
    p.add_argument("--out", required=True)
    p.add_argument("--plan", action="store_true", help="print the stage commands and their state; run nothing")
    p.add_argument("--check", action="store_true", help="validate every stage run (configs, engine "
                   "configs, batch geometry, launcher, task coverage, files that are here); run nothing")
    p.add_argument("--launch", action="append", default=[], metavar="KEY=VALUE",
                   help="launch.* setting for every training stage, over the recipe's (repeatable), e.g. "
                        "--launch launcher=mpirun --launch hostfile=hosts --launch nodes=2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a recipe key (repeatable), e.g. --set seeds=[1] --set task_root=/data/tasks")
    a = p.parse_args(argv)
    sets = list(a.set)
    for item in a.launch:
        if "=" not in item:
            raise ConfigError(f"--launch {item!r} must look like KEY=VALUE, e.g. --launch ranks=8")
        sets.append("launch." + item.removeprefix("launch."))
    recipe = load_recipe(a.recipe, sets)
    if a.check:
        from .check import check
        report = check(recipe, Path(a.out), strict=False)
        print(f"mm-ds run {a.recipe} --check: {report.format()}")
        return 1 if report.problems else 0
    try:
        return run(recipe, Path(a.out), a.plan)
    except StageFailed as e:  # the stage's own traceback is in its log; ours would bury the message
        print(f"mm-ds run: error: {e}", file=sys.stderr)
        return 1

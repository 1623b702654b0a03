"""`mm-ds run RECIPE`: a whole experiment, stage by stage, with one results table at the end.

A recipe (packaged `recipes/NAME.yaml` or a file) names the systems, target languages, tasks, seeds, the
data, and a preset per stage. The plan is a list of stage runs; each is launched as its own `mm-ds
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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from . import checkpoint
from .config import SYSTEMS, ConfigError, from_dict
from .data.tasks import TASKS

PRIMARY = {"bl_base": "bl_base", "bl_small": "bl_small", "minijoint": "minijoint", "minipost": "bl_base"}
"""Which pretrained model is each system's primary model (Steps 1, 3, 4)."""


@dataclass
class Recipe:
    """What to run. Stage presets may use {system}; overrides are key=value lists per stage."""

    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    langs: list[str] = field(default_factory=list)
    """Target languages."""
    tasks: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [1])
    """Finetuning seeds (paper: 5); scores are averaged over them."""
    source_lang: str = "en"
    world: dict | None = None
    """Generate the synthetic world first (keyword arguments of mm_ds.data.world.generate_world)."""
    text: dict = field(default_factory=dict)
    """lang -> list of input files/globs for `mm-ds prepare` (real data). The world provides its own."""
    task_root: str = ""
    """Directory with the task files in the official layout (the world's, when generated)."""
    data_root: str = ""
    """Where relative `text` inputs and `task_root` start (default: the working directory)."""
    rehearsal: bool = False
    """Make the task files from the public data under data_root (../shared/data's layout), English training
    sets included (mm_ds/data/rehearsal.py): the real-data rehearsal of the paper recipe."""
    eval_examples: int | None = None
    """Evaluate on the first N examples of each evaluation file only (quick runs; the paper: all)."""
    prepare: dict = field(default_factory=dict)
    """Options of `mm-ds prepare` (vocab_size, model_type, sample_sentences)."""
    presets: dict = field(default_factory=dict)
    """stage -> preset name: pretrain, build_mini, adapt, finetune."""
    overrides: dict = field(default_factory=dict)
    """stage -> list of key=value applied after the preset. `<stage>/<system>` keys apply to one system's runs
    of that stage after the stage's (e.g. adapt/bl_base: the paper checkpoints BL_BASE's Step 2 more often);
    `finetune/<task>` keys to one task's finetuning, last (tasks differ in how many updates they need)."""
    launch: dict = field(default_factory=dict)
    """launch.* overrides for every training stage (ranks, launcher, master_port)."""
    mode: str = "per_stage"
    """per_stage: each stage its own launch (clusters: per-stage resources, logs, retries); one_job: a
    single launch whose ranks run every stage in order (small runs, where start-up would dominate)."""
    curve: bool = False
    """Score every Step-2 checkpoint (training curves), not only the final one."""
    eval_split: str = "test"
    eval_splits: dict = field(default_factory=dict)
    """task -> evaluation split, over eval_split (e.g. {mlqa: dev} where only MLQA's dev files are at hand)."""
    coverage: dict = field(default_factory=dict)
    """task -> the languages it is evaluated in (source language included). Default: the languages the task
    table gives the official data set (mm_ds/data/tasks.py), or every language of a generated world. A task
    is not evaluated in a recipe language it does not cover: the results show a gap, not an error."""

    def evaluated(self, task: str) -> list[str]:
        """The recipe's languages (source first) that `task` is evaluated in."""
        langs = [self.source_lang, *self.langs]
        if task in self.coverage:
            return [lang for lang in langs if lang in self.coverage[task]]
        if self.world is not None:
            return langs
        return [lang for lang in langs if lang in TASKS[task].languages]

    def split(self, task: str) -> str:
        return self.eval_splits.get(task, self.eval_split)

    def check(self, where: str) -> None:
        bad = [s for s in self.systems if s not in SYSTEMS]
        if bad:
            raise ConfigError(f"{where}: unknown system(s) {bad}; choose from {', '.join(SYSTEMS)}")
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"{where}: unknown task(s) {bad}; choose from {', '.join(TASKS)}")
        if not self.langs or not self.tasks:
            raise ConfigError(f"{where}: a recipe needs at least one target language (langs) and one task")
        if self.world is None:
            missing = [lang for lang in [self.source_lang, *self.langs] if lang not in self.text]
            if missing:
                raise ConfigError(f"{where}: no text inputs for language(s) {missing}; add them under text:")
            if not self.task_root and not self.rehearsal:
                raise ConfigError(f"{where}: task_root is unset (the directory with the task files)")
        else:
            from .data.world import PRESETS
            bad = [lang for lang in self.langs if lang not in PRESETS]
            if bad:
                raise ConfigError(f"{where}: language(s) {bad} are not generated-world languages "
                                  f"({', '.join(PRESETS)})")
            if self.rehearsal:
                raise ConfigError(f"{where}: world (generated data) and rehearsal (real data) exclude each other")
        if self.eval_examples is not None and self.eval_examples < 1:
            raise ConfigError(f"{where}: eval_examples must be positive (or null: every example)")
        for key in ("coverage", "eval_splits"):
            bad = [t for t in getattr(self, key) if t not in TASKS]
            if bad:
                raise ConfigError(f"{where}: {key}.{bad[0]} is not a task; choose from {', '.join(TASKS)}")
        for task, langs in self.coverage.items():
            if not isinstance(langs, list):
                raise ConfigError(f"{where}: coverage.{task} must be a list of languages, got {langs!r}")
        from .config import LaunchConfig
        launch = from_dict(LaunchConfig, self.launch, prefix="launch.")  # types, before any data work
        launch.check()
        self.launch = {k: getattr(launch, k) for k in self.launch}
        if self.mode not in ("per_stage", "one_job"):
            raise ConfigError(f"{where}: mode={self.mode!r}; use per_stage or one_job")
        for stage in ("pretrain", "adapt", "finetune"):
            if stage not in self.presets:
                raise ConfigError(f"{where}: presets.{stage} is unset")
        stages = ("pretrain", "build_mini", "adapt", "finetune")
        for k in self.overrides:
            stage, _, which = k.partition("/")
            if stage not in stages or which and not (which in SYSTEMS or stage == "finetune" and which in TASKS):
                raise ConfigError(f"{where}: overrides.{k} names no stage; use {', '.join(stages)}, "
                                  f"<stage>/<system> with a system of {', '.join(SYSTEMS)}, or finetune/<task> "
                                  f"with a task of {', '.join(TASKS)}")
            if not isinstance(self.overrides[k], list):
                raise ConfigError(f"{where}: overrides.{k} must be a list of key=value strings")


def recipe_names() -> list[str]:
    root = resources.files("mm_ds") / "presets" / "recipes"
    return sorted(f.name[:-5] for f in root.iterdir() if f.name.endswith(".yaml"))


def load_recipe(name: str, sets: list[str] = ()) -> Recipe:
    """A packaged recipe or a YAML file, with `key=value` changes (`mm-ds run --set`, `--launch`) applied."""
    from .config import apply_overrides

    path = Path(name)
    if not path.is_file():
        packaged = resources.files("mm_ds") / "presets" / "recipes" / f"{name}.yaml"
        if not packaged.is_file():
            raise ConfigError(f"recipe {name!r} is neither a file nor a packaged recipe ({', '.join(recipe_names())})")
        path = Path(str(packaged))
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must hold a mapping of keys, got {type(data).__name__}")
    recipe = from_dict(Recipe, apply_overrides(data, list(sets)))
    recipe.check(str(path) + (f" with {' '.join(sets)}" if sets else ""))
    return recipe


@dataclass
class Node:
    name: str
    out: Path
    argv: list[str]
    """mm-ds arguments; run as `python -m mm_ds.cli ARGV`."""


def plan(recipe: Recipe, out: Path) -> list[Node]:
    """Every training stage in dependency order (each node's parents come before it)."""
    data = out / "data"
    launch = [f"launch.{k}={v}" for k, v in recipe.launch.items()]
    nodes: list[Node] = []

    def stage(kind: str, run: Path, system: str, lang: str, parent: Path | None, extra: list[str]) -> None:
        preset = recipe.presets.get(kind, "").format(system=system)
        argv = [kind.replace("_", "-"), "--preset", preset, "--out", str(run), f"system={system}", f"lang={lang}",
                *launch, *recipe.overrides.get(kind, []), *recipe.overrides.get(f"{kind}/{system}", []), *extra]
        if parent is not None:
            argv.append(f"parent={parent}")
        nodes.append(Node(f"{kind}/{run.relative_to(out)}", run, argv))

    for p in primaries(recipe):
        stage("pretrain", out / "pretrain" / p, p, recipe.source_lang, None, [f"data.corpus={data / recipe.source_lang}"])
    for s in recipe.systems:
        if s in ("minijoint", "minipost"):
            stage("build_mini", out / "build_mini" / s, s, recipe.source_lang, out / "pretrain" / PRIMARY[s],
                  [f"data.corpus={data / recipe.source_lang}"])
    for s in recipe.systems:
        parent = out / ("build_mini" if s in ("minijoint", "minipost") else "pretrain") / (
            s if s in ("minijoint", "minipost") else PRIMARY[s])
        for lang in recipe.langs:
            stage("adapt", out / "adapt" / s / lang, s, lang, parent, [f"data.corpus={data / lang}"])
    for p in primaries(recipe):
        for task in recipe.tasks:
            for seed in recipe.seeds:
                stage("finetune", out / "finetune" / p / task / f"seed{seed}", p, recipe.source_lang,
                      out / "pretrain" / p, [f"finetune.task={task}", f"train.seed={seed}",
                                             f"finetune.data_root={task_root(recipe, out)}",
                                             *recipe.overrides.get(f"finetune/{task}", [])])
    return nodes


def primaries(recipe: Recipe) -> list[str]:
    return sorted({PRIMARY[s] for s in recipe.systems}, key=SYSTEMS.index)


def task_root(recipe: Recipe, out: Path) -> Path:
    if recipe.world is not None:
        return out / "world"
    return out / "tasks" if recipe.rehearsal else data_path(recipe, recipe.task_root)


def data_path(recipe: Recipe, path: str) -> Path:
    """A path of the recipe's data: relative ones start at data_root."""
    return Path(recipe.data_root or ".") / path if not Path(path).is_absolute() else Path(path)


def text_inputs(recipe: Recipe, lang: str) -> list[str]:
    return [i if i.startswith("hf:") else str(data_path(recipe, i)) for i in recipe.text.get(lang, [])]


def complete(run: Path) -> bool:
    try:
        checkpoint.verify(run / checkpoint.FINAL, checksums=False)
        return True
    except checkpoint.CheckpointError:
        return False


# ---------------------------------------------------------------- running

def _mm_ds(argv: list[str], log: Path) -> None:
    print(f"[mm-ds run] $ mm-ds {' '.join(argv)}", flush=True)
    _run_logged([sys.executable, "-m", "mm_ds.cli", *argv], log)


def _launch_stage(name: str, argv: list[str], log: Path) -> None:
    """One stage as `mm-ds STAGE ARGV` would run it, with its checks done here (one process fewer per stage:
    start-up, not training, dominates small stages) and its ranks started by the launcher, output to `log`."""
    import contextlib

    from .cli import preflight_stage, validated_env
    from .launch import command

    print(f"[mm-ds run] $ mm-ds {' '.join(argv)}", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):
        try:
            _, cfg, done = preflight_stage(argv[0], argv[1:])
        except (ConfigError, checkpoint.CheckpointError, FileNotFoundError, ValueError) as e:
            raise ConfigError(f"stage {name}: {e}") from e
    if not done:
        _run_logged(command(cfg.launch, argv) if cfg.launch.launcher != "none"
                    else [sys.executable, "-m", "mm_ds.cli", *argv], log, validated_env(argv))


def _run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONUNBUFFERED": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                        **(env or {})}
    with open(log, "a") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; its output is in {log}:\n"
                           f"{tail}\nFix the cause and re-run the same `mm-ds run` command: finished stages are "
                           f"skipped and interrupted ones resume")


def plan_main(argv: list[str]) -> int:
    """Inside `mm-ds run`'s one job (every rank): run each planned stage that is not complete, in order."""
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
    for k, v in recipe.prepare.items():
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


def eval_units(recipe: Recipe, out: Path) -> list:
    """Every Step-4 evaluation of the recipe, sorted by task and primary model: the languages each task
    covers, every Step-2 checkpoint (curve) or the final one, a control per language, all seeds per unit."""
    from .stages.transfer import units_for

    units = []
    for task in recipe.tasks:
        split, langs = recipe.split(task), recipe.evaluated(task)
        for p in primaries(recipe):
            ft = [str(out / "finetune" / p / task / f"seed{seed}") for seed in recipe.seeds]
            systems = [s for s in recipe.systems if PRIMARY[s] == p]
            if recipe.source_lang in langs:  # one evaluation for every system sharing the primary model
                units += units_for(task, recipe.source_lang, systems, ft, split, limit=recipe.eval_examples)
            for s in systems:
                for lang in (lang for lang in langs if lang != recipe.source_lang):
                    units += units_for(task, lang, [s], ft, split, str(out / "adapt" / s / lang),
                                       curve=recipe.curve, control=True, limit=recipe.eval_examples)
    return units


def write_eval_spec(recipe: Recipe, out: Path) -> Path:
    """OUT/logs/eval.json: the units and where their results go, for `mm-ds run-eval` on every rank."""
    from dataclasses import asdict

    path = out / "logs" / "eval.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_json_atomic(path, {"data_root": str(task_root(recipe, out)), "results": str(out / "eval"),
                                        "units": [asdict(u) for u in eval_units(recipe, out)]})
    return path


def evaluate(recipe: Recipe, out: Path, job_ran_it: bool = False) -> list[dict]:
    """Step 4 for the whole recipe: the units without a current result run on the recipe's launcher (every
    rank takes its share, on its device), or in this process when it has one rank; then every row."""
    from .config import LaunchConfig
    from .launch import command
    from .stages.transfer import cached, collect, run_units

    units, root, results = eval_units(recipe, out), str(task_root(recipe, out)), out / "eval"
    todo = [u for u in units if cached(results, u, root) is None]
    if todo and not job_ran_it:
        cfg = from_dict(LaunchConfig, recipe.launch)
        print(f"[mm-ds run] evaluation: {len(todo)} of {len(units)} units to run on {cfg.world_size} rank(s)",
              flush=True)
        if cfg.world_size == 1 or cfg.launcher == "none":
            import torch
            run_units(units, root, results, device="cuda" if torch.cuda.is_available() else "cpu",
                      say=lambda m: print(m, flush=True))
        else:
            _run_logged(command(cfg, ["run-eval", str(write_eval_spec(recipe, out))]), out / "logs" / "eval.log")
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
        cells = [s.upper(), f"{cost / 1e18:.3g}", f"{to_v100_days(cost):.2g}"]
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


def run(recipe: Recipe, out: Path, only_plan: bool = False) -> int:
    nodes = plan(recipe, out)
    if only_plan:
        for n in nodes:
            print(f"{'done' if complete(n.out) else 'todo'}  mm-ds {' '.join(n.argv)}")
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
    todo = [n for n in nodes if not complete(n.out)]
    for n in nodes:
        if n not in todo:
            print(f"[mm-ds run] skip {n.name}: complete", flush=True)
    job_ran_eval = False
    if recipe.mode == "one_job" and todo:
        # One launch for every stage: the ranks walk the plan in-process (a new engine per stage), then share
        # the evaluation (its units are listed by rank 0 once Step 2 has written its checkpoints).
        from .config import LaunchConfig
        from .launch import command
        plan_file = out / "logs" / "plan.json"
        plan_file.parent.mkdir(parents=True, exist_ok=True)
        (out / "logs" / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1))
        entries = [n.argv + ["--no-progress"] for n in todo]
        entries.append(["run-eval", str(out / "logs" / "eval.json"), str(out / "logs" / "recipe.json"), str(out)])
        plan_file.write_text(json.dumps(entries, indent=1))
        cfg = from_dict(LaunchConfig, recipe.launch)
        print(f"[mm-ds run] {len(todo)} stages and the evaluation in one job of {cfg.world_size} ranks; log: "
              f"{out / 'logs' / 'job.log'}", flush=True)
        _run_logged(command(cfg, ["run-plan", str(plan_file)]) if cfg.launcher != "none"
                    else [sys.executable, "-m", "mm_ds.cli", "run-plan", str(plan_file)], out / "logs" / "job.log")
        todo, job_ran_eval = [], True
    for n in todo:
        resume = ["--resume"] if checkpoint.list_checkpoints(n.out) else []
        if resume:
            found = checkpoint.find_resume_point(n.out)
            print(f"[mm-ds run] resume {n.name} from {found.name if found else 'step 0 (no checkpoint verifies)'}",
                  flush=True)
        _launch_stage(n.name, n.argv + ["--no-progress"] + resume, out / "logs" / f"{n.name.replace('/', '_')}.log")
    rows = evaluate(recipe, out, job_ran_it=job_ran_eval)
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(results_table(recipe, rows, out))
    if "bl_base" in recipe.systems:  # near-maximal performance is defined against BL_BASE (paper §4.2)
        from . import report
        results, warnings = report.clean_records(rows, str(out / "results.jsonl"))
        rep = report.build_report(results, warnings=warnings)
        report.write_report(rep, out / "report")
        print(report.format_tables(rep))
    print(f"[mm-ds run] {len(nodes)} stages, {time.time() - t0:.0f} s; results in {out / 'results.jsonl'}")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mm-ds run", description="run a whole experiment from a recipe")
    p.add_argument("recipe", help="packaged recipe (tiny, quick, paper) or a YAML file")
    p.add_argument("--out", required=True)
    p.add_argument("--plan", action="store_true", help="print the stage commands and their state; run nothing")
    p.add_argument("--check", action="store_true", help="validate every stage of the plan (configs, engine "
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
    return run(recipe, Path(a.out), a.plan)


def stage_configs(recipe: Recipe, out: Path = Path("OUT")) -> dict[str, object]:
    """Each planned stage run's effective RunConfig (preset, stage, system and task overrides), parsed from the
    very command line `mm-ds run` would launch, keyed by the run directory under `out`."""
    from .cli import stage_config

    return {n.name.split("/", 1)[1]: stage_config(n.argv[0], n.argv[1:])[1] for n in plan(recipe, out)}


def flops_recipe(recipe: Recipe):
    """The recipe's stages as mm_ds.flops sees them, from each stage's effective config, so `mm-ds flops --recipe
    NAME` and `mm-ds plan NAME` cost exactly what `mm-ds run NAME` would run (the first target language's Step 2
    stands for every language's)."""
    from . import flops
    from .ds_config import global_batch

    cfgs = stage_configs(recipe)
    vocab = int(recipe.prepare.get("vocab_size", 50_000))

    def stage(name, kind, cfg, n_layers, trainable=None):
        return flops.Stage(name, kind, n_layers, trainable, steps=cfg.train.steps, global_batch=global_batch(cfg),
                           seq_len=cfg.data.seq_len)

    systems = {}
    for s in recipe.systems:
        pre = cfgs[f"pretrain/{PRIMARY[s]}"]
        m, layers = pre.model, pre.model.num_layers
        stages = [stage("step1", "pretrain_dual" if m.aux_head_layer else "pretrain", pre, layers)]
        adapt = cfgs[f"adapt/{s}/{recipe.langs[0]}"]
        if s == "minijoint":
            stages.append(stage("step2", "adapt", adapt, m.aux_head_layer))
        elif s == "minipost":
            b = cfgs[f"build_mini/{s}"]
            mini = b.mini.layers + b.mini.new_layers
            stages += [stage("step1b", "build_mini", b, mini, b.mini.new_layers), stage("step2", "adapt", adapt, mini)]
        else:
            stages.append(stage("step2", "adapt", adapt, layers))
        systems[s.upper()] = tuple(stages)
    geometry = flops.Geometry(hidden=m.hidden_size, vocab=m.vocab_size or vocab, mask_prob=pre.data.mask_prob)
    return flops.Recipe(geometry, systems)

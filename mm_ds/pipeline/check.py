"""`mm-ds run RECIPE --check`: what a launch would validate, for every stage of the plan, before any of it runs.

Without data, parents, ports or training: each stage's preset and override keys (the stage's own parser and
config checks), its batch geometry at the recipe's world size, its engine config through DeepSpeed's parser,
the architecture it inherits (a mini-model shallower than its primary, a secondary head for MINIJOINT, sequence
length within the parent's positions), the launcher settings, which task is evaluated in which language (and
the gaps), the task and text files when they are there, and that the output directory can be written.
`mm-ds run` runs the same check, strictly (the data must be there), before its first stage: a recipe never
fails after days of training for a reason knowable at the start.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError, LaunchConfig, ModelConfig, RunConfig, from_dict
from ..data.tasks import HUB, TaskDataError, find_local, get_task, hub_source, is_hub
from ..runtime.checkpointing.checkpoint import unwritable
from ..runtime.distributed import launch
from ..runtime.training import ds_config
from ..stages.common import Parent
from ..stages.resolve import stage_module
from ..systems import system_of
from .recipe import data_path, english_tasks, minis_in_english, primaries, task_root, text_inputs
from .spread import check_spread
from .stage_runs import PACKED, stage_runs

PREPARED = "meta.json"  # `mm-ds prepare` writes it last: a prepared corpus needs no text inputs


@dataclass
class Findings:
    """What `--check` found: the problems that would stop a run, the coverage gaps, notes."""
    problems: list[tuple[str, str]] = field(default_factory=list)
    """(where: a stage run, an evaluation or the recipe, what is wrong and how to fix it)."""
    gaps: dict[str, list[str]] = field(default_factory=dict)
    """task -> languages of the recipe it is not evaluated in (the results show a gap)."""
    notes: list[str] = field(default_factory=list)
    stages: int = 0
    launch: str = ""
    """The recipe's launch in one line (launch.describe), when it was checked."""
    geometries: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """stage -> its batch geometry at its world size -> the systems whose stage runs have it."""
    launches: dict[str, str] = field(default_factory=dict)
    """Each distinct launch of the stage runs -> its problem ("" when none): checked once, not once a stage run."""

    def add(self, where: str, message: str) -> None:
        if (where, message) not in self.problems:
            self.problems.append((where, message))

    def format(self) -> str:
        lines = []
        # The same message for many runs (e.g. every finetuning run of a preset) is printed once.
        grouped: dict[str, list[str]] = {}
        for where, msg in self.problems:
            grouped.setdefault(msg, []).append(where)
        for msg, wheres in grouped.items():
            more = f" (and {len(wheres) - 1} more like it)" if len(wheres) > 1 else ""
            lines.append(f"  {wheres[0]}{more}: {msg}")
        head = (f"{len(self.problems)} problem(s) in {len(grouped)} kind(s):" if self.problems
                else f"ok: {self.stages} stage runs can start")
        out = [head, *lines, *self._launch_lines()]
        if self.gaps:
            out.append("gaps (no such task data in that language; its Table 2 has no column for it): " +
                       "; ".join(f"{t}: {' '.join(ls)}" for t, ls in self.gaps.items()))
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


    def _launch_lines(self) -> list[str]:
        if not self.launch:
            return []
        lines = [f"launch: {self.launch}", "  geometry, micro batch x accumulation steps x world size = global batch:"]
        for stage, geos in self.geometries.items():
            packed = " (single-device runs, packed onto the launch's ranks)" if stage in PACKED else ""
            lines.append(f"    {stage}{packed}: " + "; ".join(
                f"{geo}" + (f" ({', '.join(systems)})" if len(geos) > 1 else "") for geo, systems in geos.items()))
        return lines


def check(recipe, out: Path, strict: bool) -> Findings:
    """Every problem of running `recipe` into `out`. strict (`mm-ds run`): data must be present; otherwise
    (`--check`) data that is absent here is a note, data that is partly there a problem."""
    findings = Findings()
    _check_out(out, findings)
    _check_coverage(recipe, findings)
    _check_data(recipe, out, strict, findings)
    try:
        runs = stage_runs(recipe, out)
    except ConfigError as e:
        findings.add("recipe", str(e))
        return findings
    configs = check_stages(runs, findings, strict=strict)
    findings.launch = launch.describe(from_dict(LaunchConfig, recipe.launch, prefix="launch."))
    check_spread(recipe, runs, configs, findings)  # launch.spread: each group's world size
    findings.notes += protocol(recipe, runs, configs)
    vocab = int(recipe.prepare.get("vocab_size", 50_000))  # `mm-ds prepare`'s default
    for run in runs:
        cfg = configs.get(run.out.resolve())
        if cfg is not None and cfg.stage == "pretrain" and cfg.model.vocab_size not in (None, vocab):
            findings.add(run.name.split("/", 1)[1], f"model.vocab_size={cfg.model.vocab_size} but the recipe "
                         f"prepares {vocab}-piece tokenizers (prepare.vocab_size); set model.vocab_size=null to "
                         f"take it from the tokenizer")
    return findings


def check_stages(runs, findings: Findings, known: dict[Path, RunConfig] | None = None, strict: bool = False
                 ) -> dict[Path, RunConfig]:
    """Each stage run of a plan, in order, statically (`_stage`); returns their configs by resolved run
    directory. `known`: configs of parents that are no stage of the plan (an imported model), so that what a
    stage inherits is checked against them too. `strict`: the launch starts from here (its master address
    must resolve here)."""
    findings.stages += len(runs)
    configs: dict[Path, RunConfig] = dict(known or {})
    for run in runs:
        cfg = _stage(run, configs, findings, strict)
        if cfg is not None:
            configs[run.out.resolve()] = cfg
    return configs


# ---------------------------------------------------------------- the protocol, as the stage configs have it

def protocol(recipe, runs, configs: dict[Path, RunConfig]) -> list[str]:
    """What the paper's protocol is made of, read from the planned stage configs: each Step-2 run's checkpoint
    schedule (early_checkpoints), the tasks of Figure 1's headline speedup, and Table 5's models and tasks."""
    schedules: dict[str, dict[str, list[str]]] = {}  # schedule -> system -> languages
    for run in runs:
        cfg = configs.get(run.out.resolve())
        if cfg is not None and cfg.stage == "adapt":
            schedules.setdefault(_schedule(cfg.train), {}).setdefault(cfg.system, []).append(cfg.lang)
    which = ("every Step-2 run keeps its preset's early checkpoints (finer than the paper's protocol)"
             if recipe.early_checkpoints is None else "early ones only where early_checkpoints says (footnote 3)")
    lines = [f"Step-2 checkpoints, {which}:"]
    for sched, systems in schedules.items():
        by_langs: dict[tuple, list[str]] = {}
        for system, langs in systems.items():
            by_langs.setdefault(tuple(langs), []).append(system)
        lines.append(f"  {sched}: " + "; ".join(f"{', '.join(ss)} in {' '.join(ls)}" for ls, ss in by_langs.items()))
    out = ["\n".join(lines)] if schedules else []
    if recipe.tasks:
        out.append(f"headline speedup (Figure 1, the report's avg row) averages {', '.join(recipe.headline())}"
                   + ("" if recipe.headline_tasks else " (every task; headline_tasks picks them)"))
    if minis_in_english(recipe):
        models = [system_of(p).label for p in primaries(recipe)]
        models += [f"{system_of(s).label}'s mini-model" for s in minis_in_english(recipe)]
        out.append(f"Table 5 (english.md): {', '.join(models)} in English {', '.join(english_tasks(recipe))}")
    return out


def _schedule(train) -> str:
    """A checkpoint schedule in words, e.g. `every 5000 updates, at 1000 2000 3000 4000 and the last (29)`."""
    every = train.checkpoint_every if train.checkpoint_every < train.steps else 0
    early = sorted(s for s in set(train.checkpoint_steps) if 0 < s < train.steps and not (every and s % every == 0))
    parts = ([f"every {every} updates"] if every else []) + ([f"at {' '.join(map(str, early))}"] if early else [])
    return f"{', '.join(parts + ['the last'])} of {train.steps} ({train.checkpoints()} checkpoints)"


# ---------------------------------------------------------------- the output directory

def _check_out(out: Path, findings: Findings) -> None:
    problem = unwritable(out)
    if problem:
        findings.add("--out", problem)


# ---------------------------------------------------------------- tasks x languages

def _check_coverage(recipe, findings: Findings) -> None:
    langs = [recipe.source_lang, *recipe.langs]
    for task in recipe.tasks:
        missing = [lang for lang in langs if lang not in recipe.evaluated(task)]
        if missing:
            findings.gaps[task] = missing
    for lang in recipe.langs if recipe.tasks else []:  # no tasks: measured at the MLM level only
        if not any(lang in recipe.evaluated(t) for t in recipe.tasks):
            findings.add("recipe", f"no task of the recipe is evaluated in {lang!r} ({', '.join(recipe.tasks)}); "
                                   f"add a task that covers it, or list it under coverage: if you have its files")


def _check_data(recipe, out: Path, strict: bool, findings: Findings) -> None:
    """The recipe's data where it is files: held-out text, task files and text inputs (a generated world has none
    to check). Unless `strict`, what is not here at all is a note: the check may run where the data is not."""
    _check_heldout(recipe, strict, findings)
    if recipe.world is not None:
        findings.notes.append("data is generated by the run (world:), so there are no files to check")
        return
    relative = [p for p in [*(i for v in recipe.text.values() for i in v), recipe.task_root, *recipe.heldout.values()]
                if p and not p.startswith("hf:") and not is_hub(p) and not Path(p).is_absolute()]
    if relative:  # resolved here exactly as the run resolves them (recipe.data_path)
        findings.notes.append(f"relative paths of the recipe (text, task_root, heldout) start at data_root="
                              f"{recipe.data_root or Path.cwd()}")
    _check_task_files(recipe, task_root(recipe, out), strict, findings)
    _check_text_inputs(recipe, out, strict, findings)


def _check_heldout(recipe, strict: bool, findings: Findings) -> None:
    """The held-out text files the recipe names (heldout:), for the alignment check."""
    for lang, file in recipe.heldout.items():  # read at the very end of a run: a missing one must fail now
        if not data_path(recipe, file).is_file():
            if strict:
                findings.add(f"align/{lang}", f"held-out text {data_path(recipe, file)} does not exist; fix "
                                              f"heldout.{lang} in the recipe, or remove it (then {lang} gets no "
                                              f"alignment check)")
            else:
                findings.notes.append(f"held-out text {data_path(recipe, file)} is not here (`mm-ds run` checks it)")


def _check_task_files(recipe, root, strict: bool, findings: Findings) -> None:
    """Each task's train split (English) and evaluated split in each language, found where the run reads them: the
    task files under `root`, or the Hugging Face hub's datasets."""
    hub = is_hub(root)
    if hub:  # the dataset, config and split each (task, language) reads are known here; whether they download is not
        import importlib.util
        if importlib.util.find_spec("datasets") is None:
            findings.add("recipe", f"task_root: {HUB} loads the task data through the `datasets` package, which is "
                                   f"not installed (pip install datasets), or point task_root at the task files")
        findings.notes.append(f"task_root: {HUB}: task data is read from the Hugging Face hub through datasets at run "
                              f"time (needs a network or a populated datasets cache); the splits' names are checked, "
                              f"not that they can be fetched")
    if not hub and not root.is_dir() and not strict:
        findings.notes.append(f"task files not checked: {root} is not here (`mm-ds run` checks them before it starts)")
    else:
        for task in recipe.tasks:
            spec = get_task(task)
            split = recipe.split(task)
            if split not in spec.eval_splits:
                findings.add(f"evaluate/{task}", f"{task} has no {split!r} split (it has "
                                                 f"{', '.join(spec.eval_splits)}); set eval_splits: "
                                                 f"{{{task}: {spec.eval_splits[-1]}}}")
                continue
            wanted = [("train", "en", f"finetune/{task}")]
            wanted += [(split, lang, f"evaluate/{task}/{lang}") for lang in recipe.evaluated(task)]
            for sp, lang, where in wanted:
                try:
                    if hub:
                        hub_source(spec, sp, lang)
                    else:
                        find_local(spec, sp, lang, root)
                except TaskDataError as e:
                    findings.add(where, f"{e}; or leave {lang} out of coverage.{task}" if sp != "train" else str(e))


def _check_text_inputs(recipe, out: Path, strict: bool, findings: Findings) -> None:
    """The text inputs of each language not yet prepared in the run tree match files."""
    absent, inputs = [], 0
    for lang in [recipe.source_lang, *recipe.langs]:
        if (out / "data" / lang / PREPARED).is_file():
            continue
        for pattern in text_inputs(recipe, lang):
            inputs += 1
            if not pattern.startswith("hf:") and not glob.glob(pattern):
                absent.append((lang, pattern))
    if absent and not strict and len(absent) == inputs:
        findings.notes.append(f"text inputs not checked: none of them is here (e.g. {absent[0][1]}); `mm-ds run` "
                              f"refuses to start without them")
    else:
        for lang, pattern in absent:
            findings.add(f"prepare/{lang}", f"text input {pattern!r} matches no file; fix text.{lang} in the recipe"
                                            f"{' (or data_root)' if recipe.data_root else ''}")


# ---------------------------------------------------------------- one stage run, statically

def _stage(run, configs: dict[Path, RunConfig], findings: Findings, strict: bool) -> RunConfig | None:
    where = run.name.split("/", 1)[1]  # the run directory under --out
    try:
        cfg = run.config()
    except ConfigError as e:
        findings.add(where, str(e))
        return None
    for fn in (lambda: _launcher(cfg, findings, strict), lambda: _geometry(cfg, findings),
               lambda: _inherited(cfg, configs)):
        try:
            fn()
        except ConfigError as e:
            findings.add(where, str(e))
    return cfg


def _geometry(cfg: RunConfig, findings: Findings) -> None:
    """The engine config at the launch's world size, through DeepSpeed's parser; its batch geometry noted."""
    if cfg.launch.nodes is None and cfg.launch.hostfile:
        return  # the hostfile could not be read: the launch's problem says why
    _, geo = ds_config.resolve(cfg, cfg.launch.world_size, on_this_machine=False)
    g = f"{geo.micro_batch} x {geo.grad_accum} x {geo.world_size} = {geo.global_batch}"
    systems = findings.geometries.setdefault(cfg.stage, {}).setdefault(g, [])
    systems += [cfg.system] if cfg.system not in systems else []


def _launcher(cfg: RunConfig, findings: Findings, strict: bool) -> None:
    """Launcher settings as `launch.preflight` checks them, but no port is bound, and unless `strict` an address that
    does not resolve here is a note: the check may run on a login node. Each distinct launch once."""
    lc = cfg.launch
    key = repr(lc)
    if key not in findings.launches:
        try:
            if lc.launcher == "none" and lc.ranks != 1:
                raise ConfigError("launch.launcher=none runs a single process; set launch.ranks=1")
            if lc.launcher != "none":  # as launch.preflight, but its notes kept when a tool is missing
                notes = launch.check_addresses(lc, launch.check_hosts(lc), port=False, here=strict)
                findings.notes += [n for n in notes if n not in findings.notes]
                launch.check_tools(lc)
            findings.launches[key] = ""
        except ConfigError as e:
            findings.launches[key] = str(e)
    if findings.launches[key]:
        raise ConfigError(findings.launches[key])
    launch.resolve(lc)  # as the first of its kind was


def _inherited(cfg: RunConfig, configs: dict[Path, RunConfig]) -> None:
    """What a stage takes from its parent (the stage's own `inherit`), from the parent stage's config in the same
    plan."""
    if cfg.stage == "pretrain" or not cfg.parent:
        return
    parent = configs.get(Path(cfg.parent).resolve())
    if parent is None:
        return  # an existing run given as parent: its checkpoint is checked at launch
    stage_module(cfg.stage).inherit(cfg, Parent(parent.stage, parent.system, model_after(parent, configs),
                                                f"parent={cfg.parent}"))


def model_after(cfg: RunConfig, configs: dict[Path, RunConfig]) -> ModelConfig:
    """The model a stage hands on (its final/), from the configs alone (each stage's `hands_on`). Later stages take
    their architecture from their parent, not from their own preset."""
    if cfg.stage == "pretrain" or Path(cfg.parent).resolve() not in configs:
        return cfg.model
    return stage_module(cfg.stage).hands_on(cfg, model_after(configs[Path(cfg.parent).resolve()], configs))

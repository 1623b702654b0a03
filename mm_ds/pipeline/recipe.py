"""A recipe: what `mm-ds run` runs (systems, target languages, tasks, seeds, data, a preset per stage), and where
its run tree keeps what (task_root, MINI_DIR, the primary models): read by the pipeline that runs it and by the
evaluation and report that read its results; never by a stage, which knows only its own config.

A recipe is a packaged `presets/recipes/NAME.yaml` or a YAML file. Its stage runs are mm_ds/pipeline/stage_runs.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from ..coerce import check_numbers
from ..config import ConfigError, LaunchConfig, apply_overrides, did_you_mean, from_dict, recipe_names
from ..data.tasks import HUB, TASKS, is_hub
from ..data.world import PRESETS
from ..runtime.distributed.launch import resolve as resolve_launch
from ..systems import STAGES, SYSTEMS, SystemNameError, sort_key, system_of


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
    """Directory with the task files in the official layout (the world's, when generated), or `hub`: every
    split from the Hugging Face hub through `datasets` (needs a network or a populated datasets cache)."""
    data_root: str = ""
    """Where relative `text` inputs, `task_root` and `heldout` files start. Default: the recipe file's folder (a
    packaged recipe's: the working directory, e.g. the real recipe's ../shared/data beside the checkout); a relative
    data_root starts there too, also from `--set`. `load_recipe` makes it absolute, so that `--check`, the run and
    every rank resolve each path alike."""
    eval_examples: int | None = None
    """Evaluate on the first N examples of each evaluation file only (quick runs; the paper: all)."""
    prepare: dict = field(default_factory=dict)
    """Options of `mm-ds prepare` (vocab_size, model_type, sample_sentences, heldout). Real text gets a held-out
    slice by default (heldout: HELDOUT, for the alignment check; a generated world brings its own held-out text)."""
    presets: dict = field(default_factory=dict)
    """stage -> preset name: pretrain, build_mini, adapt, finetune."""
    overrides: dict = field(default_factory=dict)
    """stage -> list of key=value applied after the preset. `<stage>/<system>` keys apply to one system's runs
    of that stage after the stage's (e.g. adapt/bl_base: the paper checkpoints BL_BASE's Step 2 more often);
    `finetune/<task>` keys to one task's finetuning, last (tasks differ in how many updates they need)."""
    launch: dict = field(default_factory=dict)
    """launch.* overrides for every data-parallel stage (ranks, launcher, master_port), and the launch whose ranks
    run Step 3's single-device runs several at once (mm_ds/pipeline/pack.py)."""
    mode: str = "per_stage"
    """per_stage: each stage its own launch (clusters: per-stage resources, logs, retries); one_job: a
    single launch whose ranks run every stage in order (small runs, where start-up would dominate)."""
    curve: bool = False
    """Score every Step-2 checkpoint (training curves), not only the final one."""
    english_minis: bool | list[str] = False
    """Also finetune mini-models (Step 1b's final/) on the English tasks and score them in English, beside the
    primary models (§5.3, Table 5: does pretraining with a secondary head hurt either?): true for every mini-model
    system of the recipe, or a list of systems (the paper: [minijoint]; those the recipe does not run are left out)."""
    english_tasks: list[str] = field(default_factory=list)
    """Table 5's tasks: those the mini-models are finetuned and scored on in English, and english.md's columns
    (the paper: [xnli]). Empty: every task of the recipe; those the recipe does not run are left out."""
    headline_tasks: list[str] = field(default_factory=list)
    """The tasks Figure 1's headline speedup (the report's `avg` row) averages (the paper: xnli, mlqa, pawsx; XQuAD
    is in its appendix). Empty: every task of the recipe. Those the recipe does not run are left out (--check
    says so)."""
    early_checkpoints: dict | None = None
    """Which Step-2 runs keep the adapt preset's `train.checkpoint_steps` (the early checkpoints, 1000-4000 in the
    paper presets): system -> target languages. The other runs checkpoint only every `train.checkpoint_every`
    updates and at the end. The paper (footnote 3, A.4): MINIJOINT and MINIPOST in de, fr, es, zh; in the depth
    sweep only N=4. None: every run keeps them (mm-ds's default, finer than the paper's protocol)."""
    align_sequences: int = 64
    """Held-out target sequences per Step-2 checkpoint for the alignment check and the MLM-level measure
    (mm_ds/eval/align.py: MLM of the primary model with each checkpoint's embeddings, and of the mini-model;
    report/align.md, report/mlm/); 0: no check. A recipe without tasks is measured at the MLM level only."""
    heldout: dict = field(default_factory=dict)
    """lang -> held-out target text (a file Step 2 does not train on) for the alignment check, over the prepared
    corpus's held-out slice (`prepare.heldout`) or the generated world's (world/heldout/<lang>.txt)."""
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
        """Every key, in the keys' order; errors start with `where` (the recipe's name). Normalises what it checks:
        system names, english_minis, early_checkpoints, launch."""
        self._check_runs(where)
        self._check_data_sources(where)
        try:  # prepare: and world: are passed on as they are; typed here only to be checked
            check_numbers(vars(self) | {"prepare": from_dict(PrepareKeys, self.prepare, prefix="prepare."),
                                        "world": from_dict(WorldKeys, self.world or {}, prefix="world.")}, RANGES)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        bad = [lang for lang in self.heldout if lang not in self.langs]
        if bad:
            raise ConfigError(f"{where}: heldout.{bad[0]} is not a target language of the recipe ({', '.join(self.langs)})")
        for key in ("coverage", "eval_splits"):
            bad = [t for t in getattr(self, key) if t not in TASKS]
            if bad:
                raise ConfigError(f"{where}: {key}.{bad[0]} is not a task; choose from {', '.join(TASKS)}")
        for task, langs in self.coverage.items():
            if not isinstance(langs, list):
                raise ConfigError(f"{where}: coverage.{task} must be a list of languages, got {langs!r}")
        self._check_analyses(where)
        launch = resolve_launch(from_dict(LaunchConfig, self.launch, prefix="launch."))  # before any data work
        # the hostfile's node count, when it decides it, is written into every stage command
        self.launch = {k: getattr(launch, k) for k in {**self.launch, **({"nodes": 0} if launch.hostfile else {})}}
        self._check_stages(where)

    def _check_runs(self, where: str) -> None:
        """systems, tasks and target languages: what the recipe runs, and something to measure it by."""
        for s in self.systems:
            try:
                system_of(s)
            except SystemNameError as e:
                raise ConfigError(f"{where}: systems: {e}") from None
        self.systems = [system_of(s).name for s in self.systems]  # minijoint@02 -> minijoint@2: one run dir
        if len(set(self.systems)) < len(self.systems):
            raise ConfigError(f"{where}: systems lists a system twice: {self.systems}")
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"{where}: unknown task(s) {bad}{did_you_mean(bad[0], TASKS)}; choose from "
                              f"{', '.join(TASKS)}")
        if not self.langs:
            raise ConfigError(f"{where}: a recipe needs at least one target language (langs)")
        if not self.tasks and not self.align_sequences:
            raise ConfigError(f"{where}: a recipe needs a task (tasks), or the MLM-level measure (align_sequences > 0) "
                              f"to measure its target languages by")

    def _check_data_sources(self, where: str) -> None:
        """Where the data comes from: text inputs per language and task_root, or the generated world's languages."""
        if self.world is None:
            missing = [lang for lang in [self.source_lang, *self.langs] if lang not in self.text]
            if missing:
                raise ConfigError(f"{where}: no text inputs for language(s) {missing}; add them under text:")
            if self.tasks and not self.task_root:
                raise ConfigError(f"{where}: task_root is unset (the directory with the task files)")
        else:
            bad = [lang for lang in self.langs if lang not in PRESETS]
            if bad:
                raise ConfigError(f"{where}: language(s) {bad} are not generated-world languages "
                                  f"({', '.join(PRESETS)})")

    def _check_stages(self, where: str) -> None:
        """mode, a preset per stage the recipe runs, overrides that name a stage."""
        if self.mode not in ("per_stage", "one_job"):
            raise ConfigError(f"{where}: mode={self.mode!r}; use per_stage or one_job")
        for stage in ("pretrain", "adapt", *(["finetune"] if self.tasks else [])):  # no tasks, no Step 3
            if stage not in self.presets:
                raise ConfigError(f"{where}: presets.{stage} is unset")
        for k in self.overrides:
            stage, _, which = k.partition("/")
            named = which in SYSTEMS or which in self.systems or stage == "finetune" and which in TASKS
            if stage not in STAGES or which and not named:
                raise ConfigError(f"{where}: overrides.{k} names no stage; use {', '.join(STAGES)}, "
                                  f"<stage>/<system> with a system of {', '.join(SYSTEMS)} or of the recipe, or "
                                  f"finetune/<task> with a task of {', '.join(TASKS)}")
            if not isinstance(self.overrides[k], list):
                raise ConfigError(f"{where}: overrides.{k} must be a list of key=value strings")

    def _check_analyses(self, where: str) -> None:
        """headline_tasks, english_minis, english_tasks and early_checkpoints."""
        for key in ("headline_tasks", "english_tasks"):
            bad = [t for t in getattr(self, key) if t not in TASKS]
            if bad:
                raise ConfigError(f"{where}: {key}: unknown task {bad[0]!r}{did_you_mean(bad[0], TASKS)}; choose "
                                  f"from {', '.join(TASKS)}")
        for key in ("headline_tasks", "english_tasks"):  # a narrowed recipe (--set tasks=...) keeps what it runs
            if getattr(self, key) and self.tasks and not set(getattr(self, key)) & set(self.tasks):
                raise ConfigError(f"{where}: {key} {getattr(self, key)} holds no task of the recipe "
                                  f"({', '.join(self.tasks)}); set {key}=[] for every task")
        if isinstance(self.english_minis, list):
            names = []
            for s in self.english_minis:
                try:
                    names.append(system_of(s).name)
                except SystemNameError as e:
                    raise ConfigError(f"{where}: english_minis: {e}") from None
            bad = [s for s in names if not system_of(s).mini]
            if bad:
                raise ConfigError(f"{where}: english_minis: {bad[0]!r} has no mini-model; list mini-model systems "
                                  f"(those of the recipe: {', '.join(s for s in self.systems if system_of(s).mini)})")
            self.english_minis = names
        if self.early_checkpoints is None:
            return
        if not isinstance(self.early_checkpoints, dict):
            raise ConfigError(f"{where}: early_checkpoints must map systems to target languages, e.g. "
                              f"{{minijoint: [de, fr]}}, got {self.early_checkpoints!r}")
        normal = {}
        for s, langs in self.early_checkpoints.items():
            try:
                name = system_of(str(s)).name
            except SystemNameError as e:
                raise ConfigError(f"{where}: early_checkpoints.{s}: {e}") from None
            if name not in SYSTEMS and name not in self.systems:
                raise ConfigError(f"{where}: early_checkpoints.{s} is no system of the recipe "
                                  f"({', '.join(self.systems)})")
            if not isinstance(langs, list) or not all(isinstance(lang, str) for lang in langs):
                raise ConfigError(f"{where}: early_checkpoints.{s} must be a list of target languages, got {langs!r}")
            normal[name] = langs
        self.early_checkpoints = normal

    def headline(self) -> list[str]:
        """The tasks Figure 1's headline speedup averages: headline_tasks that the recipe runs, or every task."""
        return [t for t in self.headline_tasks if t in self.tasks] if self.headline_tasks else list(self.tasks)

    def early(self, system: str, lang: str) -> bool:
        """Whether the Step-2 run of `system` in `lang` keeps the early checkpoints (early_checkpoints)."""
        return self.early_checkpoints is None or lang in self.early_checkpoints.get(system, [])


@dataclass
class PrepareKeys:
    """A recipe's `prepare:`: options of `mm-ds prepare` for every language (unset: prepare's defaults)."""
    vocab_size: int | None = None
    character_coverage: float | None = None
    sample_sentences: int | None = None
    model_type: str | None = None
    seed: int | None = None
    workers: int | None = None
    spm_model: str | None = None
    heldout: float | None = None


@dataclass
class WorldKeys:
    """A recipe's `world:`: keyword arguments of mm_ds.data.world.generate_world (unset: its defaults)."""
    seed: int | None = None
    sentences: int | None = None
    target_sentences: int | None = None
    task_sizes: dict[str, int] | None = None
    compress: bool | None = None


RANGES = {
    # key: the interval its values lie in (each item, for a list; each entry, for a mapping); every number is also
    # finite (mm_ds.coerce.check_numbers). launch.* are LaunchConfig's (mm_ds.config.RANGES); the stages' keys are
    # checked where each stage's config is read.
    "seeds": "[0, inf)", "eval_examples": "[1, inf)", "align_sequences": "[0, inf)",
    "world.seed": "[0, inf)", "world.sentences": "[1, inf)", "world.target_sentences": "[1, inf)",
    "world.task_sizes": "[1, inf)",
    "prepare.vocab_size": "[6, inf)", "prepare.character_coverage": "(0, 1]", "prepare.sample_sentences": "[1, inf)",
    "prepare.seed": "[0, inf)", "prepare.workers": "[1, inf)", "prepare.heldout": "[0, 1)",
}


HELDOUT = 0.02
"""The share of each language's lines a real-text recipe holds out of training by default (`prepare.heldout`)."""


def prepare_options(recipe: Recipe) -> dict:
    """`mm-ds prepare`'s options for every language of the recipe: its `prepare`, with a held-out slice for real
    text unless it says otherwise (a generated world writes its own held-out text; its shards stay as they were)."""
    return ({} if recipe.world is not None else {"heldout": HELDOUT}) | recipe.prepare



def load_recipe(name: str, sets: list[str] = ()) -> Recipe:
    """A packaged recipe or a YAML file, with `key=value` changes (`mm-ds run --set`, `--launch`) applied."""
    path, base = Path(name), Path(name).absolute().parent  # where the recipe's relative paths start
    if not path.is_file():
        packaged = resources.files("mm_ds") / "presets" / "recipes" / f"{name}.yaml"
        if not packaged.is_file():
            raise ConfigError(f"recipe {name!r} is neither a file nor a packaged recipe "
                              f"({', '.join(recipe_names())}){did_you_mean(name, recipe_names())}")
        path, base = Path(str(packaged)), Path.cwd()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path} must hold a mapping of keys, got {type(data).__name__}")
    recipe = from_dict(Recipe, apply_overrides(data, list(sets)))
    recipe.check(str(path) + (f" with {' '.join(sets)}" if sets else ""))
    recipe.data_root = os.path.abspath(base / recipe.data_root)
    return recipe


MINI_DIR = "mini"
"""OUT/finetune/mini/<system>/: the finetuned mini-models (english_minis); no primary model is called mini."""


def minis_in_english(recipe: Recipe) -> list[str]:
    """The systems whose mini-model is finetuned and scored in English (Table 5)."""
    if isinstance(recipe.english_minis, list):  # those of the recipe (a narrowed one may have left some out)
        return [s for s in recipe.systems if s in recipe.english_minis]
    return [s for s in recipe.systems if system_of(s).mini] if recipe.english_minis else []


def english_tasks(recipe: Recipe) -> list[str]:
    """Table 5's tasks: those the mini-models are finetuned and scored on in English."""
    return [t for t in recipe.tasks if t in recipe.english_tasks] if recipe.english_tasks else list(recipe.tasks)


def primaries(recipe: Recipe) -> list[str]:
    return sorted({system_of(s).primary for s in recipe.systems}, key=sort_key)


def task_root(recipe: Recipe, out: Path) -> Path:
    """Where the stages read task data: a directory, or Path(HUB) for the hub (`is_hub`)."""
    if recipe.world is not None:
        return out / "world"
    if is_hub(recipe.task_root):
        return Path(HUB)
    root = data_path(recipe, recipe.task_root)
    return root.absolute() if is_hub(root) else root  # a directory called hub (task_root: ./hub) stays one


def data_path(recipe: Recipe, path: str) -> Path:
    """A path of the recipe's data: relative ones start at data_root."""
    return Path(recipe.data_root or ".") / path if not Path(path).is_absolute() else Path(path)


def text_inputs(recipe: Recipe, lang: str) -> list[str]:
    return [i if i.startswith("hf:") else str(data_path(recipe, i)) for i in recipe.text.get(lang, [])]

"""A recipe's data, apart from its GPU stages: `mm-ds run RECIPE --only prepare --out OUT`.

`mm-ds run` prepares every language of the recipe (`mm-ds prepare`: a SentencePiece model and token shards under
OUT/data/LANG, or the generated world under OUT/world) before its first stage, on the machine it runs on. On a
cluster that machine holds the GPU allocation, idle meanwhile: `--only prepare` does that part alone, as a CPU job
before the allocation (`--lang L`, repeatable: only those languages, so that a job per language can run them side by
side), and `mm-ds run` then finds every language complete and starts the GPU stages at once. It is idempotent: a
language whose OUT/data/LANG/meta.json exists is skipped (prepare publishes the directory whole, meta.json last),
an interrupted one starts over. `--only prepare --check` lists what it would prepare and checks that the text
inputs are there and OUT can be written; it needs neither the task files nor anything of the GPU stages (the whole
recipe's check is `--check`). `mm-ds plan` estimates the time (mm_ds/tools/plan/budget.py).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

from ..config import ConfigError
from ..data.world import generate_world
from ..runtime.checkpointing.checkpoint import unwritable
from ..runtime.checkpointing.rundir import logs_dir
from .check import PREPARED, Findings
from .progress import run_logged, say
from .recipe import Recipe, prepare_options, text_inputs
from .stage_runs import stage_configs


def world_complete(world: Path) -> bool:
    """world.json is written last and lists every file: trust a world only when it parses and they exist."""
    try:
        manifest = json.loads((world / "world.json").read_text())
        return all((world / f).is_file() for f in manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def languages(recipe: Recipe, only: list[str] | None = None) -> list[str]:
    """The recipe's languages to prepare (source first), or `only` of them; ConfigError naming one it lacks."""
    langs = [recipe.source_lang, *recipe.langs]
    bad = [lang for lang in only or [] if lang not in langs]
    if bad:
        raise ConfigError(f"--lang {bad[0]}: the recipe prepares {', '.join(langs)}")
    return [lang for lang in langs if not only or lang in only]


def prepared(out: Path, lang: str) -> bool:
    return (out / "data" / lang / PREPARED).is_file()


def prepare_data(recipe: Recipe, out: Path, only: list[str] | None = None) -> None:
    """Every language of the recipe (or `only` those) that is not prepared yet, one after another; each `mm-ds
    prepare` uses every core of this machine. Its output goes to OUT/logs/prepare_LANG.log."""
    if recipe.world is not None and not world_complete(out / "world"):
        generate_world(out / "world", languages=tuple(recipe.langs), **recipe.world)
    opts = []
    for k, v in prepare_options(recipe).items():
        opts += [f"--{k.replace('_', '-')}", str(v)]
    lens = block_lengths(recipe, out)
    for lang in languages(recipe, only):
        if prepared(out, lang):
            print(f"[mm-ds run] skip prepare {lang}: complete", flush=True)
            continue
        inputs = [str(out / "world" / "text" / f"{lang}.txt")] if recipe.world is not None else text_inputs(recipe, lang)
        args = ["prepare", "--lang", lang, "--out", str(out / "data" / lang),
                "--seq-len", *map(str, lens.get(lang, []))]
        for i in inputs:
            args += ["--input", i]
        say(f"$ mm-ds {' '.join(args + opts)}")
        run_logged([sys.executable, "-m", "mm_ds.cli", *args, *opts], logs_dir(out) / f"prepare_{lang}.log")


def block_lengths(recipe: Recipe, out: Path) -> dict[str, list[int]]:
    """Language -> the MLM block lengths (`data.seq_len`) of the recipe's stages that read its corpus: prepare packs
    those (mm_ds/data/blocks.py), and only those, so that no stage's rank 0 packs at its start."""
    lens: dict[str, set[int]] = {}
    for cfg in stage_configs(recipe, out).values():
        if cfg.data.corpus and cfg.stage != "finetune":
            lens.setdefault(Path(cfg.data.corpus).name, set()).add(cfg.data.seq_len)
    return {lang: sorted(v) for lang, v in lens.items()}


def findings(recipe: Recipe, out: Path, only: list[str] | None = None) -> tuple[Findings, list[str], int]:
    """(what stops `--only prepare`, a line per language: complete, or its inputs and their size, how many of
    them are to prepare)."""
    report, lines, todo = Findings(), [], 0
    if problem := unwritable(out):
        report.add("--out", problem)
    if recipe.world is not None:
        lines.append(f"  world: {'complete' if world_complete(out / 'world') else 'to generate'} ({out / 'world'})")
    for lang in languages(recipe, only):
        if prepared(out, lang):
            lines.append(f"  {lang}: complete ({out / 'data' / lang})")
            continue
        todo += 1
        if recipe.world is not None:
            lines.append(f"  {lang}: from the generated world -> {out / 'data' / lang}")
            continue
        found = []
        for pattern in text_inputs(recipe, lang):
            files = [] if pattern.startswith("hf:") else sorted(glob.glob(pattern))
            if not files and not pattern.startswith("hf:"):
                report.add(f"prepare/{lang}", f"text input {pattern!r} matches no file; fix text.{lang} in the recipe"
                                              f"{' (or data_root)' if recipe.data_root else ''}")
            found += [f"{f} ({_size(os.path.getsize(f))})" for f in files] or [
                f"{pattern} ({'streamed' if pattern.startswith('hf:') else 'missing'})"]
        lines.append(f"  {lang}: {', '.join(found)} -> {out / 'data' / lang}")
    return report, lines, todo


def _size(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def only_prepare(recipe: Recipe, name: str, out: Path, only: list[str] | None, check: bool) -> int:
    """`mm-ds run RECIPE --only prepare [--check]`."""
    report, lines, todo = findings(recipe, out, only)
    head = (f"{len(report.problems)} problem(s):" if report.problems else
            f"ok: {todo} language(s) to prepare" if check else f"{todo} language(s) to prepare")
    problems = report.format().splitlines()[1:] if report.problems else []
    print("\n".join([f"mm-ds run {name} --only prepare{' --check' if check else ''}: {head}", *problems, *lines]))
    if check or report.problems:
        return 1 if report.problems else 0
    prepare_data(recipe, out, only)
    say(f"data ready in {out}: `mm-ds run {name} --out {out}` starts with the GPU stages")
    return 0

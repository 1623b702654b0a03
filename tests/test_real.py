"""The real-language recipe (`mm-ds run real`) in miniature, on real text from ../shared/data (skipped without it):
English and two of its target languages (German, Arabic) cut to their first lines, tiny models, a few updates. Checks what the recipe
is for: held-out slices kept out of training, every system's Step-2 curve scored at the MLM level, and the MLM-level
tables (Tables 2 and 3 with their significance margins, Figure 3, speedups) and the English-vs-unigram table written,
with no task data at all."""
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mm_ds
from mm_ds.pipeline.recipe import load_recipe

PACKAGED = Path(mm_ds.__file__).parent / "presets" / "recipes"

TINY = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_size=64", "model.num_layers=3", "data.seq_len=32"]
LINES = {"en": 2000, "de": 1000, "ar": 1000}


@pytest.fixture(scope="module")
def mini_real(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("real")
    recipe = yaml.safe_load((PACKAGED / "real.yaml").read_text())
    for lang, n in LINES.items():  # the first lines of each language's real text
        with lzma.open(shared_data / "text" / f"{lang}.txt.xz", "rt", encoding="utf-8") as f:
            (root / f"{lang}.txt").write_text("".join(next(f) for _ in range(n)), encoding="utf-8")
    recipe |= {"langs": ["de", "ar"], "text": {lang: [str(root / f"{lang}.txt")] for lang in LINES}, "data_root": str(shared_data),
               "prepare": {"vocab_size": 400, "sample_sentences": 2000, "heldout": 0.05}, "align_sequences": 8,
               "launch": {"ranks": 1, "launcher": "none"},
               "overrides": {"pretrain": [*TINY, "train.steps=8", "train.warmup_steps=2"],  # 3 layers; below, the
                             "pretrain/bl_small": ["model.num_layers=1"],  # paper's shape at this depth
                             "pretrain/minijoint": ["model.secondary_head_layer=1"],
                             "build_mini": ["mini.layers=1", "mini.new_layers=1", "train.steps=4",
                                            "train.warmup_steps=1"],
                             "adapt": ["data.seq_len=32", "train.steps=6", "train.warmup_steps=1",
                                       "train.checkpoint_steps=[3]"]}}
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    out = root / "run"
    proc = subprocess.run([sys.executable, "-m", "mm_ds.cli", "run", str(root / "recipe.yaml"), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, proc.stdout


def test_the_packaged_recipe_is_three_families_and_scripts_without_tasks():
    recipe = load_recipe("real")
    assert recipe.langs == ["de", "sw", "ar"] and recipe.tasks == [] and recipe.align_sequences > 0
    assert sorted(recipe.systems) == ["bl_base", "bl_small", "minijoint", "minipost"]


@pytest.mark.ranks
def test_heldout_slices_are_prepared_and_kept_out_of_training(mini_real):
    out, _ = mini_real
    for lang in LINES:
        meta = json.loads((out / "data" / lang / "meta.json").read_text())
        held = (out / "data" / lang / "heldout.txt").read_text(encoding="utf-8").splitlines()
        assert meta["heldout"]["fraction"] == 0.05 and meta["heldout"]["lines"] == len(held) > 0
        assert meta["num_lines"] + len(held) <= LINES[lang]


@pytest.mark.ranks
def test_every_systems_step2_curve_is_scored_at_the_mlm_level(mini_real):
    out, stdout = mini_real
    rows = [json.loads(line) for line in (out / "align.jsonl").read_text().splitlines()]
    target = {(r["system"], r["lang"], r["step"]) for r in rows if r["kind"] == "target"}
    assert target == {(s, lang, st) for s in ("bl_base", "bl_small", "minijoint", "minipost")
                      for lang in ("de", "ar") for st in (0, 3, 6)}
    assert all(0 <= r["step_bias_acc"] <= 1 and 0 <= r["unigram_acc"] <= 1 and r["targets"] > 0 and r["fit_sequences"]
               for r in rows if r["kind"] == "target")
    source = [r for r in rows if r["kind"] == "source"]
    assert {(r["system"], r["model"], r["layers"]) for r in source} == {
        ("bl_base", "primary", 3), ("bl_small", "primary", 1), ("minijoint", "primary", 3),
        ("minijoint", "mini-model", 1), ("minipost", "mini-model", 2)}
    assert all(r["lang"] == "en" and r["unigram_acc"] is not None for r in source)
    (two,) = [r for r in source if r.get("head_cosine") is not None]  # MINIJOINT's primary: its two heads
    assert two["system"] == "minijoint" and -1 <= two["head_cosine"] <= 1 and 0 <= two["secondary_bias_acc"] <= 1
    assert not (out / "results.md").exists() and "At the MLM level" in stdout


@pytest.mark.ranks
def test_the_mlm_level_tables_and_curves_come_out(mini_real):
    out, _ = mini_real
    tables = (out / "report" / "mlm" / "tables.md").read_text()
    assert "## mlm: performance at training completion (Table 2)" in tables
    assert "## mlm: does BL_BASE beat its control?" in tables and "needed (5%, one-sided)" in tables
    for lang in ("de", "ar"):
        assert f"| {lang} |" in tables
    assert (out / "report" / "mlm" / "curves_mlm.png").stat().st_size > 0
    assert json.loads((out / "report" / "mlm" / "report.json").read_text())["over_control"] is True
    align = (out / "report" / "align.md").read_text()
    assert "Against frequencies" in align and "beside a unigram predictor" in align and "mean outputs" in align
    assert "| unigram | - | - |" in tables  # the baseline row of the MLM-level Table 2

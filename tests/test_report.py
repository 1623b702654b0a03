import csv
import json

import pytest

from mm_ds.model.flops import EXA, V100_DAY_FLOPS, stage_flops_per_step
from mm_ds.report import command, records
from mm_ds.report import report as R


def curve(scores, steps=None, system="S", task="xnli", lang="ar", days_per_step=1e-4):
    """A curve with days proportional to steps (as for a fixed-cost Step 2)."""
    steps = steps or [5000 * (i + 1) for i in range(len(scores))]
    return [records.Result(system, task, lang, st, st * days_per_step * V100_DAY_FLOPS, st * days_per_step, sc)
            for st, sc in zip(steps, scores)]


# --- time to target -------------------------------------------------------------------------------------------

def test_interpolates_between_bracketing_checkpoints():
    # §3's example: 48 at 5,000 and 52 at 10,000 -> 50 at 7,500.
    c = R.time_to_target(curve([40, 48, 52, 60], steps=[1000, 5000, 10000, 20000]), 50)
    assert c.reached and c.estimate.step == pytest.approx(7500)
    assert c.estimate.v100_days == pytest.approx(0.75) and c.estimate.flops == pytest.approx(0.75 * V100_DAY_FLOPS)
    assert (c.lower.step, c.upper.step) == (5000, 10000)


def test_paper_section3_example_with_the_paper_costs():
    # MINIPOST (A3, 6 layers): 48 at 5,000 (~1.17 EFLOPs) and 52 at 10,000 (~2.34) -> 50 at 7,500 (~1.76).
    per_step = stage_flops_per_step("adapt", hidden=768, vocab=50_000, layers=6, seq_len=512, mask_prob=0.15,
                                    global_batch=2048)
    pts = [records.Result("MINIPOST", "xnli", "ar", st, st * per_step, st * per_step / V100_DAY_FLOPS, sc)
           for st, sc in [(5000, 48), (10000, 52)]]
    c = R.time_to_target(pts, 50)
    assert c.estimate.step == pytest.approx(7500)
    assert c.estimate.flops / EXA == pytest.approx(1.76, abs=0.005)


def test_exact_hit_is_that_checkpoint():
    c = R.time_to_target(curve([40, 50, 60]), 50)
    assert c.estimate.step == 10000 and (c.lower.step, c.upper.step) == (5000, 10000)
    # 0.95·80 is not exactly 76 in floating point; the checkpoint at 76 still counts as a hit.
    assert R.time_to_target(curve([70, 76]), 0.95 * 80).estimate.step == 10000


def test_never_reached():
    c = R.time_to_target(curve([40, 45, 49.9]), 50)
    assert not c.reached and c.estimate is None and c.lower is None and c.upper is None


def test_non_monotone_curve_uses_first_crossing():
    c = R.time_to_target(curve([40, 60, 45, 70]), 50)  # crosses at 5k..10k, dips, crosses again
    assert c.estimate.step == pytest.approx(7500)
    assert (c.lower.step, c.upper.step) == (5000, 10000)


def test_target_at_first_checkpoint_is_bracketed_from_zero():
    c = R.time_to_target(curve([55, 60]), 50)
    assert c.estimate.step == 5000 and c.estimate.v100_days == pytest.approx(0.5)
    assert (c.lower.step, c.lower.v100_days, c.upper.step) == (0, 0, 5000)


def test_unsorted_input_is_sorted_by_step():
    c = R.time_to_target(list(reversed(curve([48, 52]))), 50)
    assert c.estimate.step == pytest.approx(7500)


# --- targets and speedups -------------------------------------------------------------------------------------

def test_target_is_fraction_of_reference_final_not_its_best():
    res = curve([50, 80, 70], system="BL_BASE") + curve([70], system="MINIJOINT")
    rep = R.build_report(res)
    assert rep.targets[("xnli", "ar")] == pytest.approx(0.95 * 70)  # last checkpoint, not the 80 peak
    assert rep.crossings[("xnli", "ar", "MINIJOINT")].estimate.step == 5000


def two_lang_results():
    # Targets 95% of BL_BASE's final 100 = 95, which BL_BASE hits exactly at 10k (1.0 day) in ar and de.
    # MINIJOINT: ar at its first checkpoint, 1k (0.1 days) -> ratio 10; de at 10k (1.0 day) -> ratio 1.
    # Mean of ratios = 5.5, ratio of means = 1.0 / 0.55 ≈ 1.82: footnote 6's distinction.
    base = curve([0, 95, 100], system="BL_BASE", lang="ar") + curve([0, 95, 100], system="BL_BASE", lang="de")
    mj = curve([95, 100], steps=[1000, 10000], system="MINIJOINT", lang="ar") + \
        curve([0, 95], steps=[5000, 10000], system="MINIJOINT", lang="de")
    return base + mj


def test_speedup_is_mean_of_ratios_not_ratio_of_means():
    rep = R.build_report(two_lang_results())
    s = next(r for r in rep.speedup_summary if r["task"] == "xnli" and r["system"] == "MINIJOINT")
    assert s["mean_speedup"] == pytest.approx(5.5)
    assert s["ratio_of_mean_days"] == pytest.approx(1.0 / 0.55)
    avg = next(r for r in rep.speedup_summary if r["task"] == "avg" and r["system"] == "MINIJOINT")
    assert avg["mean_speedup"] == pytest.approx(5.5)


def test_headline_averages_task_means():
    res = two_lang_results()
    res += curve([0, 95, 100], system="BL_BASE", task="pawsx", lang="de")
    res += curve([95], steps=[5000], system="MINIJOINT", task="pawsx", lang="de")  # 1.0 / 0.5 = 2
    rep = R.build_report(res)
    by = {(r["task"], r["system"]): r for r in rep.speedup_summary}
    assert by[("pawsx", "MINIJOINT")]["mean_speedup"] == pytest.approx(2.0)
    assert by[("avg", "MINIJOINT")]["mean_speedup"] == pytest.approx((5.5 + 2.0) / 2)


def test_headline_averages_only_the_headline_tasks():
    """Figure 1 averages XNLI, MLQA and PAWS-X, not XQuAD (appendix): `headline_tasks` picks; the tables say which."""
    res = two_lang_results()
    res += curve([0, 95, 100], system="BL_BASE", task="pawsx", lang="de")
    res += curve([95], steps=[5000], system="MINIJOINT", task="pawsx", lang="de")  # 2.0
    rep = R.build_report(res, headline_tasks=["xnli", "mlqa"])
    by = {(r["task"], r["system"]): r for r in rep.speedup_summary}
    assert by[("pawsx", "MINIJOINT")]["mean_speedup"] == pytest.approx(2.0)  # still reported per task
    assert by[("avg", "MINIJOINT")]["mean_speedup"] == pytest.approx(5.5)  # xnli's alone
    assert by[("avg", "MINIJOINT")]["n_tasks"] == 1 and by[("avg", "MINIJOINT")]["tasks"] == "xnli"
    assert rep.headline == ["xnli"] and "the headline, avg, averages xnli)" in R.format_tables(rep)
    assert any("headline tasks without results: mlqa" in w for w in rep.warnings)
    assert R.build_report(res).headline == ["pawsx", "xnli"]  # default: every task


def test_never_reaching_language_is_excluded_and_reported():
    res = two_lang_results() + curve([0, 95, 100], system="BL_BASE", lang="tr") + \
        curve([10, 20], steps=[5000, 10000], system="MINIJOINT", lang="tr")
    rep = R.build_report(res)
    s = next(r for r in rep.speedup_summary if r["task"] == "xnli" and r["system"] == "MINIJOINT")
    assert s["mean_speedup"] == pytest.approx(5.5) and s["n_langs"] == 2
    assert s["excluded"] == {"tr": "MINIJOINT never reaches the target"}
    assert any("leaves out 1 language(s): tr" in w for w in rep.warnings)
    row = next(r for r in R.table3(rep)["xnli"] if r["system"] == "MINIJOINT")
    assert row["days"]["tr"] is None and row["avg_partial"]
    assert "| MINIJOINT | 0.1 | 1.0 | ∞ | 0.6* |" in R.format_tables(rep)
    # Table A4's brackets: ar hit at the first checkpoint (0-0.1), de exactly at 10k (0.5-1.0)
    assert "| MINIJOINT | 0.1 (0.0-0.1) | 1.0 (0.5-1.0) | ∞ | 0.6* |" in R.format_tables(rep, bounds=True)


# --- bad input ------------------------------------------------------------------------------------------------

def test_bad_records_are_skipped_with_named_reasons():
    good = dict(system="BL_BASE", task="xnli", lang="ar", step=5000, flops=1e18, v100_days="", score=70)
    raw = [good,
           {**good, "step": 10000, "score": ""},
           {**good, "step": 10000, "score": None},
           {**good, "lang": ""},
           {**good, "step": "ten"},
           {**good, "flops": None, "v100_days": None},
           {**good, "step": 10000, "flops": None, "v100_days": 2.0, "score": 71}]
    res, warns = records.clean_records(raw, source="r.json")
    assert len(res) == 2
    assert res[0].v100_days == pytest.approx(1e18 / V100_DAY_FLOPS)  # filled from flops
    assert res[1].flops == pytest.approx(2.0 * V100_DAY_FLOPS)  # filled from days
    text = "\n".join(warns)
    assert "missing score: 2 record(s) skipped (r.json#2, r.json#3)" in text
    assert "missing lang" in text and "not a number: 'ten'" in text and "missing both flops and v100_days" in text


def test_missing_reference_for_a_language_keeps_the_rest():
    res = two_lang_results() + curve([50, 60], system="MINIJOINT", lang="hi")  # no BL_BASE for hi
    rep = R.build_report(res)
    assert ("xnli", "hi") not in rep.targets
    assert any("xnli/hi: no BL_BASE results" in w for w in rep.warnings)
    s = next(r for r in rep.speedup_summary if r["task"] == "xnli" and r["system"] == "MINIJOINT")
    assert s["mean_speedup"] == pytest.approx(5.5) and s["excluded"] == {"hi": "no BL_BASE results"}
    t2 = next(r for r in R.table2(rep)["xnli"] if r["system"] == "MINIJOINT")
    assert t2["scores"]["hi"] == 60  # Table 2 still shows it
    assert next(r for r in R.table3(rep)["xnli"] if r["system"] == "MINIJOINT")["days"]["hi"] == "n/a"


def test_a_reference_that_does_not_beat_its_control_sets_no_target(tmp_path):
    """BL_BASE at 38.7 where untrained embeddings score 52.0 learned nothing: 95% of it is no near-maximal
    performance, so that language gets no target (a run's control rows come through results.jsonl)."""
    res = curve([30, 38.7], system="BL_BASE", lang="t2") + curve([40, 45], system="MINIJOINT", lang="t2")
    res += curve([60, 90], system="BL_BASE", lang="t1") + curve([80, 90], system="MINIJOINT", lang="t1")
    rows = [dict(condition="adapted", system=r.system, task=r.task, lang=r.lang, step=r.step, flops=r.flops,
                 v100_days=r.v100_days, score=r.score) for r in res]
    rows += [dict(condition="control", system="bl_base", task="xnli", lang=l, step=0, score=52.0) for l in ("t1", "t2")]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    controls = {}
    got, _ = records.load_results([tmp_path / "results.jsonl"], controls)
    assert {k: c.score for k, c in controls.items()} == {("xnli", "t1", "BL_BASE"): 52.0, ("xnli", "t2", "BL_BASE"): 52.0}
    old = [{("kind" if k == "condition" else k): v for k, v in r.items()} for r in rows]  # results files before the rename
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    old_controls = {}
    assert records.load_results([tmp_path / "old.jsonl"], old_controls)[0] == got and old_controls == controls
    rep = R.build_report(got, controls=controls)
    assert ("xnli", "t2") not in rep.targets and ("xnli", "t1") in rep.targets
    assert any("xnli/t2: BL_BASE's final score 38.7 does not beat its control 52.0" in w for w in rep.warnings)
    assert any("xnli/t1: no example count" in w and "could not be tested" in w for w in rep.warnings)
    assert next(r for r in R.table3(rep)["xnli"] if r["system"] == "MINIJOINT")["days"]["t2"] == "n/a"
    s = next(r for r in rep.speedup_summary if r["task"] == "xnli" and r["system"] == "MINIJOINT")
    assert s["excluded"] == {"t2": "no target: BL_BASE did not beat its control significantly"}
    assert ("xnli", "t2") in R.build_report(got).targets  # without the controls, the paper's rule alone


def test_missing_reference_system_entirely():
    rep = R.build_report(curve([50, 60], system="MINIJOINT"))
    assert not rep.targets and not rep.speedup_summary
    assert any("no results for the reference system 'BL_BASE'" in w for w in rep.warnings)
    assert "MINIJOINT" in R.format_tables(rep)


def test_duplicate_checkpoints_are_averaged_with_warning():
    res = curve([50], system="BL_BASE") + curve([60], system="BL_BASE")
    rep = R.build_report(res)
    assert rep.curves[("xnli", "ar", "BL_BASE")][0].score == 55
    assert any("2 records for one checkpoint" in w for w in rep.warnings)


def test_unreadable_and_malformed_files(tmp_path):
    (tmp_path / "a.csv").write_text("system,task,lang,step,score\nBL_BASE,xnli,ar,5000,70\n")
    (tmp_path / "b.json").write_text("{not json")
    (tmp_path / "c.txt").write_text("")
    res, warns = records.load_results([tmp_path / n for n in ("a.csv", "b.json", "c.txt", "missing.csv")])
    text = "\n".join(warns)
    assert "a.csv: no column flops and v100_days" in text
    assert "b.json: invalid JSON" in text and "unsupported file type '.txt'" in text
    assert "cannot read results file" in text
    assert res == []  # the row had no cost; skipped, named
    assert "missing both flops and v100_days" in text


# --- files ----------------------------------------------------------------------------------------------------

def write_results(path, results):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=records.FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow(r.__dict__)


def test_main_writes_tables_csv_json_and_pngs(tmp_path, capsys):
    res = two_lang_results() + curve([60, 70], system="MINIPOST", lang="ar")
    write_results(tmp_path / "results.csv", res)
    (tmp_path / "more.jsonl").write_text(json.dumps(dict(system="BL_BASE", task="xnli", lang="de", step=20000,
                                                         flops=None, v100_days=2.0, score=None)) + "\n")
    out = tmp_path / "out"
    assert command.main([str(tmp_path / "results.csv"), str(tmp_path / "more.jsonl"), "--out", str(out)]) == 0
    for name in ("tables.md", "report.json", "warnings.txt", "curves.csv", "final_scores.csv",
                 "time_to_target.csv", "speedups.csv", "speedup_summary.csv",
                 "curves_avg.png", "curves_xnli.png", "speedup.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "curves_avg.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((out / "report.json").read_text())
    mj = next(r for r in doc["speedup_summary"] if r["task"] == "xnli" and r["system"] == "MINIJOINT")
    assert mj["mean_speedup"] == pytest.approx(5.5)
    assert any("missing score" in w for w in doc["warnings"])
    rows = list(csv.DictReader(open(out / "time_to_target.csv")))
    mp = next(r for r in rows if r["system"] == "MINIPOST")
    assert mp["reached"] == "False" and mp["v100_days"] == ""
    captured = capsys.readouterr()
    assert "| MINIJOINT |" in captured.out and "missing score" in captured.err


def test_main_without_usable_records(tmp_path, capsys):
    (tmp_path / "r.json").write_text("[]")
    assert command.main([str(tmp_path / "r.json"), "--out", str(tmp_path / "o")]) == 2
    assert "no usable records" in capsys.readouterr().err


def test_curves_averaged_over_languages_get_a_target_line_only_when_every_language_has_a_target():
    from matplotlib.figure import Figure

    from mm_ds.report.plots import target_line

    res = curve([60, 90], system="BL_BASE", lang="t1") + curve([30, 38.7], system="BL_BASE", lang="t2")
    controls = {("xnli", "t2", "BL_BASE"): records.Result("BL_BASE", "xnli", "t2", 0, 0.0, 0.0, 52.0)}

    def drawn(rep):
        ax = Figure().subplots()
        target_line(ax, rep, "xnli")
        return [(list(line.get_ydata()), line.get_label()) for line in ax.lines]

    assert drawn(R.build_report(res)) == [([pytest.approx(0.95 * (90 + 38.7) / 2)] * 2, "target (mean over langs)")]
    assert drawn(R.build_report(res, controls=controls)) == [([], "no mean target: none for t2")]


# --- one Table 2, captioned ------------------------------------------------------------------------------------

def run_rows(seeds=2):
    """Rows as `mm-ds run` writes results.jsonl: adapted curves, a control per language, the source score."""
    rows = []
    for system, scores in (("minipost", [88, 95]), ("bl_base", [60, 90])):  # not in table order
        for task in ("xnli", "pawsx"):
            rows.append(dict(condition="source", system=system, task=task, lang="en", step=0, flops=0.0, v100_days=0.0,
                             score=99.0, seeds=seeds, split="test"))
            for lang in ("t1", "t2"):
                rows += [dict(condition="adapted", system=system, task=task, lang=lang, step=st, flops=st * 1e15,
                              v100_days=st * 1e-3, score=sc, seeds=seeds, split="test")
                         for st, sc in zip((100, 200), scores)]
                rows.append(dict(condition="control", system=system, task=task, lang=lang, step=0, flops=0.0,
                                 v100_days=0.0, score=50.5, seeds=seeds, split="test"))
    return rows


def test_results_md_and_the_reports_tables_show_the_same_captioned_table2(tmp_path):
    from mm_ds.pipeline.recipe import Recipe
    from mm_ds.pipeline.run import results_table

    recipe = Recipe(systems=["bl_base", "minipost"], langs=["t1", "t2"], tasks=["xnli", "pawsx"], world={"seed": 0})
    text, rep = results_table(recipe, run_rows(), tmp_path)
    R.write_report(rep, tmp_path / "report", plots=False)
    results_md, tables_md = (tmp_path / "results.md").read_text(), (tmp_path / "report" / "tables.md").read_text()
    assert results_md == text + "\n"
    blocks = ["## " + b.strip() for b in results_md.split("## ") if b.strip()]
    assert len(blocks) == 2 and all(b in tables_md for b in blocks)  # the same text, caption included
    xnli = blocks[[b.startswith("## xnli") for b in blocks].index(True)]
    assert ("xnli: accuracy (%), mean over 2 finetuning seeds; chance 50.0 (always the most frequent label, on the "
            "generated world's test files). ctrl = the same finetuned model with the untrained target embeddings"
            in xnli)
    assert "| system | Step-2 EFLOPs | V100-days | en | t1 | t2 | avg |" in xnli
    assert "| BL_BASE | 0.2 | 0.2 | 99.0 | 90.0 (ctrl 50.5) | 90.0 (ctrl 50.5) | 90.0 |" in xnli
    assert xnli.index("| BL_BASE |") < xnli.index("| MINIPOST |")  # the reference first, then the paper's order


def test_captions_give_the_official_or_the_worlds_chance_and_the_seeds(tmp_path, capsys):
    rows = run_rows(seeds=5)
    rows += [dict(r, task="xquad") for r in rows if r["task"] == "xnli"]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert command.main([str(tmp_path / "results.jsonl"), "--out", str(tmp_path / "official"), "--no-plots"]) == 0
    tables = (tmp_path / "official" / "tables.md").read_text()
    assert "xnli: accuracy (%), mean over 5 finetuning seeds; chance 33.3 (always the most frequent label, on " \
           "the official test files)" in tables
    assert "pawsx: accuracy (%), mean over 5 finetuning seeds; chance 55.3" in tables
    assert "xquad: F1 (SQuAD v1.1 evaluation), mean over 5 finetuning seeds; chance 0.0 (F1 floor" in tables
    assert "xnli: V100-days of Step 2 until the accuracy (%) (mean over 5 finetuning seeds) first reaches 95% of " \
           "BL_BASE's final score" in tables
    assert "| xnli | MINIPOST | 1.85x | 2/2 langs, 5 seeds |" in tables
    margins = tables[tables.index("## xnli: does BL_BASE beat its control?"):].split("\n\n")
    assert margins[1] == (  # the margin table's caption, then the table
        "xnli: accuracy (%) of BL_BASE's last checkpoint and its ctrl, mean over 5 finetuning seeds; chance 33.3 "
        "(always the most frequent label, on the official test files). ctrl = the same finetuned model with the "
        "untrained target embeddings Step 2 starts from (its score before Step 2 learns anything). needed: the "
        "difference the test calls significant for the n test examples and the seeds; target: 95% of BL_BASE's "
        "final score, set only where the difference is larger.")
    assert margins[2].startswith("| lang | reference final | ctrl | difference | needed (5%, one-sided) |")
    assert "xquad: F1 (SQuAD v1.1 evaluation) of BL_BASE's last checkpoint and its ctrl, mean over 5 finetuning " \
           "seeds; chance 0.0 (F1 floor" in tables
    (tmp_path / "world").mkdir()
    (tmp_path / "world" / "world.json").write_text("{}")  # as `mm-ds run` leaves it beside results.jsonl
    assert command.main([str(tmp_path / "results.jsonl"), "--out", str(tmp_path / "world_out"), "--no-plots"]) == 0
    world = (tmp_path / "world_out" / "tables.md").read_text()
    assert "chance 50.0 (always the most frequent label, on the generated world's test files)" in world
    assert "pawsx: accuracy (%) of BL_BASE's last checkpoint and its ctrl, mean over 5 finetuning seeds; chance " \
           "50.0 (always the most frequent label, on the generated world's test files). ctrl = " in world
    rep = R.build_report(curve([50, 60], system="BL_BASE"))  # your own records: no seeds, no control, no source
    table = R.format_table2(rep, "xnli")
    assert "finetuning seeds not recorded" in table and "ctrl" not in table and "| 60.0 |" in table


def align_rows():
    """The alignment check's rows (mm_ds/eval/align.py) of two systems in two languages: no task data, no seeds."""
    rows = []
    for system, accs in (("bl_base", (0.05, 0.30, 0.45)), ("minijoint", (0.05, 0.44, 0.46))):
        for lang, targets in (("de", 3000), ("sw", 2500)):
            rows += [dict(kind="target", system=system, lang=lang, step=st, flops=st * 1e12, v100_days=st * 1e-6,
                          primary_acc=acc, targets=targets, unigram_acc=0.04) for st, acc in zip((0, 100, 200), accs)]
    return rows + [dict(kind="source", system="bl_base", model="primary", lang="en", acc=0.4)]


def test_the_mlm_levels_captions_say_what_its_scores_are_not_a_finetuned_tasks(tmp_path):
    from mm_ds.report import plots

    rep, _ = R.mlm_report(align_rows(), tmp_path, plots=False)
    tables = (tmp_path / R.MLM_DIR / "tables.md").read_text()
    blocks = tables.split("\n\n")
    captions = [b for b in blocks if b.startswith("mlm: ")]
    assert len(captions) == 3  # Table 2, the margins, Table 3
    for c in captions:  # each says the metric, the one run behind a score, n, what ctrl is, what to read it against
        assert "held-out target-language MLM accuracy (%)" in c
        assert "one Step-2 run per system and language, no finetuning, no seeds" in c
        assert "the same masked held-out tokens at every checkpoint: de 3000, sw 2500" in c
        assert "the primary model with the untrained target embeddings Step 2 starts from (step 0" in c
        assert "no chance level: read a score against its control (ctrl) and against the unigram row" in c
    table2, margins, table3 = captions
    assert table2.startswith("mlm: held-out target-language MLM accuracy (%) of the primary model with the Step-2 "
                             "checkpoint's embeddings swapped in, read through its main head with the output bias "
                             "refit on the target's training text (the same for every system), one Step-2 run per "
                             "system and language")
    assert "| unigram | - | - | 4.0 | 4.0 | 4.0 |" in tables  # the baseline row
    assert "needed: the difference the test calls significant for the n masked held-out tokens (one run: seeds 1, " \
           "no between-seed variance)" in margins
    assert "Its control: the primary model with the untrained target embeddings" in table3
    for wrong in ("finetuning seeds", "seeds ?", "finetuned model", "chance level unknown", "tasks.py"):
        assert wrong not in tables
    assert "| mlm | MINIJOINT | 1.92x | 2/2 langs, 1 Step-2 run |" in tables
    assert "| avg | MINIJOINT | 1.92x | 1/1 tasks, 1 Step-2 run |" in tables
    assert "and the Step-2 runs behind each score" in tables
    assert plots.curves_figure(rep).axes[0].get_ylabel() == "held-out target-language MLM accuracy (%)"
    assert "1.9x\n2/2 langs\n1 Step-2 run" in [t.get_text() for t in plots.speedup_figure(rep).axes[0].texts]


# --- figures: the control, the chance level, what stands behind each bar --------------------------------------

def test_curves_start_at_the_control_and_show_the_chance_level():
    from mm_ds.report import plots

    res, _ = records.clean_records(run_rows())
    rep = R.build_report(res, controls=records.control_scores(run_rows()), world=True)
    for fig in (plots.curves_figure(rep), plots.language_curves_figure(rep, "xnli")):
        ax = fig.axes[0]
        labels = [line.get_label() for line in ax.lines]
        assert "chance (50.0)" in labels and "ctrl (untrained embeddings), at 0 days" in labels
        starts = [line for line in ax.lines if line.get_linestyle() == ":" and len(line.get_xdata()) == 2]
        assert len(starts) == 2 and all(list(line.get_xdata())[0] == 0 and list(line.get_ydata())[0] == 50.5
                                        for line in starts)  # each system's curve from its control at 0 days


def test_speedup_bars_say_how_many_languages_and_seeds_and_mark_the_partial_ones():
    from mm_ds.report import plots

    res = two_lang_results() + curve([0, 95, 100], system="BL_BASE", lang="tr") + \
        curve([10, 20], steps=[5000, 10000], system="MINIJOINT", lang="tr")  # MINIJOINT never reaches tr's target
    res += curve([0, 95, 100], system="BL_BASE", task="pawsx", lang="de")
    res += curve([95], steps=[5000], system="MINIJOINT", task="pawsx", lang="de")
    rep = R.build_report(res, seeds={"xnli": [3], "pawsx": [3]})
    ax = plots.speedup_figure(rep).axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "5.5x*\n2/3 langs\n3 seeds" in texts and "2.0x\n1/1 langs\n3 seeds" in texts
    assert "3.8x*\n2/2 tasks\n3 seeds" in texts  # an average over a partial task is partial too
    hatched = {(round(p.get_height(), 1), p.get_hatch()) for p in ax.patches}
    assert hatched == {(5.5, "//"), (2.0, ""), (3.8, "//")}
    assert "* fewer languages (or tasks) than the task has" in [t.get_text() for t in ax.get_legend().get_texts()]
